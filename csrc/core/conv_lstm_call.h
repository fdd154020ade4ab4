// The ConvLSTM op boundary, as rnn_call.h is the recurrent op's: the arguments of
// conv_lstm_forward and conv_lstm_backward (schemas in ops.cpp) as one bundle per call, and the
// one adapter that turns the dispatcher's argument list into it. Every dispatch key registers
// through ConvLstmAdapter (the device backends through ConvLstmKernels, conv_lstm.h; autograd in
// conv_lstm_autograd.cpp, which calls the ops again through redispatch_conv_lstm_*). Adding an op
// option: the schema, ConvLstmArgs, the argument lists below, the driver that reads it.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

namespace cudnn_rnn {

// The non-tensor arguments (stride .. go_backwards).
struct ConvLstmArgs {
  std::vector<int64_t> stride, pad_before, pad_after, dilation;
  std::string activation, recurrent_activation;
  bool go_backwards;
};

struct ConvLstmForwardCall {
  at::Tensor x, kernel, recurrent_kernel;
  c10::optional<at::Tensor> bias, mask, h0, c0, dropout_mask, recurrent_dropout_mask;
  ConvLstmArgs args;
};

struct ConvLstmBackwardCall {
  at::Tensor grad_y, grad_h_n, grad_c_n, x, kernel, recurrent_kernel;
  c10::optional<at::Tensor> bias, mask, dropout_mask, recurrent_dropout_mask;
  at::Tensor z, hs, cs;  // what forward returned for backward
  ConvLstmArgs args;
};

// forward: y, h_n, c_n, z, hs, cs; backward: grad_x, grad_kernel, grad_recurrent_kernel,
// grad_bias, grad_h0, grad_c0.
using ConvLstmResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// The kernels of one dispatch key from Impl::forward(ConvLstmForwardCall&&) and
// Impl::backward(ConvLstmBackwardCall&&): the only place the schemas' argument order is read.
template <class Impl>
struct ConvLstmAdapter {
  using OptTensor = c10::optional<at::Tensor>;

  static ConvLstmResult forward(const at::Tensor& x, const at::Tensor& kernel, const at::Tensor& recurrent_kernel,
                                const OptTensor& bias, const OptTensor& mask, const OptTensor& h0, const OptTensor& c0,
                                const OptTensor& dropout_mask, const OptTensor& recurrent_dropout_mask,
                                at::IntArrayRef stride, at::IntArrayRef pad_before, at::IntArrayRef pad_after,
                                at::IntArrayRef dilation, c10::string_view activation,
                                c10::string_view recurrent_activation, bool go_backwards) {
    return Impl::forward(ConvLstmForwardCall{
        x, kernel, recurrent_kernel, bias, mask, h0, c0, dropout_mask, recurrent_dropout_mask,
        {stride.vec(), pad_before.vec(), pad_after.vec(), dilation.vec(), std::string(activation),
         std::string(recurrent_activation), go_backwards}});
  }

  static ConvLstmResult backward(const at::Tensor& grad_y, const at::Tensor& grad_h_n, const at::Tensor& grad_c_n,
                                 const at::Tensor& x, const at::Tensor& kernel, const at::Tensor& recurrent_kernel,
                                 const OptTensor& bias, const OptTensor& mask, const OptTensor& dropout_mask,
                                 const OptTensor& recurrent_dropout_mask, const at::Tensor& z, const at::Tensor& hs,
                                 const at::Tensor& cs, at::IntArrayRef stride, at::IntArrayRef pad_before,
                                 at::IntArrayRef pad_after, at::IntArrayRef dilation, c10::string_view activation,
                                 c10::string_view recurrent_activation, bool go_backwards) {
    return Impl::backward(ConvLstmBackwardCall{
        grad_y, grad_h_n, grad_c_n, x, kernel, recurrent_kernel, bias, mask, dropout_mask, recurrent_dropout_mask, z,
        hs, cs,
        {stride.vec(), pad_before.vec(), pad_after.vec(), dilation.vec(), std::string(activation),
         std::string(recurrent_activation), go_backwards}});
  }

  static void register_kernels(torch::Library& m) {
    m.impl("conv_lstm_forward", &forward);
    m.impl("conv_lstm_backward", &backward);
  }
};

// The ops called with a bundle, from the current dispatch state (autograd calls them below itself).
inline ConvLstmResult redispatch_conv_lstm_forward(const ConvLstmForwardCall& c) {
  using OptTensor = c10::optional<at::Tensor>;
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cudnn_rnn::conv_lstm_forward", "")
                             .typed<ConvLstmResult(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const OptTensor&, const OptTensor&, const OptTensor&,
                                                   const OptTensor&, const OptTensor&, const OptTensor&,
                                                   at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                                                   c10::string_view, c10::string_view, bool)>();
  const ConvLstmArgs& a = c.args;
  return op.call(c.x, c.kernel, c.recurrent_kernel, c.bias, c.mask, c.h0, c.c0, c.dropout_mask,
                 c.recurrent_dropout_mask, a.stride, a.pad_before, a.pad_after, a.dilation, a.activation,
                 a.recurrent_activation, a.go_backwards);
}

inline ConvLstmResult redispatch_conv_lstm_backward(const ConvLstmBackwardCall& c) {
  using OptTensor = c10::optional<at::Tensor>;
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cudnn_rnn::conv_lstm_backward", "")
                             .typed<ConvLstmResult(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const OptTensor&, const OptTensor&, const OptTensor&,
                                                   const OptTensor&, const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, at::IntArrayRef, at::IntArrayRef,
                                                   at::IntArrayRef, at::IntArrayRef, c10::string_view,
                                                   c10::string_view, bool)>();
  const ConvLstmArgs& a = c.args;
  return op.call(c.grad_y, c.grad_h_n, c.grad_c_n, c.x, c.kernel, c.recurrent_kernel, c.bias, c.mask,
                 c.dropout_mask, c.recurrent_dropout_mask, c.z, c.hs, c.cs, a.stride, a.pad_before, a.pad_after,
                 a.dilation, a.activation, a.recurrent_activation, a.go_backwards);
}

}  // namespace cudnn_rnn
