// One batch row of each cell's update, in array form: the gate pre-activations of the row are
// activated as whole arrays (activation_arrays.h, vectorised) and then combined elementwise.
// Gate columns follow Keras: LSTM i, f, c, o; GRU z, r, h. u = units.
//
// Forward writes `saved` (the reserve's per-step slot, see RnnConfig::saved_width):
//   LSTM   [zi, zf, zc, zo]             pre-activations
//   GRU    [zz, zr, zn, hh]             reset_after: hh = recurrent candidate (h·R_h + b)
//          [zz, zr, zn, r * hd_h]       reset_after=False: the candidate matmul's input
//   Simple [z]
// With `activated` (saves_activated: float32 and both activations tanh or sigmoid, whose
// derivatives come from their outputs), LSTM and GRU reset_after keep the activated gates
// [i, f, c~, o] and [z, r, n, hh] instead, so that backward evaluates no activation again
// (LSTM still one: tanh(c_new)). The same function computes them either way, so outputs and
// gradients are the same bits; only the reserve's content differs (float64, the reference the
// generic CUDA kernels' emulation is compared with reserve and all, keeps pre-activations).
// Those float32 rows (LSTM, GRU reset_after) run as one fused pass over the units, compiled for
// the machine's instruction set (vec_loops.h); the array form below serves the rest.
// Backward gets dh (and dc) w.r.t. the step's new state and writes the input-side gate
// gradients (dx), the recurrent-side ones (drec, where they differ) and the direct part of
// the gradient w.r.t. h_prev (dh_prev; the recurrent matmul's part is added by the caller).
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/cell_math.h"
#include "cpu/activation_arrays.h"
#include "cpu/vec_loops.h"

