#include "core/conv_lstm.h"

#include <c10/util/Exception.h>

#include <string>
#include <utility>

#include "core/rnn_config.h"

namespace cudnn_rnn {
namespace conv {
namespace {

std::vector<int64_t> checked_list(at::IntArrayRef v, int64_t n, int64_t lo, const char* name) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(v.size()) == n, name, " must hold ", n, " values (one per spatial "
                    "dimension); got ", v.size());
  for (int64_t e : v) TORCH_CHECK_VALUE(e >= lo && e <= (int64_t(1) << 20), name, " values must be in [", lo,
                                        ", 2^20]; got ", v);
  return v.vec();
}

// t with the strides of a fresh contiguous tensor of its sizes, the same memory. A tensor with a
// dimension of size 1 counts as contiguous under several strides (that dimension's stride is
// never used), and ATen's float32 CPU convolution (torch 2.14, oneDNN) computes wrongly when a
// one-channel input or weight carries a channel stride of 1 (a permuted view, or what
// contiguous(ChannelsLast) makes): a ConvLSTM2D with strides (1, 2) on a one-channel input was off
// by up to 1.1, by a different amount on every run (it read memory it does not own). Given
// standard strides for both, it computes what float64 does.
Tensor standard_strides(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<int64_t> strides(c.dim(), 1);
  for (int64_t d = c.dim() - 1; d > 0; --d) strides[d - 1] = strides[d] * c.size(d);
  return c.as_strided(c.sizes(), strides, c.storage_offset());
}

// A convolution on channels-last tensors [N, *S, C] (Keras's layout, and the memory format
// oneDNN and cuDNN run fastest: ATen sees them as channels_last views of [N, C, *S]), with Keras's
// (possibly asymmetric) padding: symmetric padding goes to the convolution itself, the rest is
// padded onto the input first.
struct Conv {
  std::vector<int64_t> stride, pad_before, pad_after, dilation;

  bool symmetric() const { return pad_before == pad_after; }

  // [N, *S, C] -> the [N, C, *S] view ATen convolves; and back (contiguous).
  // One channel: the same memory is also a plain contiguous [N, 1, *S], and is given with its
  // standard strides (standard_strides, as the weights are by conv_weight).
  static Tensor channels_first_view(const Tensor& t) {
    if (t.size(-1) == 1) {
      std::vector<int64_t> sizes{t.size(0), 1};
      for (int64_t d = 1; d < t.dim() - 1; ++d) sizes.push_back(t.size(d));
      return standard_strides(t.reshape(sizes));
    }
    std::vector<int64_t> order{0, t.dim() - 1};
    for (int64_t d = 1; d < t.dim() - 1; ++d) order.push_back(d);
    return t.permute(order);
  }
  static Tensor channels_last(const Tensor& t) {
    std::vector<int64_t> order{0};
    for (int64_t d = 2; d < t.dim(); ++d) order.push_back(d);
    order.push_back(1);
    return t.permute(order).contiguous();
  }

  Tensor padded(const Tensor& input) const {  // input [N, *S, C]
    if (symmetric()) return input;
    std::vector<int64_t> pads{0, 0};  // last dimension (channels) first
    for (size_t d = pad_before.size(); d-- > 0;) {
      pads.push_back(pad_before[d]);
      pads.push_back(pad_after[d]);
    }
    return at::constant_pad_nd(input, pads, 0);
  }

  std::vector<int64_t> padding() const {
    return symmetric() ? pad_before : std::vector<int64_t>(pad_before.size(), 0);
  }

  // [N, *S, C] -> [N, *S', O]
  Tensor operator()(const Tensor& input, const Tensor& weight, const Tensor& bias) const {
    const std::vector<int64_t> zeros(stride.size(), 0);
    return channels_last(at::convolution(channels_first_view(padded(input)), weight,
                                         bias.defined() ? c10::optional<Tensor>(bias) : c10::nullopt, stride,
                                         padding(), dilation, false, zeros, 1));
  }

