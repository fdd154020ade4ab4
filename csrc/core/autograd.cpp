// Autograd of the cudnn_rnn ops, in C++ (the Autograd dispatch key, every device).
//
// rnn_forward's derivative is the rnn_backward op; rnn_backward itself is not differentiable
// again: differentiating through it (create_graph=True, then a second backward) raises instead
// of returning silently wrong second derivatives. Both kernels get the call as one bundle
// (rnn_call.h) and re-invoke the op below autograd with it; calls that need no graph (grad mode
// off, or no input that requires grad) do only that. The node keeps the bundle's tensors as
// saved variables and its options as they came, so an op option is never restated here.
//
// (A torch.library.register_autograd formula in Python cost ~0.5 ms per training step, more than
// the whole C++ computation of a small layer; torch.compile and opcheck see the same thing: an
// op with an Autograd kernel whose backward is another op, with a fake kernel in ops.py.)
#include <torch/autograd.h>
#include <torch/library.h>

#include <utility>
#include <vector>

#include "core/rnn_call.h"

namespace cudnn_rnn {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool any_requires_grad(at::TensorList ts) {
  for (const Tensor& t : ts)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

bool requires_grad(const OptTensor& t) { return t.has_value() && t->defined() && t->requires_grad(); }

// (Lists go to Function::apply as at::TensorList: a std::vector would be taken for a
// non-tensor argument and get no edges.)

// The options of a call, kept in a node between its forward and its backward.
struct SavedOptions : torch::CustomClassHolder {
  explicit SavedOptions(RnnOptions o) : options(std::move(o)) {}
  RnnOptions options;
};

void save_options(AutogradContext* ctx, const RnnOptions& options) {
  ctx->saved_data["options"] = c10::IValue::make_capsule(c10::make_intrusive<SavedOptions>(options));
}

const RnnOptions& saved_options(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<SavedOptions>(ctx->saved_data["options"].toCapsule())->options;
}

// Second derivatives: rnn_backward under create_graph=True gets this node, whose backward refuses.
struct RnnBackwardFunction : public torch::autograd::Function<RnnBackwardFunction> {
  // The tensors are listed so that autograd connects the node to them; the call holds them too.
  static variable_list forward(AutogradContext*, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               at::TensorList, at::TensorList, at::TensorList, const Tensor&,
                               const BackwardCall* call) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [grad_x, grad_weights, grad_h0, grad_c0] = redispatch_backward(*call);
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

struct RnnFunction : public torch::autograd::Function<RnnFunction> {
  // x, weights, h0 and c0 are the differentiable inputs (listed so that autograd connects the
  // node to them); the call holds them and everything else.
  static variable_list forward(AutogradContext* ctx, const Tensor&, at::TensorList, const OptTensor&,
                               const OptTensor&, const ForwardCall* call) {
    const RnnInputs& in = call->in;
    Tensor y, h_n, c_n, reserve;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(y, h_n, c_n, reserve) = redispatch_forward(*call);
    }
    // saved: x, reserve, mask (or undefined), weights, dropout masks, recurrent dropout masks
    variable_list saved{in.x, reserve, in.mask.has_value() ? *in.mask : Tensor()};
    saved.insert(saved.end(), in.weights.begin(), in.weights.end());
    saved.insert(saved.end(), in.dropout_masks.begin(), in.dropout_masks.end());
    saved.insert(saved.end(), in.recurrent_dropout_masks.begin(), in.recurrent_dropout_masks.end());
    ctx->save_for_backward(saved);
    save_options(ctx, call->options);
    ctx->saved_data["n_weights"] = static_cast<int64_t>(in.weights.size());
    ctx->saved_data["n_dropout"] = static_cast<int64_t>(in.dropout_masks.size());
    ctx->saved_data["has_h0"] = call->h0.has_value();
    ctx->saved_data["has_c0"] = call->c0.has_value();
    ctx->mark_non_differentiable({reserve});
    // Unused outputs (the reserve above all) get no zero-filled gradient; backward fills in the
    // ones the kernel needs.
    ctx->set_materialize_grads(false);
    return {y, h_n, c_n, reserve};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const int64_t n_weights = ctx->saved_data["n_weights"].toInt();
    const int64_t n_dropout = ctx->saved_data["n_dropout"].toInt();
    const auto first = saved.begin();
    BackwardCall call{Tensor(), Tensor(), Tensor(),
                      RnnInputs{saved[0], std::vector<Tensor>(first + 3, first + 3 + n_weights),
                                saved[2].defined() ? OptTensor(saved[2]) : c10::nullopt,
                                std::vector<Tensor>(first + 3 + n_weights, first + 3 + n_weights + n_dropout),
                                std::vector<Tensor>(first + 3 + n_weights + n_dropout, saved.end())},
                      saved[1], saved_options(ctx)};
    const RnnOptions& o = call.options;
    const Tensor& x = call.in.x;

