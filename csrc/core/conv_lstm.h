// ConvLSTM (Keras ConvLSTM1D/2D/3D), device-generic: the convolutions through ATen (cuDNN on
// CUDA, oneDNN on the CPU) on channels-last tensors (Keras's layout, and for 2-D / 3-D float32
// convolutions the one those libraries run fastest), the pointwise step through the backend's
// CellSteps. Shapes and options: core/ops.cpp
// (conv_lstm_forward / conv_lstm_backward).
//
// Forward: the input convolution of every timestep as one batched convolution over [B*T, *S, C]
// (with the bias); then per step the recurrent convolution of h (padding "same", stride 1) added
// to that step's slice, and the fused cell. Where the input convolution has the recurrent one's
// geometry and the backend opts in (CellSteps::concatenated_inputs: the CPU), one convolution
// per step over x_t and h concatenated instead (oneDNN ran it 1.2x faster than the two apart;
// without an initial state the first step convolves x_t alone). Backward: per step (reversed) the
// fused cell backward and the recurrent convolution's input gradient; then the recurrent kernel's
// gradient as one convolution backward over all steps (from the second where the initial state is
// zero), and the input side (x, kernel, bias) as one more; the two kernels' gradients through the
// backend's CellSteps::weight_gradient where it has one (the CPU's own tiles).
// Dropout masks with 4 gates run each gate's convolutions on its own masked input.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "core/cell_math.h"
#include "core/conv_lstm_call.h"

namespace cudnn_rnn {
namespace conv {

using at::Tensor;
using OptTensor = c10::optional<Tensor>;

struct ConvLstmOptions {
  std::vector<int64_t> stride, pad_before, pad_after, dilation;
  Activation activation = Activation::Tanh;
  Activation recurrent_activation = Activation::Sigmoid;
  bool go_backwards = false;
};

// The op's tensors; optional ones undefined when absent.
struct ConvLstmTensors {
  Tensor x, kernel, recurrent_kernel, bias, mask, dropout_mask, recurrent_dropout_mask;
};

// The pointwise step of one backend, channels last: every state tensor is [B, *S', F] contiguous,
// except `out` and `dy` (a step of y, each batch row contiguous, rows out.stride(0) apart); zin
// is the step's slice of the input convolution [B, *S', 4F] (rows zin.stride(0) apart), r its
// recurrent convolution (undefined where zin holds both, CellSteps::concatenated_inputs) and z /
// dz [B, *S', 4F] contiguous (per pixel the four gates' F values); real (bool [B] per row or
// [B, *S'] per position, or undefined: every row real) and seen (the same shape: the row or
// position had a real step before this one) decide the masked rows or positions
// (conv_lstm_cell.h). forward keeps in z (the reserve) whatever its backward reads there: the
// pre-activations zin + r, or, where the backend fuses tanh / sigmoid cells, the activated gates.
struct CellSteps {
  void (*forward)(const Tensor& zin, const Tensor& r, const Tensor& h_prev, const Tensor& c_prev, const Tensor& real,
                  const Tensor& seen, const Tensor& z, const Tensor& h_new, const Tensor& c_new, const Tensor& out,
                  Activation activation, Activation recurrent_activation);
  void (*backward)(const Tensor& z, const Tensor& c_prev, const Tensor& c_new, const Tensor& real,
                   const Tensor& seen, const Tensor& dy, const Tensor& dh, const Tensor& dc, const Tensor& dz,
                   const Tensor& dh_prev, const Tensor& dc_prev, Activation activation,
                   Activation recurrent_activation);
  // Where the step's large arrays (z, the states, y, the gate gradients) come from: the backend's
  // allocator (the CPU's buffer pool: no page faults on memory freed by the previous call), or
  // at::empty where null.
  Tensor (*empty)(at::IntArrayRef sizes, const at::TensorOptions& options) = nullptr;
  // Whether forward may hand the cell a step's pre-activations whole (zin, r undefined), from one
  // convolution over x_t and h concatenated, where the two convolutions' geometry allows it.
  bool concatenated_inputs = false;
  // The backend's own weight (and bias) gradient of a convolution, or null: input [N, *S, C] and
  // grad [N, *S', O] channels last; the kernel's spatial size, stride, padding before and after,
  // dilation. Returns {grad_weight [O, C, *K], grad_bias [O] (when asked)}, or undefined tensors
  // where it does not take these tensors (ATen's convolution backward computes them then).
  std::tuple<Tensor, Tensor> (*weight_gradient)(const Tensor& input, const Tensor& grad, at::IntArrayRef kernel_size,
                                                at::IntArrayRef stride, at::IntArrayRef pad_before,
                                                at::IntArrayRef pad_after, at::IntArrayRef dilation,
                                                bool want_bias) = nullptr;