  // Gradients of (input [N, *S, C], weight, bias) from grad [N, *S', O], for the outputs asked for.
  std::tuple<Tensor, Tensor, Tensor> backward(const Tensor& grad, const Tensor& input, const Tensor& weight,
                                              bool want_input, bool want_weight, bool want_bias) const {
    const std::vector<int64_t> zeros(stride.size(), 0);
    const std::vector<int64_t> bias_sizes{weight.size(0)};
    auto [gi, gw, gb] = at::convolution_backward(
        channels_first_view(grad), channels_first_view(padded(input)), weight,
        want_bias ? c10::OptionalIntArrayRef(bias_sizes) : c10::nullopt, stride, padding(), dilation, false, zeros, 1,
        {want_input, want_weight, want_bias});
    if (want_input) {
      gi = channels_last(gi);
      if (!symmetric()) {
        for (size_t d = 0; d < pad_before.size(); ++d) gi = gi.narrow(1 + d, pad_before[d], input.size(1 + d));
        gi = gi.contiguous();
      }
    }
    return {gi, gw, gb};
  }

  // The weight (and bias) gradient from the backend's own kernel (CellSteps::weight_gradient), or
  // undefined tensors where it has none for these tensors.
  std::tuple<Tensor, Tensor> own_weight_gradient(const Tensor& grad, const Tensor& input, const Tensor& weight,
                                                 bool want_bias, const CellSteps& steps) const {
    if (steps.weight_gradient == nullptr) return {};
    return steps.weight_gradient(input, grad, weight.sizes().slice(2), stride, pad_before, pad_after, dilation,
                                 want_bias);
  }
};

struct Dims {
  int64_t B, T, C, F;
  std::vector<int64_t> S, Sp;  // input and state spatial sizes
  int64_t input_groups, recurrent_groups;  // dropout mask gates: 1 or 4