namespace cudnn_rnn {
namespace cpu {

// Scratch floats a row kernel needs, per row.
inline int64_t row_scratch_size(int64_t units) { return 10 * units; }

inline bool derivative_from_output(Activation a) { return a == Activation::Tanh || a == Activation::Sigmoid; }

template <typename T>
bool saves_activated(Activation act, Activation ract) {
  return std::is_same_v<T, float> && derivative_from_output(act) && derivative_from_output(ract);
}

// g[i] = f'(x) from y = f(x) alone (tanh, sigmoid).
template <typename T>
void grad_from_output(Activation a, const T* y, T* g, int64_t n) {
  if (a == Activation::Tanh) {
    for (int64_t i = 0; i < n; ++i) g[i] = T(1) - y[i] * y[i];
  } else {
    for (int64_t i = 0; i < n; ++i) g[i] = y[i] * (T(1) - y[i]);
  }
}

// The gate blocks of one row: gate g's n values start at p + g * stride. A kernel may see all u
// units of a row (stride u) or a slice of them (the CPU time loop splits units across threads).
template <typename T>
struct Gates {
  T* p;
  int64_t stride;
  T* operator[](int64_t g) const { return p + g * stride; }
};

// Backward: the activated values of a row's first `count` gates (gate 2, the candidate, through
// act, the others through ract) and their derivatives into ga ([count * n]): read from saved when
// it holds them (saves_activated), else recomputed into scratch ([count * n]) from the
// pre-activations.
template <typename T>
Gates<const T> activated_gates(Activation act, Activation ract, int64_t n, int64_t count, Gates<const T> saved,
                               T* scratch, T* ga) {
  const bool activated = saves_activated<T>(act, ract);
  const Gates<const T> g = activated ? saved : Gates<const T>{scratch, n};
  for (int64_t q = 0; q < count; ++q) {
    const Activation f = q == 2 ? act : ract;
    if (activated) {
      grad_from_output(f, g[q], ga + q * n, n);
    } else {
      activate_array(f, saved[q], scratch + q * n, n);
      activate_grad_array(f, saved[q], g[q], ga + q * n, n);
    }
  }
  return g;
}

// keep_saved: a backward will read saved (else it is scratch: the fused rows leave it alone).
template <typename T>
void lstm_row_forward(Activation act, Activation ract, int64_t n, Gates<const T> xw, Gates<const T> rec,
                      const T* c_prev, Gates<T> saved, bool keep_saved, T* h_new, T* c_new, T* scratch) {
  const bool activated = saves_activated<T>(act, ract);
  if constexpr (std::is_same_v<T, float>) {
    if (activated) {
      return float_loops().lstm_forward_row(act == Activation::Tanh, ract == Activation::Tanh, n, xw.p, xw.stride,
                                            rec.p, rec.stride, c_prev, keep_saved ? saved.p : nullptr, saved.stride,
                                            h_new, c_new);
    }
  }
  // the activated gates i, f, c~, o: in place in saved, or in scratch
  const Gates<T> g = activated ? saved : Gates<T>{scratch, n};
  T* tc = scratch + 4 * n;
  for (int64_t q = 0; q < 4; ++q) {
    for (int64_t k = 0; k < n; ++k) saved[q][k] = xw[q][k] + rec[q][k];
    activate_array(q == 2 ? act : ract, saved[q], g[q], n);
  }
  for (int64_t j = 0; j < n; ++j) c_new[j] = g[1][j] * c_prev[j] + g[0][j] * g[2][j];
  activate_array(act, c_new, tc, n);
  for (int64_t j = 0; j < n; ++j) h_new[j] = g[3][j] * tc[j];
}

// dc is read as the gradient w.r.t. c_new and overwritten with the one w.r.t. c_prev.
template <typename T>
void lstm_row_backward(Activation act, Activation ract, int64_t n, Gates<const T> saved, const T* c_prev,
                       const T* c_new, const T* dh, T* dc, Gates<T> dx, T* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    if (saves_activated<T>(act, ract)) {
      return float_loops().lstm_backward_row(act == Activation::Tanh, ract == Activation::Tanh, n, saved.p,
                                             saved.stride, c_prev, c_new, dh, dc, dx.p, dx.stride);
    }
  }
  T* ga = scratch + 4 * n;   // the gates' derivatives
  T* tc = scratch + 8 * n;   // act(c_new)
  T* tca = scratch + 9 * n;  // act'(c_new)
  const Gates<const T> g = activated_gates(act, ract, n, 4, saved, scratch, ga);
  activate_array(act, c_new, tc, n);
  activate_grad_array(act, c_new, tc, tca, n);
  T* di = dx[0];
  T* df = dx[1];
  T* dg = dx[2];
  T* dout = dx[3];
  for (int64_t j = 0; j < n; ++j) {
    const T dcc = dc[j] + dh[j] * g[3][j] * tca[j];
    di[j] = dcc * g[2][j] * ga[j];
    df[j] = dcc * c_prev[j] * ga[n + j];
    dg[j] = dcc * g[0][j] * ga[2 * n + j];
    dout[j] = dh[j] * tc[j] * ga[3 * n + j];
    dc[j] = dcc * g[1][j];
  }
}

// GRU reset_after=True: rec = h·R + b_rec for z, r, h. saved: z, r, n pre-activations (or
// activated, see saves_activated) and hh.
template <typename T>
void gru_after_row_forward(Activation act, Activation ract, int64_t n, Gates<const T> xw, Gates<const T> rec,
                           const T* h_prev, Gates<T> saved, bool keep_saved, T* h_new, T* scratch) {
  const bool activated = saves_activated<T>(act, ract);
  if constexpr (std::is_same_v<T, float>) {
    if (activated) {
      return float_loops().gru_forward_row(act == Activation::Tanh, ract == Activation::Tanh, n, xw.p, xw.stride,
                                           rec.p, rec.stride, h_prev, keep_saved ? saved.p : nullptr, saved.stride,
                                           h_new);
    }
  }
  // the activated z, r, n: in place in saved, or in scratch
  const Gates<T> g = activated ? saved : Gates<T>{scratch, n};
  for (int64_t q = 0; q < 2; ++q) {
    for (int64_t k = 0; k < n; ++k) saved[q][k] = xw[q][k] + rec[q][k];
    activate_array(ract, saved[q], g[q], n);
  }
  for (int64_t j = 0; j < n; ++j) saved[3][j] = rec[2][j];
  for (int64_t j = 0; j < n; ++j) saved[2][j] = xw[2][j] + g[1][j] * saved[3][j];
  activate_array(act, saved[2], g[2], n);
  for (int64_t j = 0; j < n; ++j) h_new[j] = g[0][j] * h_prev[j] + (T(1) - g[0][j]) * g[2][j];
}

template <typename T>
void gru_after_row_backward(Activation act, Activation ract, int64_t n, Gates<const T> saved, const T* h_prev,
                            const T* dh, Gates<T> dx, Gates<T> drec, T* dh_prev, T* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    if (saves_activated<T>(act, ract)) {
      return float_loops().gru_backward_row(act == Activation::Tanh, ract == Activation::Tanh, n, saved.p,
                                            saved.stride, h_prev, dh, dx.p, dx.stride, drec.p, drec.stride, dh_prev);
    }
  }
  T* ga = scratch + 3 * n;  // the derivatives of z, r, n
  const Gates<const T> g = activated_gates(act, ract, n, 3, saved, scratch, ga);
  for (int64_t j = 0; j < n; ++j) {
    const T z = g[0][j], r = g[1][j];
    const T dn = dh[j] * (T(1) - z) * ga[2 * n + j];
    const T dz = dh[j] * (h_prev[j] - g[2][j]) * ga[j];
    const T dr = dn * saved[3][j] * ga[n + j];
    dx[0][j] = drec[0][j] = dz;
    dx[1][j] = drec[1][j] = dr;
    dx[2][j] = dn;
    drec[2][j] = dn * r;
    dh_prev[j] = dh[j] * z;
  }
}

