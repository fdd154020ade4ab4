// The pointwise part of one ConvLSTM step, per element, C10_HOST_DEVICE: the CPU loops
// (cpu/conv_lstm_cpu.cpp, for what its fused rows do not take) and the CUDA kernels
// (cuda/conv_lstm_kernels.cu) share it.
//
// Keras's ConvLSTMCell (keras/src/layers/rnn/conv_lstm.py): with z the input convolution plus the
// recurrent one, gates i, f, c, o in that order along the channels, the LSTM update of
// core/cell_update.h, and Keras's masking (backend.rnn): a masked step keeps h and c and outputs the previous output,
// which is zero before the row's first real step.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

#include "core/cell_update.h"

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
  const LstmState<T> next = lstm_update(act, ract, z[0], z[gate_stride], z[2 * gate_stride], z[3 * gate_stride], c_prev);
  *c_new = next.c;
  *h_new = next.h;
  *out = next.h;
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
  const LstmGrads<T> d = lstm_update_backward(act, ract, z[0], z[gate_stride], z[2 * gate_stride],
                                              z[3 * gate_stride], c_prev, c_new, dh + dy, dc);
  dz[0] = d.dzi;
  dz[gate_stride] = d.dzf;
  dz[2 * gate_stride] = d.dzc;
  dz[3 * gate_stride] = d.dzo;
  *dh_prev = T(0);
  *dc_prev = d.dc_prev;
}

}  // namespace conv
}  // namespace cudnn_rnn
