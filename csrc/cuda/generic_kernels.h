// The generic CUDA backend's pointwise steps (one thread per batch row and unit), launched on the
// given stream. Declared here without CUDA or ATen types beyond the stream, so the driver side
// (rnn_generic.cpp) is plain C++ and only generic_kernels.cu needs nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include "core/step_args.h"

namespace cudnn_rnn {
namespace cuda {

template <typename T>
void launch_forward_step(const ForwardStep<T>& p, cudaStream_t stream);
template <typename T>
void launch_gru_before_gates(const ForwardStep<T>& p, cudaStream_t stream);
template <typename T>
void launch_backward_step(const BackwardStep<T>& p, cudaStream_t stream);
template <typename T>
void launch_gru_before_backward_b(const BackwardStep<T>& p, cudaStream_t stream);

}  // namespace cuda
}  // namespace cudnn_rnn
