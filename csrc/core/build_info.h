// What the extension was built with, and how often the CUDA backend left cuDNN. One
// implementation per build flavour: core/build_info_cpu_only.cpp in a CPU-only build,
// cuda/register.cpp in a CUDA build (setup.py picks the files).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace cudnn_rnn {
std::map<std::string, std::string> accelerator_build_info();
// Calls on CUDA tensors that did not run on cuDNN (a silent fallback is a bug: this makes it visible).
int64_t cudnn_fallback_count();
// Drops what the accelerator backend keeps between calls (the cuDNN path's kept weight spaces).
void empty_accelerator_caches();
}
