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

struct CudaPolicy : driver::GenericTimeLoops {
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

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor> generic_cuda_forward(
    const RnnConfig& cfg, const Tensor& x, at::TensorList weights, const c10::optional<Tensor>& mask,
    const c10::optional<Tensor>& h0, const c10::optional<Tensor>& c0, at::TensorList dropout_masks,
    at::TensorList recurrent_dropout_masks) {
  return driver::forward_any_precision<CudaPolicy>(cfg, x, weights, mask, h0, c0, dropout_masks,
                                                   recurrent_dropout_masks);
}

std::tuple<Tensor, std::vector<Tensor>, Tensor, Tensor> generic_cuda_backward(
    const RnnConfig& cfg, const Tensor& grad_y, const Tensor& grad_h_n, const Tensor& grad_c_n, const Tensor& x,
    at::TensorList weights, const c10::optional<Tensor>& mask, at::TensorList dropout_masks,
    at::TensorList recurrent_dropout_masks, const Tensor& reserve) {
  return driver::backward_any_precision<CudaPolicy>(cfg, grad_y, grad_h_n, grad_c_n, x, weights, mask, dropout_masks,
                                                    recurrent_dropout_masks, reserve);
}

}  // namespace cudnn_rnn
