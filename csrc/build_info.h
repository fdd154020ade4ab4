// What the extension was built with. One implementation per build flavour: build_info_cpu.cpp
// in a CPU-only build, cuda/build_info_cuda.cpp in a CUDA build (setup.py picks the file).
#pragma once

#include <map>
#include <string>

namespace cudnn_rnn {
std::map<std::string, std::string> accelerator_build_info();
}