  // lead..., *spatial, last
  std::vector<int64_t> shape(std::initializer_list<int64_t> lead, const std::vector<int64_t>& spatial,
                             int64_t last) const {
    std::vector<int64_t> out(lead);
    out.insert(out.end(), spatial.begin(), spatial.end());
    out.push_back(last);
    return out;
  }
};

Conv recurrent_conv(const Tensor& recurrent_kernel) {
  Conv c;
  for (int64_t d = 2; d < recurrent_kernel.dim(); ++d) {
    const int64_t total = recurrent_kernel.size(d) - 1;  // "same", stride 1
    c.stride.push_back(1);
    c.dilation.push_back(1);
    c.pad_before.push_back(total / 2);
    c.pad_after.push_back(total - total / 2);
  }
  return c;
}

void check_tensor(const Tensor& t, const Tensor& x, const char* name, const std::vector<int64_t>& shape) {
  TORCH_CHECK_VALUE(t.sizes().vec() == shape, name, " must have shape ", at::IntArrayRef(shape), "; got ", t.sizes());
  TORCH_CHECK_TYPE(t.scalar_type() == x.scalar_type(), name, " must be ", x.scalar_type(), " like x; got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == x.device(), name, " must be on ", x.device(), " like x; got ", t.device());
}

void check_mask_tensor(const Tensor& m, const Tensor& x, const char* name, int64_t B, int64_t width,
                       const std::vector<int64_t>& spatial) {
  const int64_t nd = static_cast<int64_t>(spatial.size());
  TORCH_CHECK_VALUE(m.dim() == nd + 3 && (m.size(0) == 1 || m.size(0) == 4) && (m.size(1) == 1 || m.size(1) == B) &&
                        m.sizes().slice(2, nd).vec() == spatial && m.size(-1) == width,
                    name, " must have shape (1 or 4, 1 or ", B, ", ", at::IntArrayRef(spatial), ", ", width,
                    "); got ", m.sizes());
  check_tensor(m, x, name, m.sizes().vec());
}

Dims check(const ConvLstmTensors& in, const OptTensor& h0, const OptTensor& c0, const ConvLstmOptions& o) {
  const Tensor& x = in.x;
  TORCH_CHECK_VALUE(x.dim() >= 4 && x.dim() <= 6, "x must have shape (batch, time, *spatial, channels) with 1 to 3 "
                    "spatial dimensions; got ", x.sizes());
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
                   "x must be float32 or float64; got ", x.scalar_type());
  const int64_t nd = x.dim() - 3;
  Dims d;
  d.B = x.size(0);
  d.T = x.size(1);
  d.C = x.size(-1);
  d.S = x.sizes().slice(2, nd).vec();
  TORCH_CHECK_VALUE(d.B > 0 && d.T > 0 && d.C > 0, "x must have batch, time and channels > 0; got ", x.sizes());
  const Tensor& k = in.kernel;
  TORCH_CHECK_VALUE(k.dim() == nd + 2 && k.size(0) > 0 && k.size(0) % 4 == 0 && k.size(1) == d.C,
                    "kernel must have shape (4 * filters, ", d.C, ", *kernel_size) with ", nd, " kernel sizes; got ",
                    k.sizes());
  d.F = k.size(0) / 4;
  check_tensor(k, x, "kernel", k.sizes().vec());
  const Tensor& rk = in.recurrent_kernel;
  TORCH_CHECK_VALUE(rk.dim() == nd + 2 && rk.size(0) == 4 * d.F && rk.size(1) == d.F,
                    "recurrent_kernel must have shape (", 4 * d.F, ", ", d.F, ", *kernel_size); got ", rk.sizes());
  check_tensor(rk, x, "recurrent_kernel", rk.sizes().vec());
  if (in.bias.defined()) check_tensor(in.bias, x, "bias", {4 * d.F});
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t span = o.dilation[i] * (k.size(2 + i) - 1) + 1;
    const int64_t padded = d.S[i] + o.pad_before[i] + o.pad_after[i];
    TORCH_CHECK_VALUE(padded >= span, "x's spatial size ", d.S[i], " (padded ", padded, ") is smaller than the "
                      "kernel's dilated extent ", span, " in spatial dimension ", i);
    d.Sp.push_back((padded - span) / o.stride[i] + 1);
  }
  if (in.mask.defined()) {
    // [B, T] (per sequence step), or [B, T, *S'] (per output position: Keras's Masking before a
    // ConvLSTM masks pixels)
    std::vector<int64_t> per_position{d.B, d.T};
    per_position.insert(per_position.end(), d.Sp.begin(), d.Sp.end());
    const bool per_step = in.mask.dim() == 2 && in.mask.size(0) == d.B && in.mask.size(1) == d.T;
    TORCH_CHECK_VALUE(per_step || in.mask.sizes() == at::IntArrayRef(per_position), "mask must have shape (", d.B,
                      ", ", d.T, ") or ", at::IntArrayRef(per_position),
                      " (batch, time, the output's positions); got ", in.mask.sizes());
    TORCH_CHECK_TYPE(in.mask.scalar_type() == at::kBool, "mask must be bool; got ", in.mask.scalar_type());
    TORCH_CHECK_VALUE(in.mask.device() == x.device(), "mask must be on ", x.device(), "; got ", in.mask.device());
  }
  const std::vector<int64_t> state = d.shape({d.B}, d.Sp, d.F);
  if (h0.has_value()) check_tensor(*h0, x, "h0", state);
  if (c0.has_value()) check_tensor(*c0, x, "c0", state);
  d.input_groups = d.recurrent_groups = 1;
  if (in.dropout_mask.defined()) {
    check_mask_tensor(in.dropout_mask, x, "dropout_mask", d.B, d.C, d.S);
    d.input_groups = in.dropout_mask.size(0);
  }
  if (in.recurrent_dropout_mask.defined()) {
    check_mask_tensor(in.recurrent_dropout_mask, x, "recurrent_dropout_mask", d.B, d.F, d.Sp);
    d.recurrent_groups = in.recurrent_dropout_mask.size(0);
  }
  return d;
}

// Whether a CPU tensor is zero everywhere, or finite everywhere (read only on the CPU: elsewhere
// it would wait for the device). A zero state's products are skipped only where every value they
// meet is finite: 0 * inf and 0 * nan are nan, which the products would have passed on.
bool zero_on_cpu(const Tensor& t) { return t.is_cpu() && !t.any().item<bool>(); }
bool finite_on_cpu(const Tensor& t) { return t.is_cpu() && at::isfinite(t).all().item<bool>(); }

Conv input_conv(const ConvLstmOptions& o) { return Conv{o.stride, o.pad_before, o.pad_after, o.dilation}; }

// A kernel as the convolutions read it: channels_last for 2-D / 3-D (the inputs are; otherwise
// ATen re-lays the weight out at every call, i.e. every step), contiguous otherwise; a kernel of
// one input channel with standard strides, as its input is (standard_strides).
Tensor conv_weight(const Tensor& w) {
  if (w.size(1) == 1) return standard_strides(w);
  if (w.dim() == 4) return w.contiguous(at::MemoryFormat::ChannelsLast);
  if (w.dim() == 5) return w.contiguous(at::MemoryFormat::ChannelsLast3d);
  return w.contiguous();
}

