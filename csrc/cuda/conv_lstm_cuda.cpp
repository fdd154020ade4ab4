// ConvLSTM on CUDA: the convolutions are ATen's (cuDNN), core/conv_lstm.cpp; the pointwise step
// is conv_lstm_kernels.cu on the current stream.
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "core/conv_lstm.h"
#include "cuda/conv_lstm_kernels.h"

namespace cudnn_rnn {
namespace {

using at::Tensor;

const bool* bools(const Tensor& t) { return t.defined() ? t.data_ptr<bool>() : nullptr; }

// 1 where the mask flags batch rows ([B]), the pixel count where it flags positions ([B, *S']).
int64_t mask_pixels(const Tensor& real, int64_t B) { return real.defined() ? real.numel() / B : 1; }

void forward_step(const Tensor& zin, const Tensor& r, const Tensor& h_prev, const Tensor& c_prev, const Tensor& real,
                  const Tensor& seen, const Tensor& z, const Tensor& h_new, const Tensor& c_new, const Tensor& out,
                  Activation act, Activation ract) {
  const c10::cuda::CUDAGuard guard(z.device());
  const int64_t B = h_prev.size(0), F = h_prev.size(-1), P = h_prev.numel() / (B * F);
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "conv_lstm_forward_step", [&] {
    cuda::ConvCellForward<scalar_t> p{zin.data_ptr<scalar_t>(),    r.data_ptr<scalar_t>(),
                                      z.data_ptr<scalar_t>(),      h_prev.data_ptr<scalar_t>(),
                                      c_prev.data_ptr<scalar_t>(), bools(real),
                                      bools(seen),                 h_new.data_ptr<scalar_t>(),
                                      c_new.data_ptr<scalar_t>(),  out.data_ptr<scalar_t>(),
                                      zin.stride(0),               out.stride(0),
                                      B,                           P,
                                      F,                           act,
                                      ract,                        mask_pixels(real, B)};
    cuda::launch_conv_cell_forward(p, c10::cuda::getCurrentCUDAStream());
  });
}

void backward_step(const Tensor& z, const Tensor& c_prev, const Tensor& c_new, const Tensor& real, const Tensor& seen,
                   const Tensor& dy, const Tensor& dh, const Tensor& dc, const Tensor& dz, const Tensor& dh_prev,
                   const Tensor& dc_prev, Activation act, Activation ract) {
  const c10::cuda::CUDAGuard guard(z.device());
  const int64_t B = c_prev.size(0), F = c_prev.size(-1), P = c_prev.numel() / (B * F);
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "conv_lstm_backward_step", [&] {
    cuda::ConvCellBackward<scalar_t> p{z.data_ptr<scalar_t>(),  c_prev.data_ptr<scalar_t>(), c_new.data_ptr<scalar_t>(),
                                       bools(real),            bools(seen),                 dy.data_ptr<scalar_t>(),
                                       dh.data_ptr<scalar_t>(), dc.data_ptr<scalar_t>(),    dz.data_ptr<scalar_t>(),
                                       dh_prev.data_ptr<scalar_t>(), dc_prev.data_ptr<scalar_t>(), dy.stride(0),
                                       B, P, F, act, ract, mask_pixels(real, B)};
    cuda::launch_conv_cell_backward(p, c10::cuda::getCurrentCUDAStream());
  });
}

struct CudaConvLstm {
  static const conv::CellSteps& steps() {
    static const conv::CellSteps s{&forward_step, &backward_step};
    return s;
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_rnn, CUDA, m) { conv::ConvLstmKernels<CudaConvLstm>::register_kernels(m); }

}  // namespace cudnn_rnn
