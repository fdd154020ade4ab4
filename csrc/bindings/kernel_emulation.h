// CPU emulation of the generic CUDA backend (kernel_emulation.cpp), for tests: a backend with
// the same interface as GenericCudaBackend (cuda/rnn_generic.h) whose pointwise steps run the
// CUDA kernels' element functions on the CPU, one "thread" at a time.
#pragma once

#include <cstdint>

#include "core/rnn_config.h"

namespace cudnn_rnn {

struct EmulatedCudaBackend {
  static ForwardResult forward(const RnnConfig& cfg, const ForwardCall& call);
  static BackwardResult backward(const RnnConfig& cfg, const BackwardCall& call);
};

// The element ("thread") order of the next calls on this thread: 0 ascending, 1 descending,
// 2 shuffled (fixed seed).
void set_emulation_order(int64_t order);

}  // namespace cudnn_rnn
