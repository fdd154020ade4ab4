// ConvLSTM's pointwise step on CUDA (core/conv_lstm_cell.h, one thread per state element),
// declared without ATen types so that conv_lstm_cuda.cpp stays plain C++ and only the .cu needs nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cell_math.h"

namespace cudnn_rnn {
namespace cuda {

// Per step, channels last: batch rows of P pixels of F state values; a pixel's gates are 4F
// values in gate blocks of F (z / dz contiguous, zin rows zin_stride apart); out / dy rows are
// out_stride / dy_stride apart; real / seen: bool [batch] (mask_pixels 1) or [batch, pixels]
// (mask_pixels = pixels: per position), or null (every row real).
template <typename T>
struct ConvCellForward {
  const T* zin;  // rows zin_stride apart
  const T* r;
  T* z;
  const T* h_prev;
  const T* c_prev;
  const bool* real;
  const bool* seen;
  T* h_new;
  T* c_new;
  T* out;
  int64_t zin_stride, out_stride, batch, pixels, filters;
  Activation act, ract;
  int64_t mask_pixels;
};

template <typename T>
struct ConvCellBackward {
  const T* z;
  const T* c_prev;
  const T* c_new;
  const bool* real;
  const bool* seen;
  const T* dy;
  const T* dh;
  const T* dc;
  T* dz;
  T* dh_prev;
  T* dc_prev;
  int64_t dy_stride, batch, pixels, filters;
  Activation act, ract;
  int64_t mask_pixels;
};

template <typename T>
void launch_conv_cell_forward(const ConvCellForward<T>& p, cudaStream_t stream);
template <typename T>
void launch_conv_cell_backward(const ConvCellBackward<T>& p, cudaStream_t stream);

}  // namespace cuda
}  // namespace cudnn_rnn
