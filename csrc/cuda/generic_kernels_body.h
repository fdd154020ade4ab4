// The generic CUDA backend's pointwise steps, one (batch row b, unit j) element at a time: the
// cell updates of core/cell_update.h (which the CPU's rows compute too), with masking and the
// saved pre-activations around them.
// C10_HOST_DEVICE so that generic_kernels.cu runs them as CUDA threads and kernel_emulation.cpp
// runs them on the CPU (in any thread order), where the tests hold them to the CPU backend.
//
// Within one step every element writes only its own [b*u + j] / [k*u + j] entries, and the
// buffers a step reads never overlap those it writes; `seen[b]` is written only by real rows
// (element j == 0) and read only by masked rows.
#pragma once

#include <c10/macros/Macros.h>

#include "core/cell_update.h"
#include "core/step_args.h"

namespace cudnn_rnn {
namespace cuda {

template <typename T>
C10_HOST_DEVICE inline void forward_step_element(const ForwardStep<T>& p, int64_t b, int64_t j) {
  const int64_t u = p.units;
  const bool real = p.mask ? p.mask[b * p.time + p.t] : true;
  const T* xw = p.xw.row(p.t, b);
  const T* rec = p.rec + b * p.gates * u;
  T* sv = p.saved + b * p.saved_width;
  T* out = p.out.row(p.out_index, b) + p.out_col;
  const T hp = p.h_prev[b * u + j];
  if (!real) {
    // Keras: the state is carried; the output is the previous output (zero before the first
    // real step) or zero with zero_output_for_mask. seen[b] is written only by real rows.
    p.h_next[b * u + j] = hp;
    out[j] = (p.zero_out || !p.seen[b]) ? T(0) : hp;
    if (p.c_next) p.c_next[b * u + j] = p.c_prev[b * u + j];
    for (int64_t k = j; k < p.saved_width; k += u) sv[k] = T(0);
    return;
  }
  if (j == 0) p.seen[b] = 1;
  T h;
  switch (p.cell) {
    case CellKind::LSTM: {
      const T zi = xw[j] + rec[j], zf = xw[u + j] + rec[u + j];
      const T zc = xw[2 * u + j] + rec[2 * u + j], zo = xw[3 * u + j] + rec[3 * u + j];
      sv[j] = zi;
      sv[u + j] = zf;
      sv[2 * u + j] = zc;
      sv[3 * u + j] = zo;
      const LstmState<T> next = lstm_update(p.act, p.ract, zi, zf, zc, zo, p.c_prev[b * u + j]);
      p.c_next[b * u + j] = next.c;
      h = next.h;
      break;
    }
    case CellKind::GRU:
      if (p.reset_after) {
        const T zpre = xw[j] + rec[j], rpre = xw[u + j] + rec[u + j], hh = rec[2 * u + j];
        const T npre = xw[2 * u + j] + activate(p.ract, rpre) * hh;
        sv[j] = zpre;
        sv[u + j] = rpre;
        sv[2 * u + j] = npre;
        sv[3 * u + j] = hh;
        h = gru_update(p.act, p.ract, zpre, npre, hp);
      } else {  // phase 2; phase 1 (gru_before_gates) saved z, r and r * hd_h
        const T npre = xw[2 * u + j] + p.rec_h[b * u + j];
        sv[2 * u + j] = npre;
        h = gru_update(p.act, p.ract, sv[j], npre, hp);
      }
      break;
    default: {
      const T pre = xw[j] + rec[j];
      sv[j] = pre;
      h = activate(p.act, pre);
    }
  }
  p.h_next[b * u + j] = h;
  out[j] = h;
}

template <typename T>
C10_HOST_DEVICE inline void gru_before_gates_element(const ForwardStep<T>& p, int64_t b, int64_t j) {
  const int64_t u = p.units;
  const T* xw = p.xw.row(p.t, b);
  const T* rec = p.rec + b * p.gates * u;
  T* sv = p.saved + b * p.saved_width;
  sv[j] = xw[j] + rec[j];
  const T rpre = xw[u + j] + rec[u + j];
  sv[u + j] = rpre;
  const T hd = p.mask_h ? p.h_prev[b * u + j] * p.mask_h[b * u + j] : p.h_prev[b * u + j];
  const T rh = activate(p.ract, rpre) * hd;
  sv[3 * u + j] = rh;
  p.rh[b * u + j] = rh;
}

template <typename T>
C10_HOST_DEVICE inline void backward_step_element(const BackwardStep<T>& p, int64_t b, int64_t j) {
  const int64_t u = p.units, G = p.gates;
  const bool real = p.mask ? p.mask[b * p.time + p.t] : true;
  // Which output positions read this step's state: the step itself when real, and with
  // carry-over also every masked step after the first real one.
  const bool reads = p.zero_out ? real : p.s >= p.first[b];
  T dh = p.dh[b * u + j];
  if (reads) dh += p.dout.row(p.out_index, b)[p.out_col + j];
  p.dh[b * u + j] = dh;
  T* dx = p.dxw.row(p.t, b);
  T* dr = p.drec + b * G * u;
  if (!real) {
    for (int64_t k = 0; k < G; ++k) dx[k * u + j] = dr[k * u + j] = T(0);
    p.dh_next[b * u + j] = dh;
    return;  // dc carries through unchanged
  }
  const T* sv = p.saved + b * p.saved_width;
  switch (p.cell) {
    case CellKind::LSTM: {
      const LstmGrads<T> d = lstm_update_backward(p.act, p.ract, sv[j], sv[u + j], sv[2 * u + j], sv[3 * u + j],
                                                   p.c_prev[b * u + j], p.c_new[b * u + j], dh, p.dc[b * u + j]);
      dx[j] = dr[j] = d.dzi;
      dx[u + j] = dr[u + j] = d.dzf;
      dx[2 * u + j] = dr[2 * u + j] = d.dzc;
      dx[3 * u + j] = dr[3 * u + j] = d.dzo;
      p.dc[b * u + j] = d.dc_prev;
      p.dh_next[b * u + j] = T(0);
      break;
    }
    case CellKind::GRU: {
      const GruGrads<T> d = gru_update_backward(p.act, p.ract, sv[j], sv[2 * u + j], p.h_prev[b * u + j], dh);
      const T dn = d.dn;
      dx[j] = dr[j] = d.dz;
      dx[2 * u + j] = dn;
      if (p.reset_after) {
        const T rpre = sv[u + j], hh = sv[3 * u + j];
        const T r = activate(p.ract, rpre);
        const T drp = dn * hh * activate_grad(p.ract, rpre, r);
        dx[u + j] = dr[u + j] = drp;
        dr[2 * u + j] = dn * r;
      } else {
        dr[2 * u + j] = dn;  // the r gate comes in phase B
      }
      p.dh_next[b * u + j] = d.dh_prev;
      break;
    }
    default: {
      const T pre = sv[j];
      const T d = dh * activate_grad(p.act, pre, p.h_new[b * u + j]);
      dx[j] = dr[j] = d;
      p.dh_next[b * u + j] = T(0);
    }
  }
}

template <typename T>
C10_HOST_DEVICE inline void gru_before_backward_b_element(const BackwardStep<T>& p, int64_t b, int64_t j) {
  const int64_t u = p.units;
  if (p.mask && !p.mask[b * p.time + p.t]) return;
  const T rpre = p.saved[b * p.saved_width + u + j];
  const T r = activate(p.ract, rpre);
  const T m = p.mask_h ? p.mask_h[b * u + j] : T(1);
  const T d_rh = p.d_rh[b * u + j];
  const T drp = d_rh * p.h_prev[b * u + j] * m * activate_grad(p.ract, rpre, r);
  p.dxw.row(p.t, b)[u + j] = drp;
  p.drec[b * p.gates * u + u + j] = drp;
  p.dh_next[b * u + j] += d_rh * r * m;
}

}  // namespace cuda
}  // namespace cudnn_rnn
