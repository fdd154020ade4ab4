// The generic CUDA backend (rnn_generic.cpp): the device-generic driver with the pointwise
// kernels of generic_kernels.cu. The CUDA registration (register.cpp) sends it every call
// backend_choice does not give to cuDNN.
#pragma once

#include "core/rnn_config.h"

namespace cudnn_rnn {

struct GenericCudaBackend {
  static ForwardResult forward(const RnnConfig& cfg, const ForwardCall& call);
  static BackwardResult backward(const RnnConfig& cfg, const BackwardCall& call);
};

}  // namespace cudnn_rnn