    // Shapes of the outputs whose gradient did not arrive (symbolic under torch.compile).
    const c10::SymInt batch = x.sym_size(0), time = x.sym_size(1), units = call.in.weights[1].sym_size(0);
    const int64_t directions = o.bidirectional ? 2 : 1;
    const c10::SymInt stacks = c10::SymInt(o.num_layers * directions);
    call.grad_y = grads[0].defined() ? grads[0] : at::zeros_symint({batch, time, units * directions}, x.options());
    call.grad_h_n = grads[1].defined() ? grads[1] : at::zeros_symint({stacks, batch, units}, x.options());
    call.grad_c_n = grads[2].defined() ? grads[2]
                    : o.cell == "lstm"  ? at::zeros_symint({stacks, batch, units}, x.options())
                                        : at::zeros({0}, x.options());
    auto [grad_x, grad_weights, grad_h0, grad_c0] = redispatch_backward(call);

    // One gradient per forward argument, a list contributing one per tensor: x, weights..., h0,
    // c0, then the call.
    variable_list out{grad_x};
    out.insert(out.end(), grad_weights.begin(), grad_weights.end());
    out.push_back(ctx->saved_data["has_h0"].toBool() ? grad_h0 : Tensor());
    out.push_back(ctx->saved_data["has_c0"].toBool() ? grad_c0 : Tensor());
    out.push_back(Tensor());
    return out;
  }
};

struct AutogradKernels {
  static ForwardResult forward(ForwardCall&& call) {
    const RnnInputs& in = call.in;
    const bool graph = at::GradMode::is_enabled() && (in.x.requires_grad() || any_requires_grad(in.weights) ||
                                                      requires_grad(call.h0) || requires_grad(call.c0));
    if (!graph) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return redispatch_forward(call);
    }
    variable_list out = RnnFunction::apply(in.x, at::TensorList(in.weights), call.h0, call.c0, &call);
    return {out[0], out[1], out[2], out[3]};
  }

  static BackwardResult backward(BackwardCall&& call) {
    const RnnInputs& in = call.in;
    const bool graph = at::GradMode::is_enabled() &&
                       (any_requires_grad({call.grad_y, call.grad_h_n, call.grad_c_n, in.x, call.reserve}) ||
                        any_requires_grad(in.weights) || any_requires_grad(in.dropout_masks) ||
                        any_requires_grad(in.recurrent_dropout_masks));
    if (!graph) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return redispatch_backward(call);
    }
    variable_list out = RnnBackwardFunction::apply(
        call.grad_y, call.grad_h_n, call.grad_c_n, in.x, at::TensorList(in.weights),
        at::TensorList(in.dropout_masks), at::TensorList(in.recurrent_dropout_masks), call.reserve, &call);
    return {out[0], std::vector<Tensor>(out.begin() + 3, out.end()), out[1], out[2]};
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_rnn, Autograd, m) { OpAdapter<AutogradKernels>::register_kernels(m); }

}  // namespace cudnn_rnn
