// Autograd of the cudnn_rnn ops, in C++ (the Autograd dispatch key, every device).
//
// rnn_forward's derivative is the rnn_backward op; rnn_backward itself is not differentiable
// again: differentiating through it (create_graph=True, then a second backward) raises instead
// of returning silently wrong second derivatives. Both kernels re-invoke the op below autograd;
// calls that need no graph (grad mode off, or no input that requires grad) do only that.
//
// This was a torch.library.register_autograd formula in Python; the Python path (pytree over the
// 17 arguments, a redispatch, a Python backward) cost ~0.5 ms per training step, more than the
// whole C++ computation of a small layer. torch.compile and opcheck see the same thing as before:
// an op with an Autograd kernel whose backward is another op (with a fake kernel in ops.py).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

namespace cudnn_rnn {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = c10::optional<Tensor>;

using ForwardSig = std::tuple<Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, at::TensorList, const OptTensor&, const OptTensor&, const OptTensor&, at::TensorList,
    at::TensorList, c10::string_view, c10::string_view, c10::string_view, bool, bool, int64_t, bool, bool, bool,
    bool);
using BackwardSig = std::tuple<Tensor, std::vector<Tensor>, Tensor, Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, at::TensorList, const OptTensor&, at::TensorList,
    at::TensorList, const Tensor&, c10::string_view, c10::string_view, c10::string_view, bool, bool, int64_t, bool,
    bool, bool);

const c10::TypedOperatorHandle<ForwardSig>& forward_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cudnn_rnn::rnn_forward", "").typed<ForwardSig>();
  return op;
}

const c10::TypedOperatorHandle<BackwardSig>& backward_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cudnn_rnn::rnn_backward", "").typed<BackwardSig>();
  return op;
}

bool any_requires_grad(at::TensorList ts) {
  for (const Tensor& t : ts)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

bool requires_grad(const OptTensor& t) { return t.has_value() && t->defined() && t->requires_grad(); }

// The cell configuration both ops share (cell .. zero_output_for_mask), kept in a node between
// the forward and the backward.
struct CellConfig {
  std::string cell, activation, recurrent_activation;
  bool use_bias, reset_after;
  int64_t num_layers;
  bool bidirectional, go_backwards, zero_output_for_mask;
  static constexpr int kArgs = 9;  // + need_grad: the forward op's configuration arguments

  void save(AutogradContext* ctx) const {
    auto& d = ctx->saved_data;
    d["cell"] = cell;
    d["activation"] = activation;
    d["recurrent_activation"] = recurrent_activation;
    d["use_bias"] = use_bias;
    d["reset_after"] = reset_after;
    d["num_layers"] = num_layers;
    d["bidirectional"] = bidirectional;
    d["go_backwards"] = go_backwards;
    d["zero_output_for_mask"] = zero_output_for_mask;
  }
  static CellConfig load(AutogradContext* ctx) {
    auto& d = ctx->saved_data;
    return {d["cell"].toStringRef(), d["activation"].toStringRef(), d["recurrent_activation"].toStringRef(),
            d["use_bias"].toBool(), d["reset_after"].toBool(), d["num_layers"].toInt(), d["bidirectional"].toBool(),
            d["go_backwards"].toBool(), d["zero_output_for_mask"].toBool()};
  }
};

// Second derivatives: rnn_backward under create_graph=True gets this node, whose backward refuses.
struct RnnBackwardFunction : public torch::autograd::Function<RnnBackwardFunction> {
  static variable_list forward(AutogradContext*, const Tensor& grad_y, const Tensor& grad_h_n,
                               const Tensor& grad_c_n, const Tensor& x, at::TensorList weights, const OptTensor& mask,
                               at::TensorList dropout_masks, at::TensorList recurrent_dropout_masks,
                               const Tensor& reserve, c10::string_view cell, c10::string_view activation,
                               c10::string_view recurrent_activation, bool use_bias, bool reset_after,
                               int64_t num_layers, bool bidirectional, bool go_backwards, bool zero_output_for_mask) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [grad_x, grad_weights, grad_h0, grad_c0] = backward_op().call(
        grad_y, grad_h_n, grad_c_n, x, weights, mask, dropout_masks, recurrent_dropout_masks, reserve, cell,
        activation, recurrent_activation, use_bias, reset_after, num_layers, bidirectional, go_backwards,
        zero_output_for_mask);
    variable_list out{grad_x, grad_h0, grad_c0};
    out.insert(out.end(), grad_weights.begin(), grad_weights.end());
    return out;
  }

  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK_NOT_IMPLEMENTED(false,
                                "cudnn_rnn: second derivatives (create_graph=True through an RNN, e.g. gradient "
                                "penalties or hessians) are not implemented; the first derivative is exact");
  }
};