// x of gate group k as its convolution reads it: [B*T, *S, C], the dropout mask applied.
Tensor input_of_group(const Tensor& x, const Tensor& dropout_mask, int64_t k, const Dims& d) {
  Tensor xk = dropout_mask.defined() ? x * dropout_mask[k].unsqueeze(1) : x;
  return xk.reshape(d.shape({d.B * d.T}, d.S, d.C));
}

// Step s's state and mask tensors: the real rows (or positions) of time step t, and whether each
// had a real step before s (processing order).
struct StepMasks {
  Tensor real_by_step;  // [T, B] or [T, B, *S'] bool, processing order
  Tensor seen_before;   // the same shape
};

StepMasks step_masks(const Tensor& mask, bool go_backwards) {
  if (!mask.defined()) return {};
  Tensor by_step = (go_backwards ? mask.flip(1) : mask).transpose(0, 1).contiguous();  // [T, B (, *S')]
  Tensor seen = by_step.to(at::kInt).cumsum(0).sub_(by_step.to(at::kInt)).gt(0).contiguous();
  return {by_step, seen};
}

// What forward() returns besides the final states, from the backend's allocator: z [T, B, *S', 4F],
// hs and cs [T + 1, B, *S', F] (slot 0 the initial states), y [B, T, *S', F].
std::tuple<Tensor, Tensor, Tensor, Tensor> forward_arrays(const Dims& d, const OptTensor& h0, const OptTensor& c0,
                                                          const at::TensorOptions& opts, const CellSteps& steps) {
  const int64_t B = d.B, T = d.T, F = d.F;
  Tensor z = steps.make(d.shape({T, B}, d.Sp, 4 * F), opts);
  Tensor hs = steps.make(d.shape({T + 1, B}, d.Sp, F), opts);
  Tensor cs = steps.make(d.shape({T + 1, B}, d.Sp, F), opts);
  Tensor y = steps.make(d.shape({B, T}, d.Sp, F), opts);
  if (h0.has_value()) hs[0].copy_(*h0); else hs[0].zero_();
  if (c0.has_value()) cs[0].copy_(*c0); else cs[0].zero_();
  return {z, hs, cs, y};
}

// Whether a step's two convolutions can be one, over x_t and h concatenated along the channels:
// the backend opts in, the input convolution has the recurrent one's geometry (stride 1,
// dilation 1, Keras's "same" padding, the same kernel size: the usual ConvLSTM) and no dropout
// mask is per gate.
bool one_convolution_per_step(const ConvLstmTensors& in, const ConvLstmOptions& o, const Dims& d, const Conv& rec,
                              const CellSteps& steps) {
  if (!steps.concatenated_inputs || d.input_groups != 1 || d.recurrent_groups != 1) return false;
  if (o.stride != rec.stride || o.dilation != rec.dilation || o.pad_before != rec.pad_before ||
      o.pad_after != rec.pad_after) {
    return false;
  }
  return in.kernel.sizes().slice(2) == in.recurrent_kernel.sizes().slice(2);
}

