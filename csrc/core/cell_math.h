// The Keras activations and their derivatives: the one definition of each, C10_HOST_DEVICE so
// that the CPU backend (cpu/activation_arrays.cpp falls back to these and is tested against them)
// and the generic CUDA kernels share it.
#pragma once

#include <c10/macros/Macros.h>

#include <cmath>
#include <cstdint>

namespace cudnn_rnn {

enum class CellKind : int32_t { LSTM = 0, GRU = 1, SimpleRNN = 2 };

// Keras activation names map onto this enum in rnn_config.cpp (activation_names(), which is
// indexed by it and asserts that it has NumActivations names).
enum class Activation : int32_t {
  Tanh = 0,
  Sigmoid,
  Relu,
  Linear,
  HardSigmoid,        // Keras 3: relu6(x + 3) / 6, i.e. clip(x / 6 + 0.5, 0, 1)
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
  Celu,           // Keras's default alpha = 1: elu
  HardShrink,     // threshold 0.5
  HardTanh,       // clip(x, -1, 1)
  LeakyRelu,      // Keras 3's default negative_slope = 0.2
  SoftShrink,     // threshold 0.5
  SparsePlus,     // 0, (x + 1)^2 / 4, x on (-inf, -1], (-1, 1), [1, inf)
  SparseSigmoid,  // clip((x + 1) / 2, 0, 1)
  Squareplus,     // (x + sqrt(x^2 + 4)) / 2, Keras's default b = 4
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

// f(x) for the activation `a`. A NaN comes out NaN from every one, as from Keras's (the
// piecewise ones test the finite side first, so that a NaN falls through to x).
template <typename T>
C10_HOST_DEVICE inline T activate(Activation a, T x) {
  constexpr T kSeluAlpha = T(1.6732632423543772848170429916717);
  constexpr T kSeluScale = T(1.0507009873554804934193349852946);
  constexpr T kInvSqrt2 = T(0.70710678118654752440);
  switch (a) {
    case Activation::Tanh: return std::tanh(x);
    case Activation::Sigmoid: return sigmoid_of(x);
    case Activation::Relu: return x < T(0) ? T(0) : x;
    case Activation::Linear: return x;
    case Activation::HardSigmoid: {  // as torch.nn.functional.hardsigmoid, which Keras 3 calls
      T y = x + T(3);
      return (y < T(0) ? T(0) : (y > T(6) ? T(6) : y)) / T(6);
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
      T y = x + T(3);
      return x * (y < T(0) ? T(0) : (y > T(6) ? T(6) : y)) / T(6);
    }
    case Activation::LogSigmoid: return -softplus_of(-x);
    case Activation::TanhShrink: return x - std::tanh(x);
    case Activation::Celu: return x > T(0) ? x : std::expm1(x);
    case Activation::HardShrink: return (x >= T(-0.5) && x <= T(0.5)) ? T(0) : x;
    case Activation::HardTanh: return x < T(-1) ? T(-1) : (x > T(1) ? T(1) : x);
    case Activation::LeakyRelu: return x > T(0) ? x : T(0.2) * x;
    case Activation::SoftShrink: return (x >= T(-0.5) && x <= T(0.5)) ? T(0) : (x > T(0) ? x - T(0.5) : x + T(0.5));
    case Activation::SparsePlus: return x <= T(-1) ? T(0) : (x < T(1) ? T(0.25) * (x + T(1)) * (x + T(1)) : x);
    case Activation::SparseSigmoid: return x <= T(-1) ? T(0) : (x >= T(1) ? T(1) : T(0.5) * (x + T(1)));
    case Activation::Squareplus: return (x + std::sqrt(x * x + T(4))) / T(2);
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
    // The piecewise ones as torch's kernels (Keras's torch backend) take them at their kinks.
    case Activation::Celu: return x > T(0) ? T(1) : std::exp(x);
    case Activation::HardShrink: return (x > T(0.5) || x < T(-0.5)) ? T(1) : T(0);
    case Activation::HardTanh: return (x > T(-1) && x < T(1)) ? T(1) : T(0);
    case Activation::LeakyRelu: return x > T(0) ? T(1) : T(0.2);
    case Activation::SoftShrink: return (x > T(0.5) || x < T(-0.5)) ? T(1) : T(0);
    case Activation::SparsePlus: return x <= T(-1) ? T(0) : (x < T(1) ? T(0.5) * (x + T(1)) : T(1));
    case Activation::SparseSigmoid: return (x > T(-1) && x < T(1)) ? T(0.5) : T(0);
    case Activation::Squareplus: return (T(1) + x / std::sqrt(x * x + T(4))) / T(2);
    default: return T(1);
  }
}

}  // namespace cudnn_rnn