std::tuple<Tensor, std::vector<Tensor>, Tensor, Tensor> rnn_backward_autograd(
    const Tensor& grad_y, const Tensor& grad_h_n, const Tensor& grad_c_n, const Tensor& x, at::TensorList weights,
    const OptTensor& mask, at::TensorList dropout_masks, at::TensorList recurrent_dropout_masks,
    const Tensor& reserve, c10::string_view cell, c10::string_view activation, c10::string_view recurrent_activation,
    bool use_bias, bool reset_after, int64_t num_layers, bool bidirectional, bool go_backwards,
    bool zero_output_for_mask) {
  const bool graph = at::GradMode::is_enabled() &&
                     (any_requires_grad({grad_y, grad_h_n, grad_c_n, x, reserve}) || any_requires_grad(weights) ||
                      any_requires_grad(dropout_masks) || any_requires_grad(recurrent_dropout_masks));
  if (!graph) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return backward_op().call(grad_y, grad_h_n, grad_c_n, x, weights, mask, dropout_masks, recurrent_dropout_masks,
                              reserve, cell, activation, recurrent_activation, use_bias, reset_after, num_layers,
                              bidirectional, go_backwards, zero_output_for_mask);
  }
  variable_list out = RnnBackwardFunction::apply(
      grad_y, grad_h_n, grad_c_n, x, weights, mask, dropout_masks, recurrent_dropout_masks, reserve, cell, activation,
      recurrent_activation, use_bias, reset_after, num_layers, bidirectional, go_backwards, zero_output_for_mask);
  return {out[0], std::vector<Tensor>(out.begin() + 3, out.end()), out[1], out[2]};
}

