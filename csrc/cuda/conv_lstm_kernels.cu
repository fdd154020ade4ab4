// CUDA kernels of ConvLSTM's pointwise step: one thread per state element (batch row, pixel,
// filter) running core/conv_lstm_cell.h.
#include <c10/cuda/CUDAException.h>
#include <c10/macros/Macros.h>

#include "core/conv_lstm_cell.h"
#include "cuda/conv_lstm_kernels.h"

namespace cudnn_rnn {
namespace cuda {
namespace {

constexpr int kThreads = 256;

unsigned int blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return blocks > 2147483647LL ? 0u : static_cast<unsigned int>(blocks);  // grid x: at most 2^31 - 1
}

template <typename T>
__global__ void conv_cell_forward_kernel(ConvCellForward<T> p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // = state element
  const int64_t F = p.filters;
  if (idx >= p.batch * p.pixels * F) return;
  const int64_t q = idx / F, f = idx - q * F, b = q / p.pixels, px = q - b * p.pixels;
  const int64_t m = p.mask_pixels == 1 ? b : q;
  const bool real = p.real == nullptr || p.real[m];
  const bool seen = p.seen != nullptr && p.seen[m];
  conv::cell_forward<T>(p.act, p.ract, p.zin + b * p.zin_stride + px * 4 * F + f, p.r + q * 4 * F + f,
                        p.z + q * 4 * F + f, F, p.h_prev[idx], p.c_prev[idx], real, seen, p.h_new + idx,
                        p.c_new + idx, p.out + b * p.out_stride + px * F + f);
}

template <typename T>
__global__ void conv_cell_backward_kernel(ConvCellBackward<T> p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t F = p.filters;
  if (idx >= p.batch * p.pixels * F) return;
  const int64_t q = idx / F, f = idx - q * F, b = q / p.pixels, px = q - b * p.pixels;
  const int64_t m = p.mask_pixels == 1 ? b : q;
  const bool real = p.real == nullptr || p.real[m];
  const bool seen = p.seen != nullptr && p.seen[m];
  conv::cell_backward<T>(p.act, p.ract, p.z + q * 4 * F + f, F, p.c_prev[idx], p.c_new[idx], real, seen,
                         p.dy[b * p.dy_stride + px * F + f], p.dh[idx], p.dc[idx], p.dz + q * 4 * F + f,
                         p.dh_prev + idx, p.dc_prev + idx);
}

}  // namespace

template <typename T>
void launch_conv_cell_forward(const ConvCellForward<T>& p, cudaStream_t stream) {
  const int64_t n = p.batch * p.pixels * p.filters;
  if (n == 0) return;
  conv_cell_forward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void launch_conv_cell_backward(const ConvCellBackward<T>& p, cudaStream_t stream) {
  const int64_t n = p.batch * p.pixels * p.filters;
  if (n == 0) return;
  conv_cell_backward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template void launch_conv_cell_forward<float>(const ConvCellForward<float>&, cudaStream_t);
template void launch_conv_cell_forward<double>(const ConvCellForward<double>&, cudaStream_t);
template void launch_conv_cell_backward<float>(const ConvCellBackward<float>&, cudaStream_t);
template void launch_conv_cell_backward<double>(const ConvCellBackward<double>&, cudaStream_t);

}  // namespace cuda
}  // namespace cudnn_rnn
