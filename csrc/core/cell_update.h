// The cell updates, one state element at a time, C10_HOST_DEVICE: the one scalar definition of
// Keras's LSTM and GRU equations (with cell_math.h's activations) that the generic CUDA kernels
// (cuda/generic_kernels_body.h) and the ConvLSTM step (core/conv_lstm_cell.h, CPU and CUDA)
// compute. The CPU's rows compute the same equations a row at a time for vectorisation
// (cpu/cell_rows.h with array activations, cpu/vec_loops_impl.h fused in SIMD);
// tests/test_generic_kernels_emulated.py holds the element form (the CUDA kernels run on the
// CPU) to them, and both to torch.nn and Keras.
//
// LSTM (keras/src/layers/rnn/lstm.py), gates i, f, c, o from their pre-activations z:
//   c' = ra(z_f) c + ra(z_i) a(z_c),  h' = ra(z_o) a(c')
// GRU (keras/src/layers/rnn/gru.py), gates z, r from their pre-activations, the candidate's
// pre-activation n (reset_after: x_n + r * hh, hh the recurrent product of the candidate's
// columns, bias included; else x_n + (r * h) R_n):
//   h' = ra(z) h + (1 - ra(z)) a(n)
#pragma once

#include <c10/macros/Macros.h>

#include "core/cell_math.h"

namespace cudnn_rnn {

template <typename T>
struct LstmState {
  T c, h;
};

template <typename T>
C10_HOST_DEVICE inline LstmState<T> lstm_update(Activation act, Activation ract, T zi, T zf, T zc, T zo, T c_prev) {
  const T c = activate(ract, zf) * c_prev + activate(ract, zi) * activate(act, zc);
  return {c, activate(ract, zo) * activate(act, c)};
}

// Its gradients: dh, dc those of h' and c' (dh the total, the output's included), back to the
// four pre-activations and to c.
template <typename T>
struct LstmGrads {
  T dzi, dzf, dzc, dzo, dc_prev;
};

template <typename T>
C10_HOST_DEVICE inline LstmGrads<T> lstm_update_backward(Activation act, Activation ract, T zi, T zf, T zc, T zo,
                                                         T c_prev, T c_new, T dh, T dc) {
  const T i = activate(ract, zi), f = activate(ract, zf), g = activate(act, zc), o = activate(ract, zo);
  const T ac = activate(act, c_new);
  const T dct = dc + dh * o * activate_grad(act, c_new, ac);
  return {dct * g * activate_grad(ract, zi, i), dct * c_prev * activate_grad(ract, zf, f),
          dct * i * activate_grad(act, zc, g), dh * ac * activate_grad(ract, zo, o), dct * f};
}

// GRU: h' from the update gate's pre-activation, the candidate's and h.
template <typename T>
C10_HOST_DEVICE inline T gru_update(Activation act, Activation ract, T zpre, T npre, T h_prev) {
  const T z = activate(ract, zpre);
  return z * h_prev + (T(1) - z) * activate(act, npre);
}

// Its gradients w.r.t. the update gate's and the candidate's pre-activations, and the part of
// dh_prev that does not go through the recurrent product.
template <typename T>
struct GruGrads {
  T dz, dn, dh_prev;
};

template <typename T>
C10_HOST_DEVICE inline GruGrads<T> gru_update_backward(Activation act, Activation ract, T zpre, T npre, T h_prev,
                                                       T dh) {
  const T z = activate(ract, zpre), n = activate(act, npre);
  return {dh * (h_prev - n) * activate_grad(ract, zpre, z), dh * (T(1) - z) * activate_grad(act, npre, n), dh * z};
}

}  // namespace cudnn_rnn
