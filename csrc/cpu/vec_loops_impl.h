// Included by vec_loops_base.cpp and vec_loops_avx2.cpp with CUDNN_RNN_VEC_NS set; see vec_loops.h.
// No include guard: each includer compiles these definitions for its own instruction set.
#include <cstdint>
#include <cstring>
#include <type_traits>

// The scalar functions the loops below call are always inlined: a loop calling one out of line
// is not vectorised, and GCC's inlining limits are per function (past them a 64-unit LSTM row
// runs scalar tanh calls, 3x slower).
#ifndef CUDNN_RNN_INLINE
#if defined(__GNUC__)
#define CUDNN_RNN_INLINE inline __attribute__((always_inline))
#else
#define CUDNN_RNN_INLINE inline
#endif
#endif

namespace cudnn_rnn {
namespace cpu {
namespace CUDNN_RNN_VEC_NS {
namespace {

// exp(x) for float: x = n ln2 + r (n rounded to nearest, |r| <= ln2 / 2) with a two-part ln2
// (Cody-Waite), exp(r) by the Cephes degree-6 polynomial, 2^n by building the exponent bits.
// Inputs are clamped to [-87.3, 88], where the result is a normal float (NaN passes through
// the clamp and out of the polynomial as NaN).
CUDNN_RNN_INLINE float exp_f32(float x) {
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
CUDNN_RNN_INLINE float tanh_f32(float x) {
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

CUDNN_RNN_INLINE float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

// A gate's activation (tanh when Tanh, else sigmoid) and its derivative from its output.
template <bool Tanh>
CUDNN_RNN_INLINE float gate_f32(float x) {
  if constexpr (Tanh) {
    return tanh_f32(x);
  } else {
    return sigmoid_f32(x);
  }
}
template <bool Tanh>
CUDNN_RNN_INLINE float gate_grad_f32(float y) {
  if constexpr (Tanh) {
    return 1.0f - y * y;
  } else {
    return y * (1.0f - y);
  }
}

// The fused cell rows (vec_loops.h), every stream restrict-qualified so that GCC vectorises
// without alias checks. A: act is tanh, R: ract is tanh (else sigmoid). Save: write the activated
// gates to saved (else saved is null: inference keeps nothing).

// out[j] = gate(a[j] + b[j]) for j < n: one gate of a row, in a loop of its own.
template <bool Tanh>
void gate_loop(int64_t n, const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out) {
  for (int64_t j = 0; j < n; ++j) out[j] = gate_f32<Tanh>(a[j] + b[j]);
}

// The chunks a row's gates are computed in, kChunk units at a time: at(n, j0) returns the size of
// the chunk at unit j0 and points g[q] at gate q's values of it, in saved (gate stride ss) where
// the row saves its gates, else in a local buffer.
// The local buffer is left uninitialised (each gate's loop writes a chunk before the update
// reads it): zeroing its 4 KiB on every row takes a twentieth of an LSTM forward at H=128,
// B=128.
template <int Q, bool Save>
struct GateChunks {
  static constexpr int64_t kChunk = 256;
  GateChunks(float* s, int64_t stride) : saved(s), ss(stride) {}
  float* saved;
  int64_t ss;
  float* g[Q];
  alignas(64) float local[Save ? 1 : Q][Save ? 1 : kChunk];
  int64_t at(int64_t n, int64_t j0) {
    for (int q = 0; q < Q; ++q) g[q] = Save ? saved + q * ss + j0 : &local[Save ? 0 : q][0];
    return n - j0 < kChunk ? n - j0 : kChunk;
  }
};

// The LSTM row in chunks of units, each gate activated by a loop of its own (into saved, or a
// local chunk where nothing is saved) and the state updated by another: one loop computing all
// five activations holds more constants and temporaries than AVX2's 16 registers and spills
// them to the stack on every iteration (one-thread LSTM forward at H=64, B=128 on an AMD Zen 4:
// 3-12 % faster at the AVX2 level, 2-6 % with AVX-512).
template <bool A, bool R, bool Save>
void lstm_forward(int64_t n, const float* __restrict__ xw, int64_t xs, const float* __restrict__ rec, int64_t rs,
                  const float* __restrict__ c_prev, float* __restrict__ saved, int64_t ss, float* __restrict__ h_new,
                  float* __restrict__ c_new) {
  GateChunks<4, Save> chunks(saved, ss);
  for (int64_t j0 = 0; j0 < n; j0 += chunks.kChunk) {
    const int64_t m = chunks.at(n, j0);
    gate_loop<R>(m, xw + j0, rec + j0, chunks.g[0]);
    gate_loop<R>(m, xw + xs + j0, rec + rs + j0, chunks.g[1]);
    gate_loop<A>(m, xw + 2 * xs + j0, rec + 2 * rs + j0, chunks.g[2]);
    gate_loop<R>(m, xw + 3 * xs + j0, rec + 3 * rs + j0, chunks.g[3]);
    const float* __restrict__ i = chunks.g[0];
    const float* __restrict__ f = chunks.g[1];
    const float* __restrict__ gg = chunks.g[2];
    const float* __restrict__ o = chunks.g[3];
    const float* __restrict__ cp = c_prev + j0;
    float* __restrict__ cn = c_new + j0;
    float* __restrict__ hn = h_new + j0;
    for (int64_t j = 0; j < m; ++j) {
      const float c = f[j] * cp[j] + i[j] * gg[j];
      cn[j] = c;
      hn[j] = o[j] * gate_f32<A>(c);
    }
  }
}

template <bool A, bool R>
void lstm_backward(int64_t n, const float* __restrict__ saved, int64_t ss, const float* __restrict__ c_prev,
                   const float* __restrict__ c_new, const float* __restrict__ dh, float* __restrict__ dc,
                   float* __restrict__ dx, int64_t dxs) {
  for (int64_t j = 0; j < n; ++j) {
    const float i = saved[j], f = saved[ss + j], g = saved[2 * ss + j], o = saved[3 * ss + j];
    const float tc = gate_f32<A>(c_new[j]);
    const float dcc = dc[j] + dh[j] * o * gate_grad_f32<A>(tc);
    dx[j] = dcc * g * gate_grad_f32<R>(i);
    dx[dxs + j] = dcc * c_prev[j] * gate_grad_f32<R>(f);
    dx[2 * dxs + j] = dcc * i * gate_grad_f32<A>(g);
    dx[3 * dxs + j] = dh[j] * tc * gate_grad_f32<R>(o);
    dc[j] = dcc * f;
  }
}

// The GRU row (reset_after) the same way: z and r by loops of their own, then the candidate, then
// the state (one-thread GRU inference at H=64, B=128 on the Zen 4: 10 % faster at the AVX2 level;
// within 4 % either way with AVX-512).
template <bool A, bool R, bool Save>
void gru_forward(int64_t n, const float* __restrict__ xw, int64_t xs, const float* __restrict__ rec, int64_t rs,
                 const float* __restrict__ h_prev, float* __restrict__ saved, int64_t ss, float* __restrict__ h_new) {
  GateChunks<3, Save> chunks(saved, ss);
  for (int64_t j0 = 0; j0 < n; j0 += chunks.kChunk) {
    const int64_t m = chunks.at(n, j0);
    gate_loop<R>(m, xw + j0, rec + j0, chunks.g[0]);
    gate_loop<R>(m, xw + xs + j0, rec + rs + j0, chunks.g[1]);
    const float* __restrict__ r = chunks.g[1];
    const float* __restrict__ hh = rec + 2 * rs + j0;
    const float* __restrict__ xc = xw + 2 * xs + j0;
    float* __restrict__ c = chunks.g[2];
    for (int64_t j = 0; j < m; ++j) c[j] = gate_f32<A>(xc[j] + r[j] * hh[j]);
    if constexpr (Save) std::memcpy(saved + 3 * ss + j0, hh, m * sizeof(float));
    const float* __restrict__ z = chunks.g[0];
    const float* __restrict__ cc = chunks.g[2];
    const float* __restrict__ hp = h_prev + j0;
    float* __restrict__ hn = h_new + j0;
    for (int64_t j = 0; j < m; ++j) hn[j] = z[j] * hp[j] + (1.0f - z[j]) * cc[j];
  }
}

template <bool A, bool R>
void gru_backward(int64_t n, const float* __restrict__ saved, int64_t ss, const float* __restrict__ h_prev,
                  const float* __restrict__ dh, float* __restrict__ dx, int64_t dxs, float* __restrict__ drec,
                  int64_t drs, float* __restrict__ dh_prev) {
  for (int64_t j = 0; j < n; ++j) {
    const float z = saved[j], r = saved[ss + j], c = saved[2 * ss + j], hh = saved[3 * ss + j];
    const float dn = dh[j] * (1.0f - z) * gate_grad_f32<A>(c);
    const float dz = dh[j] * (h_prev[j] - c) * gate_grad_f32<R>(z);
    const float dr = dn * hh * gate_grad_f32<R>(r);
    dx[j] = drec[j] = dz;
    dx[dxs + j] = drec[drs + j] = dr;
    dx[2 * dxs + j] = dn;
    drec[2 * drs + j] = dn * r;
    dh_prev[j] = dh[j] * z;
  }
}

// Calls f(A, R) with A, R std::bool_constant for the runtime pair (act_tanh, ract_tanh): the
// caller instantiates its loop for the pair (decltype(A)::value).
template <typename F>
void pick(bool act_tanh, bool ract_tanh, const F& f) {
  if (act_tanh) {
    ract_tanh ? f(std::true_type{}, std::true_type{}) : f(std::true_type{}, std::false_type{});
  } else {
    ract_tanh ? f(std::false_type{}, std::true_type{}) : f(std::false_type{}, std::false_type{});
  }
}
#define CUDNN_RNN_AR decltype(A)::value, decltype(R)::value

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

void to_bf16_loop(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, sizeof(b));
    const uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;  // to nearest, ties to even
    y[i] = (b & 0x7FFFFFFFu) > 0x7F800000u ? uint16_t(0x7FC0) : static_cast<uint16_t>(rounded);  // NaN stays NaN
  }
}

// Column sums of rows x 64-column tiles in float32 (the partials stay in registers), added to
// the float64 accumulators every 64 rows: one load per value instead of a float64
// read-modify-write per value and row.
void add_rows_to_f64_loop(const float* __restrict__ x, int64_t ld, int64_t rows, int64_t n,
                          double* __restrict__ acc) {
  constexpr int64_t kCols = 64, kRows = 64;
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int64_t r1 = r0 + kRows < rows ? r0 + kRows : rows;
    int64_t j0 = 0;
    for (; j0 + kCols <= n; j0 += kCols) {
      float part[kCols] = {};
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * ld + j0;
        for (int64_t j = 0; j < kCols; ++j) part[j] += xr[j];
      }
      for (int64_t j = 0; j < kCols; ++j) acc[j0 + j] += static_cast<double>(part[j]);
    }
    for (int64_t j = j0; j < n; ++j) {
      float part = 0.0f;
      for (int64_t r = r0; r < r1; ++r) part += x[r * ld + j];
      acc[j] += static_cast<double>(part);
    }
  }
}

void lstm_forward_row(bool act_tanh, bool ract_tanh, int64_t n, const float* xw, int64_t xs, const float* rec,
                      int64_t rs, const float* c_prev, float* saved, int64_t ss, float* h_new, float* c_new) {
  pick(act_tanh, ract_tanh, [&](auto A, auto R) {
    if (saved) {
      lstm_forward<CUDNN_RNN_AR, true>(n, xw, xs, rec, rs, c_prev, saved, ss, h_new, c_new);
    } else {
      lstm_forward<CUDNN_RNN_AR, false>(n, xw, xs, rec, rs, c_prev, saved, ss, h_new, c_new);
    }
  });
}

void lstm_backward_row(bool act_tanh, bool ract_tanh, int64_t n, const float* saved, int64_t ss, const float* c_prev,
                       const float* c_new, const float* dh, float* dc, float* dx, int64_t dxs) {
  pick(act_tanh, ract_tanh,
       [&](auto A, auto R) { lstm_backward<CUDNN_RNN_AR>(n, saved, ss, c_prev, c_new, dh, dc, dx, dxs); });
}

void gru_forward_row(bool act_tanh, bool ract_tanh, int64_t n, const float* xw, int64_t xs, const float* rec,
                     int64_t rs, const float* h_prev, float* saved, int64_t ss, float* h_new) {
  pick(act_tanh, ract_tanh, [&](auto A, auto R) {
    if (saved) {
      gru_forward<CUDNN_RNN_AR, true>(n, xw, xs, rec, rs, h_prev, saved, ss, h_new);
    } else {
      gru_forward<CUDNN_RNN_AR, false>(n, xw, xs, rec, rs, h_prev, saved, ss, h_new);
    }
  });
}

void gru_backward_row(bool act_tanh, bool ract_tanh, int64_t n, const float* saved, int64_t ss, const float* h_prev,
                      const float* dh, float* dx, int64_t dxs, float* drec, int64_t drs, float* dh_prev) {
  pick(act_tanh, ract_tanh,
       [&](auto A, auto R) { gru_backward<CUDNN_RNN_AR>(n, saved, ss, h_prev, dh, dx, dxs, drec, drs, dh_prev); });
}

#undef CUDNN_RNN_AR

}  // namespace CUDNN_RNN_VEC_NS
}  // namespace cpu
}  // namespace cudnn_rnn
