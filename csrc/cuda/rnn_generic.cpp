// The generic CUDA backend: the device-generic driver (rnn_driver.h, GEMMs through ATen/cuBLAS)
// with the pointwise steps of generic_kernels.cu. It runs every configuration cuDNN cannot
// (backend_choice.cpp): GRU reset_after=False, other activations, recurrent dropout, any mask,
// go_backwards stacks. float16 / bfloat16 inputs compute in float32.
#include "rnn_generic.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include "../rnn_driver.h"
#include "generic_kernels.h"

namespace cudnn_rnn {
namespace {

using at::Tensor;

struct CudaPolicy {
  template <typename T>
  static void forward_step(const ForwardStep<T>& p) {
    cuda::launch_forward_step<T>(p, at::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  template <typename T>
  static void gru_before_gates(const ForwardStep<T>& p) {
    cuda::launch_gru_before_gates<T>(p, at::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  template <typename T>
  static void backward_step(const BackwardStep<T>& p) {
    cuda::launch_backward_step<T>(p, at::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  template <typename T>
  static void gru_before_backward_b(const BackwardStep<T>& p) {
    cuda::launch_gru_before_backward_b<T>(p, at::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

bool low_precision(const Tensor& t) { return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16; }
Tensor up(const Tensor& t) { return low_precision(t) ? t.to(at::kFloat) : t; }
std::vector<Tensor> up(at::TensorList ts) {
  std::vector<Tensor> out;
  for (const auto& t : ts) out.push_back(up(t));
  return out;
}
c10::optional<Tensor> up(const c10::optional<Tensor>& t) {
  return t.has_value() ? c10::optional<Tensor>(up(*t)) : c10::nullopt;
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor> generic_cuda_forward(
    const RnnConfig& cfg, const Tensor& x, at::TensorList weights, const c10::optional<Tensor>& mask,
    const c10::optional<Tensor>& h0, const c10::optional<Tensor>& c0, at::TensorList dropout_masks,
    at::TensorList recurrent_dropout_masks) {
  const std::vector<Tensor> w = up(weights), dm = up(dropout_masks), rdm = up(recurrent_dropout_masks);
  auto [y, h_n, c_n, reserve] = driver::forward<CudaPolicy>(cfg, up(x), w, mask, up(h0), up(c0), dm, rdm);
  if (low_precision(x)) {
    y = y.to(x.scalar_type());
    h_n = h_n.to(x.scalar_type());
    c_n = c_n.to(x.scalar_type());
  }
  return {y, h_n, c_n, reserve};
}

std::tuple<Tensor, std::vector<Tensor>, Tensor, Tensor> generic_cuda_backward(
    const RnnConfig& cfg, const Tensor& grad_y, const Tensor& grad_h_n, const Tensor& grad_c_n, const Tensor& x,
    at::TensorList weights, const c10::optional<Tensor>& mask, at::TensorList dropout_masks,
    at::TensorList recurrent_dropout_masks, const Tensor& reserve) {
  const std::vector<Tensor> w = up(weights), dm = up(dropout_masks), rdm = up(recurrent_dropout_masks);
  auto [dx, dw, dh0, dc0] = driver::backward<CudaPolicy>(cfg, up(grad_y), up(grad_h_n), up(grad_c_n), up(x), w,
                                                          mask, dm, rdm, reserve);
  if (low_precision(x)) {
    dx = dx.to(x.scalar_type());
    for (size_t i = 0; i < dw.size(); ++i) dw[i] = dw[i].to(weights[i].scalar_type());
    dh0 = dh0.to(x.scalar_type());
    dc0 = dc0.to(x.scalar_type());
  }
  return {dx, dw, dh0, dc0};
}

}  // namespace cudnn_rnn
