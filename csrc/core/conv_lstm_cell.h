// The pointwise part of one ConvLSTM step, per element, C10_HOST_DEVICE: the CPU loops
// (cpu/conv_lstm_cpu.cpp, for what its fused rows do not take) and the CUDA kernels
// (cuda/conv_lstm_kernels.cu) share it.
//
// Keras's ConvLSTMCell (keras/src/layers/rnn/conv_lstm.py): with z the input convolution plus the
// recurrent one, gates i, f, c, o in that order along the channels,
//   i = ra(z_i), f = ra(z_f), c' = f c + i a(z_c), o = ra(z_o), h' = o a(c')
// and Keras's masking (backend.rnn): a masked step keeps h and c and outputs the previous output,
// which is zero before the row's first real step.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

#include "core/cell_math.h"

namespace cudnn_rnn {
namespace conv {

// One element of the state (channels last: pixel p, filter f): its gate pre-activations are
// zin[q * gate_stride] + r[q * gate_stride] (the input and recurrent convolutions; gate_stride = F,
// the gates of a pixel being 4 blocks of F), kept in z[q * gate_stride] for backward.
template <typename T>
C10_HOST_DEVICE inline void cell_forward(Activation act, Activation ract, const T* zin, const T* r, T* z,
                                         int64_t gate_stride, T h_prev, T c_prev, bool real, bool seen, T* h_new,
                                         T* c_new, T* out) {
  if (!real) {  // (z zeroed: backward does not read it, but the op's outputs are all defined)
    for (int q = 0; q < 4; ++q) z[q * gate_stride] = T(0);
    *h_new = h_prev;
    *c_new = c_prev;
    *out = seen ? h_prev : T(0);
    return;
  }
  for (int q = 0; q < 4; ++q) z[q * gate_stride] = zin[q * gate_stride] + r[q * gate_stride];
  const T i = activate(ract, z[0]);
  const T f = activate(ract, z[gate_stride]);
  const T g = activate(act, z[2 * gate_stride]);
  const T o = activate(ract, z[3 * gate_stride]);
  const T c = f * c_prev + i * g;
  const T h = o * activate(act, c);
  *c_new = c;
  *h_new = h;
  *out = h;
}

// Its backward: dy the output's gradient, dh / dc those of h' and c'. Writes the four gate
// pre-activation gradients, the part of dh_prev that does not go through the recurrent
// convolution (a masked step passes dh on, and dy when it output h_prev) and dc_prev.
template <typename T>
C10_HOST_DEVICE inline void cell_backward(Activation act, Activation ract, const T* z, int64_t gate_stride, T c_prev,
                                          T c_new, bool real, bool seen, T dy, T dh, T dc, T* dz, T* dh_prev,
                                          T* dc_prev) {
  if (!real) {
    for (int q = 0; q < 4; ++q) dz[q * gate_stride] = T(0);
    *dh_prev = dh + (seen ? dy : T(0));
    *dc_prev = dc;
    return;
  }
  const T zi = z[0], zf = z[gate_stride], zg = z[2 * gate_stride], zo = z[3 * gate_stride];
  const T i = activate(ract, zi), f = activate(ract, zf), g = activate(act, zg), o = activate(ract, zo);
  const T ac = activate(act, c_new);
  const T dht = dh + dy;
  const T dct = dc + dht * o * activate_grad(act, c_new, ac);
  dz[0] = dct * g * activate_grad(ract, zi, i);
  dz[gate_stride] = dct * c_prev * activate_grad(ract, zf, f);
  dz[2 * gate_stride] = dct * i * activate_grad(act, zg, g);
  dz[3 * gate_stride] = dht * ac * activate_grad(ract, zo, o);
  *dh_prev = T(0);
  *dc_prev = dct * f;
}

}  // namespace conv
}  // namespace cudnn_rnn
