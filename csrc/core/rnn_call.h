// The op boundary: the arguments of rnn_forward and rnn_backward (schemas in ops.cpp) as one
// bundle per direction, and the one adapter that turns the dispatcher's argument list into it.
// Every dispatch key registers through OpAdapter (device backends through Validated, which
// checks the call once with make_config); autograd saves the bundle and calls the ops again
// through redispatch_*. Adding an op option: the schema, RnnOptions, the three argument lists
// below, the backend that reads it.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/boxing/impl/make_boxed_from_unboxed_functor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace cudnn_rnn {

using OptTensor = c10::optional<at::Tensor>;

// The op's non-tensor arguments that describe the stack (cell .. zero_output_for_mask).
struct RnnOptions {
  std::string cell, activation, recurrent_activation;
  bool use_bias;
  bool reset_after;
  int64_t num_layers;
  bool bidirectional;
  bool go_backwards;
  bool zero_output_for_mask;
};

// The tensors both directions read: x [B, T, I], the weights per (layer, direction), the mask
// [B, T], and per (layer, direction) input and recurrent dropout masks (or none).
struct RnnInputs {
  at::Tensor x;
  std::vector<at::Tensor> weights;
  OptTensor mask;
  std::vector<at::Tensor> dropout_masks;
  std::vector<at::Tensor> recurrent_dropout_masks;
};

struct ForwardCall {
  RnnInputs in;
  OptTensor h0, c0;
  RnnOptions options;
  bool need_grad;  // false: no backward will run (no saved activations, cuDNN INFERENCE mode)
  // A float16 / bfloat16 call computed in float32 (driver::forward_any_precision): the caller's
  // x, for a backend that reads it in that precision; in.x is then float32. weights_low: the
  // caller's weights likewise (in.weights are their float32 copies), which a backend may pack
  // from and key a cache on.
  at::Tensor x_low = {};
  std::vector<at::Tensor> weights_low = {};
};

struct BackwardCall {
  at::Tensor grad_y, grad_h_n, grad_c_n;
  RnnInputs in;
  at::Tensor reserve;  // what rnn_forward returned: the bytes of the backend that ran it
  RnnOptions options;
  at::Tensor x_low = {};  // as ForwardCall::x_low
  std::vector<at::Tensor> weights_low = {};  // as ForwardCall::weights_low
};

using ForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;               // y, h_n, c_n, reserve
using BackwardResult = std::tuple<at::Tensor, std::vector<at::Tensor>, at::Tensor, at::Tensor>;  // dx, dweights, dh0, dc0

// A kernel registered boxed: None in a list argument becomes the empty list, then the unboxed
// function Fn runs. AOTInductor's proxy executor hands a C++ kernel an empty Tensor[] argument as
// None (its serialized empty list fills no argument slot; torch fixed the same for int lists in
// pytorch/pytorch#194324), and the unboxed adapter asserts on None; the ops' empty dropout-mask
// lists at inference are such arguments.
template <auto Fn>
void boxed_with_empty_lists(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  TORCH_INTERNAL_ASSERT(stack->size() >= args.size(), "boxed_with_empty_lists: the arguments are on the stack");
  const size_t base = stack->size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    c10::IValue& v = (*stack)[base + i];
    if (v.isNone() && args[i].type()->isSubtypeOf(*c10::ListType::ofTensors())) v = c10::List<at::Tensor>();
  }
  using Functor = typename c10::impl::WrapFunctionIntoFunctor<
      c10::CompileTimeFunctionPointer<std::remove_pointer_t<decltype(Fn)>, Fn>>::type;
  static Functor functor;
  c10::impl::make_boxed_from_unboxed_functor<Functor, false>::call(&functor, op, keys, stack);
}

