// The generic CUDA backend's entry points (rnn_generic.cpp), called by the CUDA registration in
// rnn_cudnn.cpp for everything backend_choice does not send to cuDNN.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <vector>

#include "../rnn_config.h"

namespace cudnn_rnn {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> generic_cuda_forward(
    const RnnConfig& cfg, const at::Tensor& x, at::TensorList weights, const c10::optional<at::Tensor>& mask,
    const c10::optional<at::Tensor>& h0, const c10::optional<at::Tensor>& c0, at::TensorList dropout_masks,
    at::TensorList recurrent_dropout_masks);

std::tuple<at::Tensor, std::vector<at::Tensor>, at::Tensor, at::Tensor> generic_cuda_backward(
    const RnnConfig& cfg, const at::Tensor& grad_y, const at::Tensor& grad_h_n, const at::Tensor& grad_c_n,
    const at::Tensor& x, at::TensorList weights, const c10::optional<at::Tensor>& mask, at::TensorList dropout_masks,
    at::TensorList recurrent_dropout_masks, const at::Tensor& reserve);

}  // namespace cudnn_rnn
