// Autograd of conv_lstm_forward (every device): its derivative is the conv_lstm_backward op, as
// rnn_forward's is rnn_backward (core/autograd.cpp); second derivatives refuse.
#include <torch/autograd.h>
#include <torch/library.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include "core/conv_lstm_call.h"

#include <string>
#include <vector>

namespace cudnn_rnn {
namespace {

using at::Tensor;
using OptTensor = c10::optional<Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Tensor value(const OptTensor& t) { return t.has_value() ? *t : Tensor(); }
bool wants_grad(const Tensor& t) { return t.defined() && t.requires_grad(); }
bool wants_grad(const OptTensor& t) { return t.has_value() && wants_grad(*t); }

// What passes between forward and backward besides the differentiable tensors: the options and
// the tensors that take no gradient (the masks).
struct Options {
  ConvLstmArgs args;
  OptTensor mask, dropout_mask, recurrent_dropout_mask;
};

struct ConvLstmBackwardFunction : public torch::autograd::Function<ConvLstmBackwardFunction> {
  static variable_list forward(AutogradContext*, const Tensor& grad_y, const Tensor& grad_h_n, const Tensor& grad_c_n,
                               const Tensor& x, const Tensor& kernel, const Tensor& recurrent_kernel,
                               const OptTensor& bias, const Tensor& z, const Tensor& hs, const Tensor& cs,
                               const Options* o) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [a, b, c, d, e, f] = redispatch_conv_lstm_backward({grad_y, grad_h_n, grad_c_n, x, kernel, recurrent_kernel,
                                                             bias, o->mask, o->dropout_mask,
                                                             o->recurrent_dropout_mask, z, hs, cs, o->args});
    return {a, b, c, d, e, f};
  }

  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "cudnn_rnn: second derivatives through a ConvLSTM are not implemented; the "
                                       "first derivative is exact");
  }
};

struct ConvLstmFunction : public torch::autograd::Function<ConvLstmFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& kernel,
                               const Tensor& recurrent_kernel, const OptTensor& bias, const OptTensor& h0,
                               const OptTensor& c0, const Options* o) {
    Tensor y, h_n, c_n, z, hs, cs;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(y, h_n, c_n, z, hs, cs) = redispatch_conv_lstm_forward(
          {x, kernel, recurrent_kernel, bias, o->mask, h0, c0, o->dropout_mask, o->recurrent_dropout_mask, o->args});
    }
    ctx->save_for_backward({x, kernel, recurrent_kernel, value(bias), value(o->mask), value(o->dropout_mask),
                            value(o->recurrent_dropout_mask), z, hs, cs});
    const ConvLstmArgs& a = o->args;
    ctx->saved_data["stride"] = a.stride;
    ctx->saved_data["pad_before"] = a.pad_before;
    ctx->saved_data["pad_after"] = a.pad_after;
    ctx->saved_data["dilation"] = a.dilation;
    ctx->saved_data["activation"] = a.activation;
    ctx->saved_data["recurrent_activation"] = a.recurrent_activation;
    ctx->saved_data["go_backwards"] = a.go_backwards;
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->saved_data["has_h0"] = h0.has_value();
    ctx->saved_data["has_c0"] = c0.has_value();
    ctx->mark_non_differentiable({z, hs, cs});
    ctx->set_materialize_grads(false);
    return {y, h_n, c_n, z, hs, cs};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const Tensor &x = s[0], &hs = s[8];
    auto opt = [](const Tensor& t) { return t.defined() ? OptTensor(t) : c10::nullopt; };
    const ConvLstmArgs args{ctx->saved_data["stride"].toIntVector(), ctx->saved_data["pad_before"].toIntVector(),
                            ctx->saved_data["pad_after"].toIntVector(), ctx->saved_data["dilation"].toIntVector(),
                            ctx->saved_data["activation"].toStringRef(),
                            ctx->saved_data["recurrent_activation"].toStringRef(),
                            ctx->saved_data["go_backwards"].toBool()};
    const Tensor state = hs[0];
    Tensor grad_y = grads[0];
    if (!grad_y.defined()) {  // symbolic sizes: under torch.compile the batch and time stay dynamic
      std::vector<c10::SymInt> y_shape{x.sym_size(0), x.sym_size(1)};  // [B, T, *S', F]
      for (int64_t d = 1; d < state.dim(); ++d) y_shape.push_back(state.sym_size(d));
      grad_y = at::zeros_symint(y_shape, state.options());
    }
    const Tensor grad_h_n = grads[1].defined() ? grads[1] : at::zeros_like(state);
    const Tensor grad_c_n = grads[2].defined() ? grads[2] : at::zeros_like(state);
    auto [gx, gk, grk, gb, gh0, gc0] = redispatch_conv_lstm_backward(
        {grad_y, grad_h_n, grad_c_n, x, s[1], s[2], opt(s[3]), opt(s[4]), opt(s[5]), opt(s[6]), s[7], hs, s[9], args});
    return {gx,
            gk,
            grk,
            ctx->saved_data["has_bias"].toBool() ? gb : Tensor(),
            ctx->saved_data["has_h0"].toBool() ? gh0 : Tensor(),
            ctx->saved_data["has_c0"].toBool() ? gc0 : Tensor(),
            Tensor()};
  }
};

// The Autograd-key kernels, through the op boundary (conv_lstm_call.h).
struct AutogradKernels {
  static ConvLstmResult forward(ConvLstmForwardCall&& c) {
    const bool graph = at::GradMode::is_enabled() &&
                       (wants_grad(c.x) || wants_grad(c.kernel) || wants_grad(c.recurrent_kernel) ||
                        wants_grad(c.bias) || wants_grad(c.h0) || wants_grad(c.c0));
    if (!graph) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return redispatch_conv_lstm_forward(c);
    }
    const Options o{c.args, c.mask, c.dropout_mask, c.recurrent_dropout_mask};
    variable_list out = ConvLstmFunction::apply(c.x, c.kernel, c.recurrent_kernel, c.bias, c.h0, c.c0, &o);
    return {out[0], out[1], out[2], out[3], out[4], out[5]};
  }

  static ConvLstmResult backward(ConvLstmBackwardCall&& c) {
    const bool graph = at::GradMode::is_enabled() &&
                       (wants_grad(c.grad_y) || wants_grad(c.grad_h_n) || wants_grad(c.grad_c_n) ||
                        wants_grad(c.x) || wants_grad(c.kernel) || wants_grad(c.recurrent_kernel) ||
                        wants_grad(c.bias));
    if (!graph) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return redispatch_conv_lstm_backward(c);
    }
    const Options o{c.args, c.mask, c.dropout_mask, c.recurrent_dropout_mask};
    variable_list out = ConvLstmBackwardFunction::apply(c.grad_y, c.grad_h_n, c.grad_c_n, c.x, c.kernel,
                                                        c.recurrent_kernel, c.bias, c.z, c.hs, c.cs, &o);
    return {out[0], out[1], out[2], out[3], out[4], out[5]};
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_rnn, Autograd, m) { ConvLstmAdapter<AutogradKernels>::register_kernels(m); }

}  // namespace cudnn_rnn
