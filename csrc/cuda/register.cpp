// The CUDA registration of the ops: each call checked once (Validated), then cuDNN where
// backend_choice says so and the generic CUDA backend otherwise, counted (a silent fallback is
// a bug: cudnn_fallback_count makes it visible). Also what this CUDA build was compiled with.
#include <c10/cuda/CUDAGuard.h>
#include <cudnn.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <atomic>
#include <map>
#include <string>

#include "core/build_info.h"
#include "core/rnn_config.h"
#include "cuda/rnn_cudnn.h"
#include "cuda/rnn_generic.h"
#include "cudnn_host/backend_choice.h"

namespace cudnn_rnn {
namespace {

std::atomic<int64_t>& fallback_counter() {
  static std::atomic<int64_t> n{0};
  return n;
}

BackendChoice choose(const RnnConfig& cfg, const RnnInputs& in) {
  c10::optional<at::Tensor> mask_cpu;
  if (in.mask.has_value()) mask_cpu = in.mask->to(at::kCPU);  // lengths go to cuDNN as a host array
  return choose_backend(cfg, mask_cpu, in.dropout_masks, in.recurrent_dropout_masks, in.x.scalar_type(),
                        static_cast<int64_t>(cudnnGetVersion()));
}

struct CudaBackend {
  static ForwardResult forward(const RnnConfig& cfg, const ForwardCall& call) {
    c10::cuda::CUDAGuard guard(call.in.x.device());
    const BackendChoice choice = choose(cfg, call.in);
    if (!choice.cudnn) {
      fallback_counter()++;
      return GenericCudaBackend::forward(cfg, call);
    }
    return cudnn_forward(cfg, choice, call);
  }
  static BackwardResult backward(const RnnConfig& cfg, const BackwardCall& call) {
    c10::cuda::CUDAGuard guard(call.in.x.device());
    const BackendChoice choice = choose(cfg, call.in);
    if (!choice.cudnn) return GenericCudaBackend::backward(cfg, call);
    return cudnn_backward(cfg, choice, call);
  }
};

}  // namespace

int64_t cudnn_fallback_count() { return fallback_counter().load(); }

void empty_accelerator_caches() { empty_cuda_weight_cache(); }

std::map<std::string, std::string> accelerator_build_info() {
  return {{"cuda", std::to_string(CUDART_VERSION)},
          {"cudnn", std::to_string(CUDNN_VERSION)},
          {"cudnn_runtime", std::to_string(cudnnGetVersion())}};
}

TORCH_LIBRARY_IMPL(cudnn_rnn, CUDA, m) { OpAdapter<Validated<CudaBackend>>::register_kernels(m); }

}  // namespace cudnn_rnn
