// CPU emulation of the generic CUDA backend (kernel_emulation.cpp), for tests.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <vector>

#include "rnn_config.h"

namespace cudnn_rnn {

// order: the element ("thread") order, 0 ascending, 1 descending, 2 shuffled.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> emulated_generic_forward(
    int64_t order, const RnnConfig& cfg, const at::Tensor& x, at::TensorList weights,
    const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& h0, const c10::optional<at::Tensor>& c0,
    at::TensorList dropout_masks, at::TensorList recurrent_dropout_masks);

std::tuple<at::Tensor, std::vector<at::Tensor>, at::Tensor, at::Tensor> emulated_generic_backward(
    int64_t order, const RnnConfig& cfg, const at::Tensor& grad_y, const at::Tensor& grad_h_n,
    const at::Tensor& grad_c_n, const at::Tensor& x, at::TensorList weights, const c10::optional<at::Tensor>& mask,
    at::TensorList dropout_masks, at::TensorList recurrent_dropout_masks, const at::Tensor& reserve);

}  // namespace cudnn_rnn