// forward() with one convolution per step: [x_t, h_prev] (each with its dropout mask) in a
// [B, *S, C + F] buffer, convolved with [kernel, recurrent_kernel] and the bias into the step's
// pre-activations; the cell reads them alone (CellSteps::forward with r undefined). What it
// returns, z included, is what forward() returns.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> forward_concatenated(
    const ConvLstmTensors& in, const OptTensor& h0, const OptTensor& c0, const ConvLstmOptions& o, const Dims& d,
    const Conv& rec, const CellSteps& steps) {
  const Tensor x = in.x.contiguous();
  const auto opts = x.options();
  const int64_t B = d.B, T = d.T, C = d.C, F = d.F;
  const Tensor weight = conv_weight(at::cat({in.kernel, in.recurrent_kernel}, 1));
  // Without an initial state, h is zero at the first step: the kernel alone convolves x there.
  const Tensor first_weight =
      h0.has_value() || !finite_on_cpu(in.recurrent_kernel) ? Tensor() : conv_weight(in.kernel);
  const Tensor xin = in.dropout_mask.defined() ? x * in.dropout_mask[0].unsqueeze(1) : x;
  Tensor xh = steps.make(d.shape({B}, d.S, C + F), opts);
  auto [z, hs, cs, y] = forward_arrays(d, h0, c0, opts, steps);
  const StepMasks masks = step_masks(in.mask, o.go_backwards);
  for (int64_t s = 0; s < T; ++s) {
    const int64_t t = o.go_backwards ? T - 1 - s : s;
    const Tensor h_prev = hs[s];
    Tensor pre;
    if (s == 0 && first_weight.defined()) {
      pre = rec(xin.select(1, t).contiguous(), first_weight, in.bias);
    } else {
      xh.narrow(-1, 0, C).copy_(xin.select(1, t));
      if (in.recurrent_dropout_mask.defined()) {
        Tensor h_part = xh.narrow(-1, C, F);
        at::mul_out(h_part, h_prev, in.recurrent_dropout_mask[0]);
      } else {
        xh.narrow(-1, C, F).copy_(h_prev);
      }
      pre = rec(xh, weight, in.bias);
    }
    const Tensor real = in.mask.defined() ? masks.real_by_step[s] : Tensor();
    const Tensor seen = in.mask.defined() ? masks.seen_before[s] : Tensor();
    steps.forward(pre, Tensor(), h_prev, cs[s], real, seen, z[s], hs[s + 1], cs[s + 1], y.select(1, s),
                  o.activation, o.recurrent_activation);
  }
  return {y, hs[T].clone(), cs[T].clone(), z, hs, cs};
}

}  // namespace

