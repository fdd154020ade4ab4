// Included by vec_loops_base.cpp and vec_loops_avx2.cpp with CUDNN_RNN_VEC_NS set; see vec_loops.h.
// No include guard: each includer compiles these definitions for its own instruction set.
#include <cstdint>
#include <cstring>

namespace cudnn_rnn {
namespace cpu {
namespace CUDNN_RNN_VEC_NS {
namespace {

// exp(x) for float: x = n ln2 + r (n rounded to nearest, |r| <= ln2 / 2) with a two-part ln2
// (Cody-Waite), exp(r) by the Cephes degree-6 polynomial, 2^n by building the exponent bits.
// Inputs are clamped to [-87.3, 88], where the result is a normal float (NaN passes through
// the clamp and out of the polynomial as NaN).
inline float exp_f32(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : x);
  // Round to nearest by adding and removing 1.5 * 2^23 (no floor call, so the loop vectorises).
  const float fx = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - fx * 0.693359375f) - fx * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(fx) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return e * scale;
}

// tanh for float: the Cephes odd polynomial for |x| < 0.625, 1 - 2 / (exp(2|x|) + 1) beyond.
inline float tanh_f32(float x) {
  const float ax = x < 0.0f ? -x : x;
  const float s = x * x;
  float p = -5.70498872745e-3f;
  p = p * s + 2.06390887954e-2f;
  p = p * s - 5.37397155531e-2f;
  p = p * s + 1.33314422036e-1f;
  p = p * s - 3.33332819422e-1f;
  const float small = p * s * x + x;
  const float big = 1.0f - 2.0f / (exp_f32(2.0f * ax) + 1.0f);
  return ax < 0.625f ? small : (x < 0.0f ? -big : big);
}

inline float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

}  // namespace

void tanh_loop(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = tanh_f32(x[i]);
}

void sigmoid_loop(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = sigmoid_f32(x[i]);
}

void clip_ramp_loop(const float* x, float* y, int64_t n, float slope) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] * slope + 0.5f;
    y[i] = v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v);
  }
}

}  // namespace CUDNN_RNN_VEC_NS
}  // namespace cpu
}  // namespace cudnn_rnn
