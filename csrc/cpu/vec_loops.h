// float32 activation loops that GCC vectorises (no libm calls, no branches): tanh, sigmoid and
// clipped ramps. vec_loops_impl.h is compiled twice, into namespace vec_base (baseline x86-64)
// and vec_avx2 (AVX2 + FMA); activation_arrays.cpp picks one at load time.
#pragma once

#include <cstdint>

namespace cudnn_rnn {
namespace cpu {
#define CUDNN_RNN_DECLARE_LOOPS(ns)                                                  \
  namespace ns {                                                                     \
  void tanh_loop(const float* x, float* y, int64_t n);                               \
  void sigmoid_loop(const float* x, float* y, int64_t n);                            \
  void clip_ramp_loop(const float* x, float* y, int64_t n, float slope); /* clip(x * slope + 0.5, 0, 1) */ \
  }
CUDNN_RNN_DECLARE_LOOPS(vec_base)
CUDNN_RNN_DECLARE_LOOPS(vec_avx2)
#undef CUDNN_RNN_DECLARE_LOOPS
}  // namespace cpu
}  // namespace cudnn_rnn