ConvLstmOptions make_options(at::IntArrayRef stride, at::IntArrayRef pad_before, at::IntArrayRef pad_after,
                             at::IntArrayRef dilation, c10::string_view activation,
                             c10::string_view recurrent_activation, bool go_backwards, int64_t spatial_dims) {
  ConvLstmOptions o;
  const int64_t nd = std::max<int64_t>(spatial_dims, 0);
  o.stride = checked_list(stride, nd, 1, "stride");
  o.pad_before = checked_list(pad_before, nd, 0, "pad_before");
  o.pad_after = checked_list(pad_after, nd, 0, "pad_after");
  o.dilation = checked_list(dilation, nd, 1, "dilation");
  o.activation = parse_activation(std::string(activation), "activation");
  o.recurrent_activation = parse_activation(std::string(recurrent_activation), "recurrent_activation");
  o.go_backwards = go_backwards;
  return o;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> forward(const ConvLstmTensors& in, const OptTensor& h0,
                                                                   const OptTensor& c0, const ConvLstmOptions& o,
                                                                   const CellSteps& steps) {
  const Dims d = check(in, h0, c0, o);
  const Tensor x = in.x.contiguous();
  const auto opts = x.options();
  const int64_t B = d.B, T = d.T, F = d.F, G = 4 * F;
  const Conv conv_in = input_conv(o), conv_rec = recurrent_conv(in.recurrent_kernel);
  const Tensor kernel = conv_weight(in.kernel), recurrent = conv_weight(in.recurrent_kernel);
  if (one_convolution_per_step(in, o, d, conv_rec, steps)) return forward_concatenated(in, h0, c0, o, d, conv_rec, steps);

  // Every timestep's input convolution at once, [B, T, *S', 4F].
  Tensor zin;
  if (d.input_groups == 1) {
    zin = conv_in(input_of_group(x, in.dropout_mask, 0, d), kernel, in.bias).view(d.shape({B, T}, d.Sp, G));
  } else {
    zin = at::empty(d.shape({B, T}, d.Sp, G), opts);
    for (int64_t k = 0; k < 4; ++k) {
      const Tensor bk = in.bias.defined() ? in.bias.narrow(0, k * F, F) : Tensor();
      zin.narrow(-1, k * F, F).copy_(conv_in(input_of_group(x, in.dropout_mask, k, d), kernel.narrow(0, k * F, F), bk)
                                         .view(d.shape({B, T}, d.Sp, F)));
    }
  }

  auto [z, hs, cs, y] = forward_arrays(d, h0, c0, opts, steps);
  const StepMasks masks = step_masks(in.mask, o.go_backwards);
  const int64_t Gr = d.recurrent_groups, wr = G / Gr;
  Tensor r_groups = Gr > 1 ? at::empty(d.shape({B}, d.Sp, G), opts) : Tensor();

  for (int64_t s = 0; s < T; ++s) {
    const int64_t t = o.go_backwards ? T - 1 - s : s;
    const Tensor h_prev = hs[s];
    Tensor r;
    if (Gr == 1) {
      r = conv_rec(in.recurrent_dropout_mask.defined() ? h_prev * in.recurrent_dropout_mask[0] : h_prev, recurrent,
                   Tensor());
    } else {
      for (int64_t k = 0; k < Gr; ++k) {
        r_groups.narrow(-1, k * wr, wr)
            .copy_(conv_rec(h_prev * in.recurrent_dropout_mask[k], recurrent.narrow(0, k * wr, wr), Tensor()));
      }
      r = r_groups;
    }
    const Tensor real = in.mask.defined() ? masks.real_by_step[s] : Tensor();
    const Tensor seen = in.mask.defined() ? masks.seen_before[s] : Tensor();
    steps.forward(zin.select(1, t), r, h_prev, cs[s], real, seen, z[s], hs[s + 1], cs[s + 1], y.select(1, s),
                  o.activation, o.recurrent_activation);
  }
  return {y, hs[T].clone(), cs[T].clone(), z, hs, cs};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> backward(const Tensor& grad_y, const Tensor& grad_h_n,
                                                                    const Tensor& grad_c_n, const ConvLstmTensors& in,
                                                                    const Tensor& z, const Tensor& hs, const Tensor& cs,
                                                                    const ConvLstmOptions& o, const CellSteps& steps) {
  const Dims d = check(in, c10::nullopt, c10::nullopt, o);
  const int64_t B = d.B, T = d.T, F = d.F, G = 4 * F;
  const std::vector<int64_t> state = d.shape({B}, d.Sp, F);
  TORCH_CHECK_VALUE(z.sizes().vec() == d.shape({T, B}, d.Sp, G) && hs.sizes().vec() == d.shape({T + 1, B}, d.Sp, F) &&
                        cs.sizes() == hs.sizes(),
                    "z, hs and cs must be what conv_lstm_forward returned for these inputs; got shapes ", z.sizes(),
                    ", ", hs.sizes(), ", ", cs.sizes());
  check_tensor(grad_y, in.x, "grad_y", d.shape({B, T}, d.Sp, F));
  check_tensor(grad_h_n, in.x, "grad_h_n", state);
  check_tensor(grad_c_n, in.x, "grad_c_n", state);
  const Tensor x = in.x.contiguous(), dy_all = steps.contiguous(grad_y);
  const Tensor zc = z.contiguous(), hsc = hs.contiguous(), csc = cs.contiguous();
  const auto opts = x.options();
  const Conv conv_in = input_conv(o), conv_rec = recurrent_conv(in.recurrent_kernel);
  const Tensor kernel = conv_weight(in.kernel), recurrent = conv_weight(in.recurrent_kernel);
  const StepMasks masks = step_masks(in.mask, o.go_backwards);
  const int64_t Gr = d.recurrent_groups, wr = G / Gr;

  Tensor dz = steps.make(d.shape({T, B}, d.Sp, G), opts);  // processing order
  Tensor dh = grad_h_n.contiguous().clone(), dc = grad_c_n.contiguous().clone();
  Tensor dh_prev = at::empty(state, opts), dc_prev = at::empty(state, opts);
  for (int64_t s = T - 1; s >= 0; --s) {
    const Tensor real = in.mask.defined() ? masks.real_by_step[s] : Tensor();
    const Tensor seen = in.mask.defined() ? masks.seen_before[s] : Tensor();
    steps.backward(zc[s], csc[s], csc[s + 1], real, seen, dy_all.select(1, s), dh, dc, dz[s], dh_prev, dc_prev,
                   o.activation, o.recurrent_activation);
    for (int64_t k = 0; k < Gr; ++k) {
      const Tensor wk = Gr == 1 ? recurrent : recurrent.narrow(0, k * wr, wr);
      const Tensor gk = Gr == 1 ? dz[s] : dz[s].narrow(-1, k * wr, wr).contiguous();
      Tensor gh = std::get<0>(conv_rec.backward(gk, hsc[s], wk, true, false, false));
      if (in.recurrent_dropout_mask.defined()) gh.mul_(in.recurrent_dropout_mask[k]);
      dh_prev.add_(gh);
    }
    std::swap(dh, dh_prev);
    std::swap(dc, dc_prev);
  }

  // The recurrent kernel's gradient, every step at once; from the second step where the initial
  // state is zero (no h0, the usual call), whose step adds nothing to it.
  Tensor grad_recurrent = at::empty(recurrent.sizes(), opts);  // contiguous, as the fake kernel says
  const int64_t s0 = zero_on_cpu(hsc[0]) && finite_on_cpu(dz[0]) ? 1 : 0, Tr = T - s0;
  if (Tr == 0) grad_recurrent.zero_();
  const Tensor h_all = hsc.narrow(0, s0, Tr), dz_all = dz.narrow(0, s0, Tr);
  for (int64_t k = 0; k < Gr && Tr > 0; ++k) {
    const Tensor hk = (in.recurrent_dropout_mask.defined() ? h_all * in.recurrent_dropout_mask[k].unsqueeze(0) : h_all)
                          .reshape(d.shape({Tr * B}, d.Sp, F));
    const Tensor gk = (Gr == 1 ? dz_all : dz_all.narrow(-1, k * wr, wr)).reshape(d.shape({Tr * B}, d.Sp, wr));
    const Tensor wk = Gr == 1 ? recurrent : recurrent.narrow(0, k * wr, wr);
    Tensor gw = std::get<0>(conv_rec.own_weight_gradient(gk, hk, wk, false, steps));
    if (!gw.defined()) gw = std::get<1>(conv_rec.backward(gk, hk, wk, false, true, false));
    (Gr == 1 ? grad_recurrent : grad_recurrent.narrow(0, k * wr, wr)).copy_(gw);
  }

  // The input side: x, kernel and bias from every step's gate gradients. dz is in processing order
  // [T, B]; x is laid out the same way for the convolution (a copy of x, smaller than one of dz by
  // C / 4F) and its gradient laid back.
  const int64_t Gi = d.input_groups, wi = G / Gi;
  Tensor grad_x, grad_kernel = at::empty(kernel.sizes(), opts);
  Tensor grad_bias = in.bias.defined() ? at::empty({G}, opts) : at::empty({0}, opts);
  for (int64_t k = 0; k < Gi; ++k) {
    const Tensor gk = (Gi == 1 ? dz : dz.narrow(-1, k * wi, wi)).reshape(d.shape({T * B}, d.Sp, wi));
    const Tensor wk = Gi == 1 ? kernel : kernel.narrow(0, k * wi, wi);
    const Tensor xk = in.dropout_mask.defined() ? x * in.dropout_mask[k].unsqueeze(1) : x;  // [B, T, *S, C]
    const Tensor xk_steps = steps.contiguous((o.go_backwards ? xk.flip(1) : xk).transpose(0, 1));  // [T, B, *S, C]
    const Tensor xk_images = xk_steps.view(d.shape({T * B}, d.S, d.C));
    auto [gw, gb] = conv_in.own_weight_gradient(gk, xk_images, wk, in.bias.defined(), steps);
    const bool aten_weight = !gw.defined();
    auto [gx, aten_gw, aten_gb] =
        conv_in.backward(gk, xk_images, wk, true, aten_weight, aten_weight && in.bias.defined());
    if (aten_weight) {
      gw = aten_gw;
      gb = aten_gb;
    }
    gx = gx.view(d.shape({T, B}, d.S, d.C)).transpose(0, 1);
    if (o.go_backwards) gx = gx.flip(1);
    if (in.dropout_mask.defined()) gx = gx * in.dropout_mask[k].unsqueeze(1);
    grad_x = grad_x.defined() ? grad_x.add_(gx) : gx.contiguous();
    (Gi == 1 ? grad_kernel : grad_kernel.narrow(0, k * wi, wi)).copy_(gw);
    if (in.bias.defined()) (Gi == 1 ? grad_bias : grad_bias.narrow(0, k * wi, wi)).copy_(gb);
  }
  return {grad_x, grad_kernel, grad_recurrent, grad_bias, dh, dc};
}

}  // namespace conv
}  // namespace cudnn_rnn
