// The generic CUDA backend: the device-generic driver (core/rnn_driver.h, GEMMs through
// ATen/cuBLAS) with the pointwise steps of generic_kernels.cu. It runs every configuration cuDNN
// cannot (cudnn_host/backend_choice.cpp): GRU reset_after=False, other activations, recurrent
// dropout, any mask, go_backwards stacks. float16 / bfloat16 inputs compute in float32.
#include "cuda/rnn_generic.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include "core/rnn_driver.h"
#include "cuda/generic_kernels.h"

namespace cudnn_rnn {
namespace {

using at::Tensor;

// Each pointwise step is one kernel launch on the current stream, checked.
template <typename Step, typename Launch>
void launch_checked(Launch launch, const Step& p) {
  launch(p, at::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

struct CudaPolicy : driver::PolicyDefaults {
  template <typename T>
  static void forward_step(const ForwardStep<T>& p) { launch_checked(&cuda::launch_forward_step<T>, p); }
  template <typename T>
  static void gru_before_gates(const ForwardStep<T>& p) { launch_checked(&cuda::launch_gru_before_gates<T>, p); }
  template <typename T>
  static void backward_step(const BackwardStep<T>& p) { launch_checked(&cuda::launch_backward_step<T>, p); }
  template <typename T>
  static void gru_before_backward_b(const BackwardStep<T>& p) {
    launch_checked(&cuda::launch_gru_before_backward_b<T>, p);
  }
};

}  // namespace

ForwardResult GenericCudaBackend::forward(const RnnConfig& cfg, const ForwardCall& call) {
  return driver::forward_any_precision<CudaPolicy>(cfg, call);
}

BackwardResult GenericCudaBackend::backward(const RnnConfig& cfg, const BackwardCall& call) {
  return driver::backward_any_precision<CudaPolicy>(cfg, call);
}

}  // namespace cudnn_rnn