// The kernels of one dispatch key, from Impl::forward(ForwardCall&&) and
// Impl::backward(BackwardCall&&): the only place the schemas' argument order is read. (The
// return type is Impl's: ForwardResult / BackwardResult for the kernels registered below; the
// Python bindings reuse the adapter for probes that return something else.)
template <class Impl>
struct OpAdapter {
  static auto forward(const at::Tensor& x, at::TensorList weights, const OptTensor& mask,
                               const OptTensor& h0, const OptTensor& c0, at::TensorList dropout_masks,
                               at::TensorList recurrent_dropout_masks, c10::string_view cell,
                               c10::string_view activation, c10::string_view recurrent_activation, bool use_bias,
                               bool reset_after, int64_t num_layers, bool bidirectional, bool go_backwards,
                               bool zero_output_for_mask, bool need_grad) {
    return Impl::forward(ForwardCall{
        {x, weights.vec(), mask, dropout_masks.vec(), recurrent_dropout_masks.vec()},
        h0,
        c0,
        {std::string(cell), std::string(activation), std::string(recurrent_activation), use_bias, reset_after,
         num_layers, bidirectional, go_backwards, zero_output_for_mask},
        need_grad});
  }

  static auto backward(const at::Tensor& grad_y, const at::Tensor& grad_h_n, const at::Tensor& grad_c_n,
                                 const at::Tensor& x, at::TensorList weights, const OptTensor& mask,
                                 at::TensorList dropout_masks, at::TensorList recurrent_dropout_masks,
                                 const at::Tensor& reserve, c10::string_view cell, c10::string_view activation,
                                 c10::string_view recurrent_activation, bool use_bias, bool reset_after,
                                 int64_t num_layers, bool bidirectional, bool go_backwards,
                                 bool zero_output_for_mask) {
    return Impl::backward(BackwardCall{
        grad_y,
        grad_h_n,
        grad_c_n,
        {x, weights.vec(), mask, dropout_masks.vec(), recurrent_dropout_masks.vec()},
        reserve,
        {std::string(cell), std::string(activation), std::string(recurrent_activation), use_bias, reset_after,
         num_layers, bidirectional, go_backwards, zero_output_for_mask}});
  }

  static void register_kernels(torch::Library& m) {
    m.impl("rnn_forward", torch::CppFunction::makeFromBoxedFunction<&boxed_with_empty_lists<&forward>>());
    m.impl("rnn_backward", torch::CppFunction::makeFromBoxedFunction<&boxed_with_empty_lists<&backward>>());
  }
};

// The ops called with a bundle, from the current dispatch state (autograd calls them below itself).
inline ForwardResult redispatch_forward(const ForwardCall& c) {
  using Signature = ForwardResult(const at::Tensor&, at::TensorList, const OptTensor&, const OptTensor&,
                                  const OptTensor&, at::TensorList, at::TensorList, c10::string_view,
                                  c10::string_view, c10::string_view, bool, bool, int64_t, bool, bool, bool, bool);
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cudnn_rnn::rnn_forward", "").typed<Signature>();
  const RnnOptions& o = c.options;
  return op.call(c.in.x, c.in.weights, c.in.mask, c.h0, c.c0, c.in.dropout_masks, c.in.recurrent_dropout_masks,
                 o.cell, o.activation, o.recurrent_activation, o.use_bias, o.reset_after, o.num_layers,
                 o.bidirectional, o.go_backwards, o.zero_output_for_mask, c.need_grad);
}

inline BackwardResult redispatch_backward(const BackwardCall& c) {
  using Signature = BackwardResult(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   at::TensorList, const OptTensor&, at::TensorList, at::TensorList,
                                   const at::Tensor&, c10::string_view, c10::string_view, c10::string_view, bool,
                                   bool, int64_t, bool, bool, bool);
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cudnn_rnn::rnn_backward", "").typed<Signature>();
  const RnnOptions& o = c.options;
  return op.call(c.grad_y, c.grad_h_n, c.grad_c_n, c.in.x, c.in.weights, c.in.mask, c.in.dropout_masks,
                 c.in.recurrent_dropout_masks, c.reserve, o.cell, o.activation, o.recurrent_activation, o.use_bias,
                 o.reset_after, o.num_layers, o.bidirectional, o.go_backwards, o.zero_output_for_mask);
}

}  // namespace cudnn_rnn