  Tensor make(at::IntArrayRef sizes, const at::TensorOptions& options) const {
    return empty != nullptr ? empty(sizes, options) : at::empty(sizes, options);
  }
  // t itself if contiguous, else a contiguous copy from make().
  Tensor contiguous(const Tensor& t) const {
    return t.is_contiguous() ? t : make(t.sizes(), t.options()).copy_(t);
  }
};

ConvLstmOptions make_options(at::IntArrayRef stride, at::IntArrayRef pad_before, at::IntArrayRef pad_after,
                             at::IntArrayRef dilation, c10::string_view activation,
                             c10::string_view recurrent_activation, bool go_backwards, int64_t spatial_dims);

// y, h_n, c_n, z, hs, cs
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> forward(const ConvLstmTensors& in, const OptTensor& h0,
                                                                   const OptTensor& c0, const ConvLstmOptions& o,
                                                                   const CellSteps& steps);

// grad_x, grad_kernel, grad_recurrent_kernel, grad_bias (or an empty tensor), grad_h0, grad_c0
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> backward(const Tensor& grad_y, const Tensor& grad_h_n,
                                                                    const Tensor& grad_c_n, const ConvLstmTensors& in,
                                                                    const Tensor& z, const Tensor& hs, const Tensor& cs,
                                                                    const ConvLstmOptions& o, const CellSteps& steps);

// The kernels of one dispatch key (registered through ConvLstmAdapter, conv_lstm_call.h):
// Backend::steps() gives its CellSteps.
template <class Backend>
struct ConvLstmKernels {
  static ConvLstmResult forward(ConvLstmForwardCall&& c) {
    // Under torch.autocast the convolutions inside would come back in float16 (CUDA autocast casts
    // aten::convolution): the op computes in its inputs' dtype.
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    return conv::forward(tensors_of(c.x, c.kernel, c.recurrent_kernel, c.bias, c.mask, c.dropout_mask,
                                    c.recurrent_dropout_mask),
                         c.h0, c.c0, options_of(c.args, c.x), Backend::steps());
  }

  static ConvLstmResult backward(ConvLstmBackwardCall&& c) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    return conv::backward(c.grad_y, c.grad_h_n, c.grad_c_n,
                          tensors_of(c.x, c.kernel, c.recurrent_kernel, c.bias, c.mask, c.dropout_mask,
                                     c.recurrent_dropout_mask),
                          c.z, c.hs, c.cs, options_of(c.args, c.x), Backend::steps());
  }

  static void register_kernels(torch::Library& m) { ConvLstmAdapter<ConvLstmKernels>::register_kernels(m); }

 private:
  static ConvLstmOptions options_of(const ConvLstmArgs& a, const Tensor& x) {
    return make_options(a.stride, a.pad_before, a.pad_after, a.dilation, a.activation, a.recurrent_activation,
                        a.go_backwards, x.dim() - 3);
  }
  static ConvLstmTensors tensors_of(const Tensor& x, const Tensor& kernel, const Tensor& recurrent_kernel,
                                    const OptTensor& bias, const OptTensor& mask, const OptTensor& dropout_mask,
                                    const OptTensor& recurrent_dropout_mask) {
    return {x, kernel, recurrent_kernel, bias.value_or(Tensor()), mask.value_or(Tensor()),
            dropout_mask.value_or(Tensor()), recurrent_dropout_mask.value_or(Tensor())};
  }
};

}  // namespace conv
}  // namespace cudnn_rnn
