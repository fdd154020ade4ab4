// CUDA kernels of the generic backend: one thread per (batch row, unit) running the element
// functions of generic_kernels_body.h.
#include <c10/macros/Macros.h>

#include "cuda/generic_kernels.h"
#include "cuda/generic_kernels_body.h"

namespace cudnn_rnn {
namespace cuda {
namespace {

constexpr int kThreads = 256;

#define CUDNN_RNN_ELEMENT_KERNEL(name, Step)                                          \
  template <typename T>                                                               \
  __global__ void name##_kernel(Step<T> p) {                                          \
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  \
    if (idx >= p.batch * p.units) return;                                             \
    name##_element<T>(p, idx / p.units, idx % p.units);                               \
  }
CUDNN_RNN_ELEMENT_KERNEL(forward_step, ForwardStep)
CUDNN_RNN_ELEMENT_KERNEL(gru_before_gates, ForwardStep)
CUDNN_RNN_ELEMENT_KERNEL(backward_step, BackwardStep)
CUDNN_RNN_ELEMENT_KERNEL(gru_before_backward_b, BackwardStep)
#undef CUDNN_RNN_ELEMENT_KERNEL

unsigned int blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  // A grid's x dimension holds up to 2^31 - 1 blocks.
  return blocks > 2147483647LL ? 0u : static_cast<unsigned int>(blocks);
}

}  // namespace

#define CUDNN_RNN_LAUNCHER(name, Step)                                                       \
  template <typename T>                                                                      \
  void launch_##name(const Step<T>& p, cudaStream_t stream) {                                \
    const int64_t n = p.batch * p.units;                                                     \
    if (n == 0) return;                                                                      \
    name##_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(p);                             \
  }
CUDNN_RNN_LAUNCHER(forward_step, ForwardStep)
CUDNN_RNN_LAUNCHER(gru_before_gates, ForwardStep)
CUDNN_RNN_LAUNCHER(backward_step, BackwardStep)
CUDNN_RNN_LAUNCHER(gru_before_backward_b, BackwardStep)
#undef CUDNN_RNN_LAUNCHER

#define CUDNN_RNN_INSTANTIATE(T)                                                   \
  template void launch_forward_step<T>(const ForwardStep<T>&, cudaStream_t);       \
  template void launch_gru_before_gates<T>(const ForwardStep<T>&, cudaStream_t);   \
  template void launch_backward_step<T>(const BackwardStep<T>&, cudaStream_t);     \
  template void launch_gru_before_backward_b<T>(const BackwardStep<T>&, cudaStream_t);
CUDNN_RNN_INSTANTIATE(float)
CUDNN_RNN_INSTANTIATE(double)
#undef CUDNN_RNN_INSTANTIATE

}  // namespace cuda
}  // namespace cudnn_rnn
