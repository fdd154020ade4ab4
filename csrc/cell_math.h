// Pointwise maths of the Keras 3 recurrent cells, forward and backward.
//
// Everything here is C10_HOST_DEVICE so that the CPU loop (cpu/rnn_cpu.cpp) and the generic CUDA
// kernel share one definition of every activation and every cell update. Gate columns follow the
// Keras kernel layout: LSTM i, f, c, o; GRU z, r, h.
#pragma once

#include <c10/macros/Macros.h>

#include <cmath>
#include <cstdint>

namespace cudnn_rnn {

// Keras activation names map onto this enum in rnn_config.cpp (kActivationNames); the order here
// is that table's order.
enum class Activation : int32_t {
  Tanh = 0,
  Sigmoid,
  Relu,
  Linear,
  HardSigmoid,        // Keras 3: relu6(x + 3) / 6 == clip(x / 6 + 0.5, 0, 1)
  HardSigmoidKeras2,  // Keras 2 / tf.keras: clip(0.2 x + 0.5, 0, 1)
  Elu,
  Selu,
  Softsign,
  Softplus,
  Exponential,
  Relu6,
  Silu,
  Gelu,
  Mish,
  HardSilu,
  LogSigmoid,
  TanhShrink,
  NumActivations
};

template <typename T>
C10_HOST_DEVICE inline T sigmoid_of(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <typename T>
C10_HOST_DEVICE inline T softplus_of(T x) {
  // log(1 + exp(x)) without overflow for large x.
  return x > T(20) ? x : std::log1p(std::exp(x));
}

// f(x) for the activation `a`.
template <typename T>
C10_HOST_DEVICE inline T activate(Activation a, T x) {
  constexpr T kSeluAlpha = T(1.6732632423543772848170429916717);
  constexpr T kSeluScale = T(1.0507009873554804934193349852946);
  constexpr T kInvSqrt2 = T(0.70710678118654752440);
  switch (a) {
    case Activation::Tanh: return std::tanh(x);
    case Activation::Sigmoid: return sigmoid_of(x);
    case Activation::Relu: return x > T(0) ? x : T(0);
    case Activation::Linear: return x;
    case Activation::HardSigmoid: {
      T y = x / T(6) + T(0.5);
      return y < T(0) ? T(0) : (y > T(1) ? T(1) : y);
    }
    case Activation::HardSigmoidKeras2: {
      T y = T(0.2) * x + T(0.5);
      return y < T(0) ? T(0) : (y > T(1) ? T(1) : y);
    }
    case Activation::Elu: return x > T(0) ? x : std::expm1(x);
    case Activation::Selu: return x > T(0) ? kSeluScale * x : kSeluScale * kSeluAlpha * std::expm1(x);
    case Activation::Softsign: return x / (T(1) + std::fabs(x));
    case Activation::Softplus: return softplus_of(x);
    case Activation::Exponential: return std::exp(x);
    case Activation::Relu6: return x < T(0) ? T(0) : (x > T(6) ? T(6) : x);
    case Activation::Silu: return x * sigmoid_of(x);
    case Activation::Gelu: return T(0.5) * x * (T(1) + std::erf(x * kInvSqrt2));
    case Activation::Mish: return x * std::tanh(softplus_of(x));
    case Activation::HardSilu: {
      T y = (x + T(3)) / T(6);
      return x * (y < T(0) ? T(0) : (y > T(1) ? T(1) : y));
    }
    case Activation::LogSigmoid: return -softplus_of(-x);
    case Activation::TanhShrink: return x - std::tanh(x);
    default: return x;
  }
}

// df/dx at x, given y = f(x) (used where it is cheaper than recomputing).
template <typename T>
C10_HOST_DEVICE inline T activate_grad(Activation a, T x, T y) {
  constexpr T kSeluAlpha = T(1.6732632423543772848170429916717);
  constexpr T kSeluScale = T(1.0507009873554804934193349852946);
  constexpr T kInvSqrt2 = T(0.70710678118654752440);
  constexpr T kInvSqrt2Pi = T(0.39894228040143267794);
  switch (a) {
    case Activation::Tanh: return T(1) - y * y;
    case Activation::Sigmoid: return y * (T(1) - y);
    case Activation::Relu: return x > T(0) ? T(1) : T(0);
    case Activation::Linear: return T(1);
    // Gradients of the clipped ramps follow torch.nn.functional.hardsigmoid: zero at the kinks.
    case Activation::HardSigmoid: return (x > T(-3) && x < T(3)) ? T(1) / T(6) : T(0);
    case Activation::HardSigmoidKeras2: return (x > T(-2.5) && x < T(2.5)) ? T(0.2) : T(0);
    case Activation::Elu: return x > T(0) ? T(1) : std::exp(x);
    case Activation::Selu: return x > T(0) ? kSeluScale : kSeluScale * kSeluAlpha * std::exp(x);
    case Activation::Softsign: {
      T d = T(1) + std::fabs(x);
      return T(1) / (d * d);
    }
    case Activation::Softplus: return sigmoid_of(x);
    case Activation::Exponential: return y;
    case Activation::Relu6: return (x > T(0) && x < T(6)) ? T(1) : T(0);
    case Activation::Silu: {
      T s = sigmoid_of(x);
      return s * (T(1) + x * (T(1) - s));
    }
    case Activation::Gelu:
      return T(0.5) * (T(1) + std::erf(x * kInvSqrt2)) + x * kInvSqrt2Pi * std::exp(T(-0.5) * x * x);
    case Activation::Mish: {
      T sp = softplus_of(x);
      T tsp = std::tanh(sp);
      return tsp + x * (T(1) - tsp * tsp) * sigmoid_of(x);
    }
    case Activation::HardSilu:
      if (x <= T(-3)) return T(0);
      if (x >= T(3)) return T(1);
      return (T(2) * x + T(3)) / T(6);
    case Activation::LogSigmoid: return sigmoid_of(-x);
    case Activation::TanhShrink: {
      T t = std::tanh(x);
      return t * t;
    }
    default: return T(1);
  }
}

// ---------------------------------------------------------------------------------------------
// Cell updates for one (batch row, unit j). `xw` points at the row's input projection (bias
// included), `rec` at the row's recurrent projection; gate g of unit j sits at [g * units + j].
// `saved` is the row's slot in the reserve (what backward needs), `mask` is 1 for a real step.
// ---------------------------------------------------------------------------------------------

// LSTM. saved = the 4 gate pre-activations (i, f, c, o).
template <typename T>
C10_HOST_DEVICE inline void lstm_cell_forward(Activation act, Activation ract, int64_t units, int64_t j,
                                              const T* xw, const T* rec, T h_prev, T c_prev, T* saved,
                                              T& h_new, T& c_new) {
  T zi = xw[j] + rec[j];
  T zf = xw[units + j] + rec[units + j];
  T zc = xw[2 * units + j] + rec[2 * units + j];
  T zo = xw[3 * units + j] + rec[3 * units + j];
  saved[j] = zi;
  saved[units + j] = zf;
  saved[2 * units + j] = zc;
  saved[3 * units + j] = zo;
  T c = activate(ract, zf) * c_prev + activate(ract, zi) * activate(act, zc);
  c_new = c;
  h_new = activate(ract, zo) * activate(act, c);
  (void)h_prev;
}

// Backward of one LSTM step. dh, dc: gradients w.r.t. the new h and c. Writes the 4 gate
// pre-activation gradients to dgates and returns the gradient w.r.t. c_prev in dc_prev.
template <typename T>
C10_HOST_DEVICE inline void lstm_cell_backward(Activation act, Activation ract, int64_t units, int64_t j,
                                               const T* saved, T c_prev, T c_new, T dh, T dc, T* dgates,
                                               T& dc_prev) {
  T zi = saved[j], zf = saved[units + j], zc = saved[2 * units + j], zo = saved[3 * units + j];
  T i = activate(ract, zi), f = activate(ract, zf), g = activate(act, zc), o = activate(ract, zo);
  T ac = activate(act, c_new);
  T dcc = dc + dh * o * activate_grad(act, c_new, ac);
  dgates[j] = dcc * g * activate_grad(ract, zi, i);
  dgates[units + j] = dcc * c_prev * activate_grad(ract, zf, f);
  dgates[2 * units + j] = dcc * i * activate_grad(act, zc, g);
  dgates[3 * units + j] = dh * ac * activate_grad(ract, zo, o);
  dc_prev = dcc * f;
}

// GRU reset_after=True: rec holds h·R + b_rec for z, r, h. saved = (z, r, n pre-activations,
// recurrent candidate hh).
template <typename T>
C10_HOST_DEVICE inline T gru_after_cell_forward(Activation act, Activation ract, int64_t units, int64_t j,
                                                const T* xw, const T* rec, T h_prev, T* saved) {
  T zpre = xw[j] + rec[j];
  T rpre = xw[units + j] + rec[units + j];
  T hh = rec[2 * units + j];
  T z = activate(ract, zpre), r = activate(ract, rpre);
  T npre = xw[2 * units + j] + r * hh;
  T n = activate(act, npre);
  saved[j] = zpre;
  saved[units + j] = rpre;
  saved[2 * units + j] = npre;
  saved[3 * units + j] = hh;
  return z * h_prev + (T(1) - z) * n;
}

// dgates_in: gradients of the input-side pre-activations (z, r, h);
// dgates_rec: of the recurrent-side projections (z, r, hh). Returns the direct dh_prev term.
template <typename T>
C10_HOST_DEVICE inline T gru_after_cell_backward(Activation act, Activation ract, int64_t units, int64_t j,
                                                 const T* saved, T h_prev, T dh, T* dgates_in,
                                                 T* dgates_rec) {
  T zpre = saved[j], rpre = saved[units + j], npre = saved[2 * units + j], hh = saved[3 * units + j];
  T z = activate(ract, zpre), r = activate(ract, rpre), n = activate(act, npre);
  T dnpre = dh * (T(1) - z) * activate_grad(act, npre, n);
  T dzpre = dh * (h_prev - n) * activate_grad(ract, zpre, z);
  T drpre = dnpre * hh * activate_grad(ract, rpre, r);
  dgates_in[j] = dzpre;
  dgates_in[units + j] = drpre;
  dgates_in[2 * units + j] = dnpre;
  dgates_rec[j] = dzpre;
  dgates_rec[units + j] = drpre;
  dgates_rec[2 * units + j] = dnpre * r;
  return dh * z;
}

// GRU reset_after=False, phase 1 (before the candidate's recurrent matmul): rec holds hd·R for z
// and r only; writes r * hd_h (the candidate matmul's input) and saves z, r pre-activations.
template <typename T>
C10_HOST_DEVICE inline T gru_before_cell_gates(Activation ract, int64_t units, int64_t j, const T* xw,
                                               const T* rec, T hd_h, T* saved) {
  T zpre = xw[j] + rec[j];
  T rpre = xw[units + j] + rec[units + j];
  saved[j] = zpre;
  saved[units + j] = rpre;
  T rh = activate(ract, rpre) * hd_h;
  saved[3 * units + j] = rh;
  return rh;
}

// Phase 2: rec_h = (r * hd_h)·R_h. saved = (z, r, n pre-activations, r * hd_h).
template <typename T>
C10_HOST_DEVICE inline T gru_before_cell_update(Activation act, Activation ract, int64_t units, int64_t j,
                                                const T* xw, T rec_h, T h_prev, T* saved) {
  T npre = xw[2 * units + j] + rec_h;
  saved[2 * units + j] = npre;
  T z = activate(ract, saved[j]);
  return z * h_prev + (T(1) - z) * activate(act, npre);
}

// Backward phase A: from dh, the z and candidate gradients. Returns the direct dh_prev term.
template <typename T>
C10_HOST_DEVICE inline T gru_before_cell_backward_a(Activation act, Activation ract, int64_t units, int64_t j,
                                                    const T* saved, T h_prev, T dh, T* dgates) {
  T zpre = saved[j], npre = saved[2 * units + j];
  T z = activate(ract, zpre), n = activate(act, npre);
  dgates[j] = dh * (h_prev - n) * activate_grad(ract, zpre, z);
  dgates[2 * units + j] = dh * (T(1) - z) * activate_grad(act, npre, n);
  return dh * z;
}

// Backward phase B: d_rh = d(r * hd_h) from the candidate matmul. Writes dr pre-activation and
// returns the gradient w.r.t. hd_h.
template <typename T>
C10_HOST_DEVICE inline T gru_before_cell_backward_b(Activation ract, int64_t units, int64_t j, const T* saved,
                                                    T hd_h, T d_rh, T* dgates) {
  T rpre = saved[units + j];
  T r = activate(ract, rpre);
  dgates[units + j] = d_rh * hd_h * activate_grad(ract, rpre, r);
  return d_rh * r;
}

// SimpleRNN. saved = the pre-activation.
template <typename T>
C10_HOST_DEVICE inline T simple_cell_forward(Activation act, int64_t j, const T* xw, const T* rec, T* saved) {
  T pre = xw[j] + rec[j];
  saved[j] = pre;
  return activate(act, pre);
}

template <typename T>
C10_HOST_DEVICE inline T simple_cell_backward(Activation act, int64_t j, const T* saved, T dh) {
  T pre = saved[j];
  return dh * activate_grad(act, pre, activate(act, pre));
}

}  // namespace cudnn_rnn