// GRU reset_after=False, phase 1: rec = hd·R for z and r; writes rh = r * hd_h (the
// candidate matmul's input) into saved and into rh.
template <typename T>
void gru_before_row_gates(Activation ract, int64_t u, const T* xw, const T* rec, const T* hd_h, T* saved, T* rh,
                          T* scratch) {
  for (int64_t k = 0; k < 2 * u; ++k) saved[k] = xw[k] + rec[k];
  activate_array(ract, saved + u, scratch, u);
  for (int64_t j = 0; j < u; ++j) rh[j] = saved[3 * u + j] = scratch[j] * hd_h[j];
}

// Phase 2: rec_h = rh·R_h.
template <typename T>
void gru_before_row_update(Activation act, Activation ract, int64_t u, const T* xw, const T* rec_h, const T* h_prev,
                           T* saved, T* h_new, T* scratch) {
  T* z = scratch;
  T* n = scratch + u;
  for (int64_t j = 0; j < u; ++j) saved[2 * u + j] = xw[2 * u + j] + rec_h[j];
  activate_array(ract, saved, z, u);
  activate_array(act, saved + 2 * u, n, u);
  for (int64_t j = 0; j < u; ++j) h_new[j] = z[j] * h_prev[j] + (T(1) - z[j]) * n[j];
}

// Backward phase A: the z and candidate gradients (dx[0:u], dx[2u:3u]) and dh_prev's direct part.
template <typename T>
void gru_before_row_backward_a(Activation act, Activation ract, int64_t u, const T* saved, const T* h_prev,
                               const T* dh, T* dx, T* dh_prev, T* scratch) {
  T* z = scratch;
  T* za = scratch + u;
  T* n = scratch + 2 * u;
  T* na = scratch + 3 * u;
  activate_array(ract, saved, z, u);
  activate_grad_array(ract, saved, z, za, u);
  activate_array(act, saved + 2 * u, n, u);
  activate_grad_array(act, saved + 2 * u, n, na, u);
  for (int64_t j = 0; j < u; ++j) {
    dx[j] = dh[j] * (h_prev[j] - n[j]) * za[j];
    dx[2 * u + j] = dh[j] * (T(1) - z[j]) * na[j];
    dh_prev[j] = dh[j] * z[j];
  }
}

// Backward phase B: d_rh = d(r * hd_h) from the candidate matmul. Writes dx[u:2u] (the r gate)
// and adds the candidate's share to dh_prev (through the recurrent dropout mask m_h, or 1).
template <typename T>
void gru_before_row_backward_b(Activation ract, int64_t u, const T* saved, const T* h_prev, const T* mask_h,
                               const T* d_rh, T* dx, T* dh_prev, T* scratch) {
  T* r = scratch;
  T* ra = scratch + u;
  activate_array(ract, saved + u, r, u);
  activate_grad_array(ract, saved + u, r, ra, u);
  for (int64_t j = 0; j < u; ++j) {
    const T m = mask_h ? mask_h[j] : T(1);
    dx[u + j] = d_rh[j] * h_prev[j] * m * ra[j];
    dh_prev[j] += d_rh[j] * r[j] * m;
  }
}

template <typename T>
void simple_row_forward(Activation act, int64_t u, const T* xw, const T* rec, T* saved, T* h_new) {
  for (int64_t j = 0; j < u; ++j) saved[j] = xw[j] + rec[j];
  activate_array(act, saved, h_new, u);
}

// h_new = act(saved): the state the forward wrote for this (real) step.
template <typename T>
void simple_row_backward(Activation act, int64_t u, const T* saved, const T* h_new, const T* dh, T* dx) {
  activate_grad_array(act, saved, h_new, dx, u);
  for (int64_t j = 0; j < u; ++j) dx[j] *= dh[j];
}

}  // namespace cpu
}  // namespace cudnn_rnn
