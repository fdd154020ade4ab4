// What one timestep's pointwise work reads and writes, as raw pointers: the interface between
// the device-generic driver (rnn_driver.h) and each backend's pointwise implementation (the CPU
// row loops in cpu/rnn_cpu.cpp, the CUDA kernels in cuda/generic_kernels.cu).
//
// Sequences are addressed as base + time * time_stride + row * row_stride (either layout).
// Gate columns follow Keras (LSTM i, f, c, o; GRU z, r, h); S = RnnConfig::saved_width().
#pragma once

#include <cstdint>

#include "core/cell_math.h"

namespace cudnn_rnn {

template <typename T>
struct Seq {
  T* data;
  int64_t time_stride, row_stride;
  C10_HOST_DEVICE T* row(int64_t time, int64_t b) const { return data + time * time_stride + b * row_stride; }
};

template <typename T>
struct ForwardStep {
  CellKind cell;
  bool reset_after;
  Activation act, ract;
  int64_t batch, time, units, gates, saved_width;
  bool zero_out;           // masked steps output zeros rather than the previous output
  int64_t t, out_index, out_col;  // input time index, output time index, first output column
  Seq<const T> xw;         // input projection [.., G*u]
  const T* rec;            // [B, G*u] recurrent projection (GRU reset_after=False: z, r only)
  const T* rec_h;          // [B, u] (GRU reset_after=False, phase 2: (r * hd_h) . R_h)
  T* rh;                   // [B, u] (GRU reset_after=False, phase 1 output: r * hd_h)
  const T* mask_h;         // [B, u] recurrent dropout mask the GRU candidate sees, or null
  const T* h_prev;         // [B, u]
  T* h_next;               // [B, u]
  const T* c_prev;         // [B, u] (LSTM)
  T* c_next;               // [B, u] (LSTM)
  T* saved;                // [B, S]
  bool keep_saved;         // saved is read by a backward (else it is scratch the cell need not fill)
  Seq<T> out;              // layer output
  const bool* mask;        // [B, T] or null
  uint8_t* seen;           // [B]: has a real step been processed (carry-over outputs need it)
};

template <typename T>
struct BackwardStep {
  CellKind cell;
  bool reset_after;
  Activation act, ract;
  int64_t batch, time, units, gates, saved_width;
  bool zero_out;
  int64_t s, t, out_index, out_col;  // processing step, input time index, output time index, column
  Seq<const T> dout;       // gradient of the layer output
  Seq<T> dxw;              // input-side pre-activation gradients (written at time t)
  T* drec;                 // [B, G*u] this step's recurrent-side gradients
  T* dh;                   // [B, u] in: gradient w.r.t. the state after this step (dout added here)
  T* dc;                   // [B, u] LSTM: in/out, gradient w.r.t. c after -> before this step
  T* dh_next;              // [B, u] out: direct part of the gradient w.r.t. h before this step
  const T* d_rh;           // [B, u] GRU reset_after=False phase B: d(r * hd_h)
  const T* mask_h;         // [B, u] or null
  const T* h_prev;         // [B, u]
  const T* h_new;          // [B, u]
  const T* c_prev;         // [B, u]
  const T* c_new;          // [B, u]
  const T* saved;          // [B, S]
  const bool* mask;        // [B, T] or null
  const int64_t* first;    // [B] first real step in processing order (T when none)
};

}  // namespace cudnn_rnn
