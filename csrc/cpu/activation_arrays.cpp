#include "cpu/activation_arrays.h"

#include <cmath>
#include <cstring>

#include "cpu/vec_loops.h"

namespace cudnn_rnn {
namespace cpu {
namespace {

// The float loops, compiled once per instruction set (vec_loops_*.cpp) and picked at load time.
struct FloatLoops {
  void (*tanh)(const float*, float*, int64_t);
  void (*sigmoid)(const float*, float*, int64_t);
  void (*clip_ramp)(const float*, float*, int64_t, float);
};

const FloatLoops& float_loops() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const FloatLoops loops = (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
                                      ? FloatLoops{vec_avx2::tanh_loop, vec_avx2::sigmoid_loop, vec_avx2::clip_ramp_loop}
                                      : FloatLoops{vec_base::tanh_loop, vec_base::sigmoid_loop, vec_base::clip_ramp_loop};
#else
  static const FloatLoops loops{vec_base::tanh_loop, vec_base::sigmoid_loop, vec_base::clip_ramp_loop};
#endif
  return loops;
}

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
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
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