struct RnnFunction : public torch::autograd::Function<RnnFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, at::TensorList weights, const OptTensor& mask,
                               const OptTensor& h0, const OptTensor& c0, at::TensorList dropout_masks,
                               at::TensorList recurrent_dropout_masks, c10::string_view cell,
                               c10::string_view activation, c10::string_view recurrent_activation, bool use_bias,
                               bool reset_after, int64_t num_layers, bool bidirectional, bool go_backwards,
                               bool zero_output_for_mask, bool need_grad) {
    Tensor y, h_n, c_n, reserve;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(y, h_n, c_n, reserve) = forward_op().call(
          x, weights, mask, h0, c0, dropout_masks, recurrent_dropout_masks, cell, activation, recurrent_activation,
          use_bias, reset_after, num_layers, bidirectional, go_backwards, zero_output_for_mask, need_grad);
    }
    // saved: x, reserve, mask (or undefined), weights, dropout masks, recurrent dropout masks
    variable_list saved{x, reserve, mask.has_value() ? *mask : Tensor()};
    saved.insert(saved.end(), weights.begin(), weights.end());
    saved.insert(saved.end(), dropout_masks.begin(), dropout_masks.end());
    saved.insert(saved.end(), recurrent_dropout_masks.begin(), recurrent_dropout_masks.end());
    ctx->save_for_backward(saved);
    CellConfig{std::string(cell), std::string(activation), std::string(recurrent_activation), use_bias, reset_after,
               num_layers, bidirectional, go_backwards, zero_output_for_mask}
        .save(ctx);
    ctx->saved_data["n_weights"] = static_cast<int64_t>(weights.size());
    ctx->saved_data["n_dropout"] = static_cast<int64_t>(dropout_masks.size());
    ctx->saved_data["has_h0"] = h0.has_value();
    ctx->saved_data["has_c0"] = c0.has_value();
    ctx->mark_non_differentiable({reserve});
    // Unused outputs (the reserve above all) get no zero-filled gradient; backward fills in the
    // ones the kernel needs.
    ctx->set_materialize_grads(false);
    return {y, h_n, c_n, reserve};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const Tensor& x = saved[0];
    const Tensor& reserve = saved[1];
    const OptTensor mask = saved[2].defined() ? OptTensor(saved[2]) : c10::nullopt;
    const int64_t n_weights = ctx->saved_data["n_weights"].toInt();
    const int64_t n_dropout = ctx->saved_data["n_dropout"].toInt();
    const at::TensorList weights(saved.data() + 3, n_weights);
    const at::TensorList dropout_masks(saved.data() + 3 + n_weights, n_dropout);
    const at::TensorList recurrent_dropout_masks(saved.data() + 3 + n_weights + n_dropout,
                                                 saved.size() - 3 - n_weights - n_dropout);
    const CellConfig c = CellConfig::load(ctx);

    // Shapes of the outputs whose gradient did not arrive (symbolic under torch.compile).
    const c10::SymInt batch = x.sym_size(0), time = x.sym_size(1), units = weights[1].sym_size(0);
    const int64_t directions = c.bidirectional ? 2 : 1;
    const Tensor grad_y =
        grads[0].defined() ? grads[0] : at::zeros_symint({batch, time, units * directions}, x.options());
    const Tensor grad_h_n =
        grads[1].defined() ? grads[1] : at::zeros_symint({c.num_layers * directions, batch, units}, x.options());
    Tensor grad_c_n = grads[2];
    if (!grad_c_n.defined()) {
      grad_c_n = c.cell == "lstm" ? at::zeros_symint({c.num_layers * directions, batch, units}, x.options())
                                  : at::zeros({0}, x.options());
    }
    auto [grad_x, grad_weights, grad_h0, grad_c0] = backward_op().call(
        grad_y, grad_h_n, grad_c_n, x, weights, mask, dropout_masks, recurrent_dropout_masks, reserve, c.cell,
        c.activation, c.recurrent_activation, c.use_bias, c.reset_after, c.num_layers, c.bidirectional,
        c.go_backwards, c.zero_output_for_mask);

    // One gradient per forward argument, a list contributing one per tensor: x, weights..., mask,
    // h0, c0, dropout masks..., recurrent dropout masks..., then the configuration arguments.
    variable_list out{grad_x};
    out.insert(out.end(), grad_weights.begin(), grad_weights.end());
    out.push_back(Tensor());  // mask
    out.push_back(ctx->saved_data["has_h0"].toBool() ? grad_h0 : Tensor());
    out.push_back(ctx->saved_data["has_c0"].toBool() ? grad_c0 : Tensor());
    out.resize(out.size() + dropout_masks.size() + recurrent_dropout_masks.size() + CellConfig::kArgs + 1);
    return out;
  }
};

std::tuple<Tensor, Tensor, Tensor, Tensor> rnn_forward_autograd(
    const Tensor& x, at::TensorList weights, const OptTensor& mask, const OptTensor& h0, const OptTensor& c0,
    at::TensorList dropout_masks, at::TensorList recurrent_dropout_masks, c10::string_view cell,
    c10::string_view activation, c10::string_view recurrent_activation, bool use_bias, bool reset_after,
    int64_t num_layers, bool bidirectional, bool go_backwards, bool zero_output_for_mask, bool need_grad) {
  const bool graph = at::GradMode::is_enabled() &&
                     (x.requires_grad() || any_requires_grad(weights) || requires_grad(h0) || requires_grad(c0));
  if (!graph) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return forward_op().call(x, weights, mask, h0, c0, dropout_masks, recurrent_dropout_masks, cell, activation,
                             recurrent_activation, use_bias, reset_after, num_layers, bidirectional, go_backwards,
                             zero_output_for_mask, need_grad);
  }
  variable_list out = RnnFunction::apply(x, weights, mask, h0, c0, dropout_masks, recurrent_dropout_masks, cell,
                                         activation, recurrent_activation, use_bias, reset_after, num_layers,
                                         bidirectional, go_backwards, zero_output_for_mask, need_grad);
  return {out[0], out[1], out[2], out[3]};
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_rnn, Autograd, m) {
  m.impl("rnn_forward", &rnn_forward_autograd);
  m.impl("rnn_backward", &rnn_backward_autograd);
}

}  // namespace cudnn_rnn
