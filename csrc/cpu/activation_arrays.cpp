#include "cpu/activation_arrays.h"

#include <ATen/Version.h>

#include <cmath>
#include <cstring>
#include <string>

#include "cpu/vec_loops.h"

namespace cudnn_rnn {
namespace cpu {

#define CUDNN_RNN_LOOPS(ns, name)                                                                          \
  FloatLoops {                                                                                             \
    name, ns::tanh_loop, ns::sigmoid_loop, ns::clip_ramp_loop, ns::to_bf16_loop, ns::add_rows_to_f64_loop, \
        ns::lstm_forward_row, ns::lstm_backward_row, ns::gru_forward_row, ns::gru_backward_row             \
  }

bool cpu_has_avx512() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return ok;
#else
  return false;
#endif
}

const FloatLoops& float_loops() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const FloatLoops loops = [] {
    const std::string level = at::get_cpu_capability();  // "DEFAULT", "AVX2", "AVX512", ...
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && level != "DEFAULT";
    const bool avx512 = avx2 && level.rfind("AVX512", 0) == 0 && cpu_has_avx512();
    return avx512 ? CUDNN_RNN_LOOPS(vec_avx512, "avx512")
                  : avx2 ? CUDNN_RNN_LOOPS(vec_avx2, "avx2") : CUDNN_RNN_LOOPS(vec_base, "baseline");
  }();
#else
  static const FloatLoops loops = CUDNN_RNN_LOOPS(vec_base, "baseline");
#endif
  return loops;
}
#undef CUDNN_RNN_LOOPS

namespace {

template <typename T>
void scalar_activate(Activation a, const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = activate(a, x[i]);
}

template <typename T>
void scalar_activate_grad(Activation a, const T* x, const T* y, T* g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = activate_grad(a, x[i], y[i]);
}

}  // namespace

void activate_array(Activation a, const float* x, float* y, int64_t n) {
  switch (a) {
    case Activation::Tanh: return float_loops().tanh(x, y, n);
    case Activation::Sigmoid: return float_loops().sigmoid(x, y, n);
    case Activation::HardSigmoidKeras2: return float_loops().clip_ramp(x, y, n, 0.2f);
    case Activation::Linear:
      if (x != y) std::memcpy(y, x, sizeof(float) * n);
      return;
    case Activation::Relu:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];  // NaN stays NaN
      return;
    default: return scalar_activate(a, x, y, n);
  }
}

void activate_array(Activation a, const double* x, double* y, int64_t n) { scalar_activate(a, x, y, n); }

void activate_grad_array(Activation a, const float* x, const float* y, float* g, int64_t n) {
  switch (a) {
    case Activation::Tanh:
      for (int64_t i = 0; i < n; ++i) g[i] = 1.0f - y[i] * y[i];
      return;
    case Activation::Sigmoid:
      for (int64_t i = 0; i < n; ++i) g[i] = y[i] * (1.0f - y[i]);
      return;
    default: return scalar_activate_grad(a, x, y, g, n);
  }
}

void activate_grad_array(Activation a, const double* x, const double* y, double* g, int64_t n) {
  scalar_activate_grad(a, x, y, g, n);
}

}  // namespace cpu
}  // namespace cudnn_rnn
