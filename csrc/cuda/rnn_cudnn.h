// The cuDNN path (rnn_cudnn.cpp): a call backend_choice gave to cuDNN, run through cuDNN 9's
// RNN API. The reserve it returns is its own layout (see rnn_cudnn.cpp).
#pragma once

#include "core/rnn_config.h"
#include "cudnn_host/backend_choice.h"

namespace cudnn_rnn {

ForwardResult cudnn_forward(const RnnConfig& cfg, const BackendChoice& choice, const ForwardCall& call);
BackwardResult cudnn_backward(const RnnConfig& cfg, const BackendChoice& choice, const BackwardCall& call);

// Drops the weight spaces inference keeps across calls (rnn_cudnn.cpp).
void empty_cuda_weight_cache();

}  // namespace cudnn_rnn
