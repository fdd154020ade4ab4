// The device-generic driver of the recurrent stack: per (layer, direction) the input GEMM, the
// time loop (recurrent GEMMs through ATen, the pointwise step through the backend's Policy) and,
// in backward, the weight gradients as GEMMs over all timesteps. Instantiated by the CPU backend
// (cpu/rnn_cpu.cpp) and by the generic CUDA backend (cuda/rnn_generic.cpp).
//
// Policy provides, for T in {float, double}:
//   forward_step<T>(const ForwardStep<T>&)        the cell update of every row (masks included)
//   gru_before_gates<T>(const ForwardStep<T>&)    GRU reset_after=False phase 1 (z, r, r * hd_h)
//   backward_step<T>(const BackwardStep<T>&)      the cell backward of every row
//   gru_before_backward_b<T>(const BackwardStep<T>&)  GRU reset_after=False phase B (r gate)
//   time_loop_forward<T>, time_loop_backward<T>   a backend's own whole time loop for the
//                                                 configurations it takes (returns false for the
//                                                 rest); PolicyDefaults declines every one
//   workspace(sizes, options)                     large per-call buffers (PolicyDefaults: at::empty)
//   float_weight(w)                               a float16 / bfloat16 weight in float32 (PolicyDefaults:
//                                                 converted on every call)
//   row_gemm<T>(...)                              a backend's own row GEMM (PolicyDefaults: none)
//   low_precision_weight_grads<T>(cfg)            weight-gradient GEMMs in cfg.gemm_dtype (PolicyDefaults: no)
//   projects_input_in_loop<T>(cfg, a)             the time loop projects each step's input (PolicyDefaults: no)
//   takes_input_bias<T>(cfg, a)                   the time loop adds the input bias (PolicyDefaults: no)
//   transposed_to(A, dtype)                       A^T row-major in dtype, for those GEMMs (PolicyDefaults: ATen)
//   weight_grad(parts, D, ones)                   float32 [A_1 | A_2 ... (| 1)]^T · D by the backend's own GEMM,
//                                                 or undefined (stacked_weight_grad)
//                                                 for ATen's (PolicyDefaults: undefined)
//
// Layouts: x and y are batch-major [B, T, F]; the outputs of inner layers live in the reserve
// time-major [T, B, D*u]. A "sequence" below is a 3-D tensor in either layout.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <c10/util/strides.h>

#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "core/rnn_config.h"
#include "core/step_args.h"

namespace cudnn_rnn {
namespace driver {

using at::Tensor;

// rows idx (int64) of a 2-D tensor, into a workspace buffer.
template <typename Policy>
Tensor select_rows(const Tensor& m2, const Tensor& idx) {
  Tensor out = Policy::workspace({idx.numel(), m2.size(1)}, m2.options());
  at::index_select_out(out, m2, 0, idx);
  return out;
}

template <typename T>
Seq<T> seq_of(const Tensor& t, bool batch_major) {
  const int64_t width = t.size(2);
  return Seq<T>{t.data_ptr<T>(), batch_major ? width : t.size(1) * width, batch_major ? t.size(1) * width : width};
}

template <typename T>
Seq<const T> const_seq_of(const Tensor& t, bool batch_major) {
  Seq<T> s = seq_of<T>(t, batch_major);
  return Seq<const T>{s.data, s.time_stride, s.row_stride};
}

struct DirWeights {
  Tensor kernel;     // [In, G*u]
  Tensor recurrent;  // [u, G*u]
  Tensor bias_in;    // [G*u] or undefined
  Tensor bias_rec;   // [G*u] (GRU reset_after only) or undefined
};

inline DirWeights dir_weights(const RnnConfig& cfg, at::TensorList w, int64_t ld) {
  const int64_t base = ld * cfg.tensors_per_direction();
  DirWeights out{w[base].contiguous(), w[base + 1].contiguous(), Tensor(), Tensor()};
  if (cfg.use_bias) {
    if (cfg.reset_after) {
      out.bias_in = w[base + 2][0];
      out.bias_rec = w[base + 2][1];
    } else {
      out.bias_in = w[base + 2];
    }
  }
  return out;
}

struct DirReserve {
  Tensor saved;  // [T, B, S]
  Tensor h;      // [T + 1, B, u]
  Tensor c;      // [T + 1, B, u] (LSTM)
};

// reserve[off : off + prod(sizes)] viewed with those sizes (reserve: 1-D): one view instead of a
// narrow and a view where the reserve is contiguous.
inline Tensor reserve_block(const Tensor& reserve, int64_t off, at::IntArrayRef sizes) {
  if (reserve.dim() != 1 || reserve.stride(0) != 1) {
    return reserve.narrow(0, off, c10::multiply_integers(sizes)).view(sizes);
  }
  return reserve.as_strided(sizes, c10::contiguous_strides(sizes), reserve.storage_offset() + off);
}

inline DirReserve dir_reserve(const RnnConfig& cfg, const Tensor& reserve, int64_t ld) {
  const int64_t B = cfg.batch, T = cfg.time, u = cfg.units;
  int64_t off = ld * cfg.reserve_per_direction();
  DirReserve r;
  const int64_t S = cfg.saved_width();
  if (cfg.keep_saved) {
    r.saved = reserve_block(reserve, off, {T, B, S});
    off += T * B * S;
  } else {
    // One step's scratch seen at every step (time stride 0): nothing to keep for backward.
    r.saved = at::empty({1, B, S}, reserve.options()).expand({T, B, S});
  }
  const int64_t states = cfg.stored_states();
  r.h = reserve_block(reserve, off, {states, B, u});
  off += states * B * u;
  if (cfg.has_cell_state()) r.c = reserve_block(reserve, off, {states, B, u});
  return r;
}

// Output of inner layer l (l < L-1), time-major [T, B, D*u].
inline Tensor inner_layer_output(const RnnConfig& cfg, const Tensor& reserve, int64_t layer) {
  const int64_t width = cfg.num_directions * cfg.units;
  const int64_t off = cfg.num_layers * cfg.num_directions * cfg.reserve_per_direction() +
                      layer * cfg.time * cfg.batch * width;
  return reserve_block(reserve, off, {cfg.time, cfg.batch, width});
}

// dst[i] = src[j] (or zeros without src) for slices along dim 0 of the same size: a memcpy or
// memset on the CPU for contiguous tensors of one dtype (a one-step call moves four [B, u] states,
// and a select and a copy_ cost a microsecond or more each), copy_ / zero_ elsewhere.
inline void copy_slice(const Tensor& dst, int64_t i, const Tensor& src = Tensor(), int64_t j = 0) {
  const int64_t n = dst.numel() / dst.size(0);
  const bool flat = dst.device().is_cpu() && dst.is_contiguous() &&
                    (!src.defined() || (src.device().is_cpu() && src.is_contiguous() &&
                                        src.scalar_type() == dst.scalar_type() && src.numel() / src.size(0) == n));
  if (!flat) {
    if (src.defined()) dst[i].copy_(src[j]); else dst[i].zero_();
    return;
  }
  const int64_t bytes = n * static_cast<int64_t>(dst.element_size());
  char* to = static_cast<char*>(dst.data_ptr()) + i * bytes;
  if (src.defined()) {
    std::memcpy(to, static_cast<const char*>(src.const_data_ptr()) + j * bytes, bytes);
  } else {
    std::memset(to, 0, bytes);
  }
}

// Broadcasts a per-sequence dropout mask [B, W] over time in the given layout.
inline Tensor over_time(const Tensor& mask_bw, bool batch_major) {
  return batch_major ? mask_bw.unsqueeze(1) : mask_bw.unsqueeze(0);
}

// The input projection of every timestep: [rows, In] x [In, G*u] (+ bias), in the layout of x3.
// With per-gate dropout masks (Keras implementation=1) each gate sees its own masked input.
// real: the rows to compute (RealRows::in_layout), or undefined for all; the others are left
// unset.
template <typename Policy, typename T>
Tensor input_projection(const RnnConfig& cfg, const Tensor& x3, bool batch_major, const DirWeights& w,
                        const Tensor& dmask, const Tensor& real) {
  const int64_t u = cfg.units, G = cfg.gates();
  const auto rows = x3.size(0) * x3.size(1);
  Tensor xw = Policy::workspace({x3.size(0), x3.size(1), G * u}, x3.options());
  Tensor xw2 = xw.view({rows, G * u});
  if (!dmask.defined() && x3.is_contiguous() &&
      Policy::template row_gemm<T>(cfg, x3.view({rows, x3.size(2)}), real, w.kernel, false, w.bias_in, false, xw2)) {
    return xw;
  }
  if (real.defined()) {
    TORCH_INTERNAL_ASSERT(!dmask.defined(), "input_projection: per-row compaction with dropout masks");
    Tensor x_real = select_rows<Policy>(x3.view({rows, x3.size(2)}), real);
    Tensor out = Policy::workspace({real.numel(), G * u}, x3.options());
    if (w.bias_in.defined()) {
      at::addmm_out(out, w.bias_in, x_real, w.kernel);
    } else {
      at::mm_out(out, x_real, w.kernel);
    }
    xw2.index_copy_(0, real, out);
    return xw;
  }
  if (!dmask.defined() || dmask.size(0) == 1) {
    Tensor xd = dmask.defined() ? x3 * over_time(dmask[0], batch_major) : x3;
    Tensor x2 = xd.reshape({rows, x3.size(2)});
    if (w.bias_in.defined()) {
      at::addmm_out(xw2, w.bias_in, x2, w.kernel);
    } else {
      at::mm_out(xw2, x2, w.kernel);
    }
    return xw;
  }
  for (int64_t g = 0; g < G; ++g) {
    Tensor x2 = (x3 * over_time(dmask[g], batch_major)).reshape({rows, x3.size(2)});
    Tensor out = xw2.narrow(1, g * u, u);
    Tensor k = w.kernel.narrow(1, g * u, u);
    out.copy_(w.bias_in.defined() ? at::addmm(w.bias_in.narrow(0, g * u, u), x2, k) : at::mm(x2, k));
  }
  return xw;
}

// rec[:, g0*u : g1*u] = (h * m_g) · R_g (+ bias_rec), for gates g0..g1-1. rmask: [1 or G, B, u].
inline void recurrent_projection(const RnnConfig& cfg, const Tensor& h, const Tensor& R, const Tensor& bias_rec,
                          const Tensor& rmask, int64_t g0, int64_t g1, Tensor& hd_buf, Tensor& rec) {
  const int64_t u = cfg.units;
  auto project = [&](const Tensor& hin, int64_t a, int64_t b) {
    Tensor out = rec.narrow(1, a * u, (b - a) * u);
    Tensor r = R.narrow(1, a * u, (b - a) * u);
    if (bias_rec.defined()) {
      at::addmm_out(out, bias_rec.narrow(0, a * u, (b - a) * u), hin, r);
    } else {
      at::mm_out(out, hin, r);
    }
  };
  if (!rmask.defined()) {
    project(h, g0, g1);
  } else if (rmask.size(0) == 1) {
    at::mul_out(hd_buf, h, rmask[0]);
    project(hd_buf, g0, g1);
  } else {
    for (int64_t g = g0; g < g1; ++g) {
      at::mul_out(hd_buf, h, rmask[g]);
      project(hd_buf, g, g + 1);
    }
  }
}

// dh += sum_g (drec_g · R_g^T) * m_g over gates g0..g1-1; drec: [B, (g1-g0)*u].
inline void recurrent_projection_backward(const RnnConfig& cfg, const Tensor& drec, const Tensor& R, const Tensor& rmask,
                                   int64_t g0, int64_t g1, Tensor& tmp, Tensor& dh) {
  const int64_t u = cfg.units;
  if (!rmask.defined()) {
    dh.addmm_(drec, R.narrow(1, g0 * u, (g1 - g0) * u).t());
  } else if (rmask.size(0) == 1) {
    at::mm_out(tmp, drec, R.narrow(1, g0 * u, (g1 - g0) * u).t());
    dh.addcmul_(tmp, rmask[0]);
  } else {
    for (int64_t g = g0; g < g1; ++g) {
      at::mm_out(tmp, drec.narrow(1, (g - g0) * u, u), R.narrow(1, g * u, u).t());
      dh.addcmul_(tmp, rmask[g]);
    }
  }
}

// Index of the first real step of each row in processing order (T when there is none).
inline Tensor first_real_step(const RnnConfig& cfg, const Tensor& mask, bool reversed, const at::TensorOptions& opts) {
  if (!mask.defined()) return at::zeros({cfg.batch}, opts.dtype(at::kLong));
  const Tensor m = reversed ? mask.flip(1) : mask;
  const Tensor idx = m.to(at::kByte).argmax(1);  // the first maximum
  return at::where(m.any(1), idx, at::full_like(idx, cfg.time)).contiguous();
}

struct DirectionArgs {
  int64_t layer, dir;
  Tensor x3;  // layer input
  bool in_batch_major;
  DirWeights w;
  Tensor mask;   // [B, T] bool, contiguous, or undefined
  Tensor dmask;  // [1|G, B, In] or undefined
  Tensor rmask;  // [1|G, B, u] or undefined
  DirReserve rs;
  // Layer 0 of a low-precision call: the caller's x (ForwardCall::x_low), contiguous; else undefined.
  Tensor x3_low = {};
  // A low-precision call: the caller's weights of this direction (ForwardCall::weights_low,
  // BackwardCall::weights_low); else undefined.
  DirWeights w_low = {};
};

// Direction d of layer l of a call: x3 its input, mask the call's mask made contiguous (or
// undefined), reserve the driver's reserve (in the input dtype).
inline DirectionArgs direction_args(const RnnConfig& cfg, const RnnInputs& in, const Tensor& mask,
                                    const Tensor& reserve, int64_t l, int64_t d, const Tensor& x3) {
  const int64_t ld = l * cfg.num_directions + d;
  auto per_direction = [&](const std::vector<Tensor>& masks) { return masks.empty() ? Tensor() : masks[ld].contiguous(); };
  return {l, d, x3, l == 0, dir_weights(cfg, in.weights, ld), mask, per_direction(in.dropout_masks),
          per_direction(in.recurrent_dropout_masks), dir_reserve(cfg, reserve, ld)};
}

// The fields a forward and a backward step share: the cell and where this direction writes.
template <typename Step>
void fill_common(Step& step, const RnnConfig& cfg, const DirectionArgs& a) {
  step.cell = cfg.cell;
  step.reset_after = cfg.reset_after;
  step.act = cfg.activation;
  step.ract = cfg.recurrent_activation;
  step.batch = cfg.batch;
  step.time = cfg.time;
  step.units = cfg.units;
  step.gates = cfg.gates();
  step.saved_width = cfg.saved_width();
  step.zero_out = cfg.zero_output(a.layer);
  step.out_col = a.dir * cfg.units;
}

// The fields of step s (processing order) of a forward and a backward step.
template <typename T>
void set_forward_step(ForwardStep<T>& step, const RnnConfig& cfg, const DirectionArgs& a, int64_t s) {
  const int64_t Bu = cfg.batch * cfg.units;
  step.t = cfg.reversed(a.dir) ? cfg.time - 1 - s : s;
  step.out_index = a.dir == 1 ? cfg.time - 1 - s : s;
  const int64_t from = cfg.state_slot(s) * Bu, to = cfg.state_slot(s + 1) * Bu;
  T* h = a.rs.h.data_ptr<T>();
  step.h_prev = h + from;
  step.h_next = h + to;
  T* c = cfg.has_cell_state() ? a.rs.c.data_ptr<T>() : nullptr;
  step.c_prev = c ? c + from : nullptr;
  step.c_next = c ? c + to : nullptr;
  step.saved = a.rs.saved.data_ptr<T>() + s * a.rs.saved.stride(0);
  step.keep_saved = cfg.keep_saved;
}

template <typename T>
void set_backward_step(BackwardStep<T>& step, const RnnConfig& cfg, const DirectionArgs& a, int64_t s, T* dh,
                       T* dh_next) {
  const int64_t Bu = cfg.batch * cfg.units;
  step.s = s;
  step.t = cfg.reversed(a.dir) ? cfg.time - 1 - s : s;
  step.out_index = a.dir == 1 ? cfg.time - 1 - s : s;
  step.dh = dh;
  step.dh_next = dh_next;
  const T* h = a.rs.h.data_ptr<T>();
  step.h_prev = h + s * Bu;
  step.h_new = h + (s + 1) * Bu;
  const T* c = cfg.has_cell_state() ? a.rs.c.data_ptr<T>() : nullptr;
  step.c_prev = c ? c + s * Bu : nullptr;
  step.c_new = c ? c + (s + 1) * Bu : nullptr;
  step.saved = a.rs.saved.data_ptr<T>() + s * a.rs.saved.stride(0);
}

// With a mask, the real rows (b, t) as indices: in the layer input's 2-D layout; the same rows'
// indices in processing order (time-major by step s: h_prev's rows), listed in the input
// layout's order; and the real rows in processing order (GRU's recurrent gate gradients). A
// policy whose own time loop never reads the input projection of a masked step (and writes zero
// gate gradients there) lets the driver run the input and weight GEMMs over these rows only.
struct RealRows {
  Tensor in_layout, processing_of_in_layout, processing;  // int64 [N]
};

// layout[b, t]: the row of (b, t) in the input's 2-D view.
inline Tensor row_layout(const RnnConfig& cfg, const Tensor& mask, bool batch_major) {
  const int64_t B = cfg.batch, Tn = cfg.time;
  const auto opts = mask.options().dtype(at::kLong);
  return batch_major ? at::arange(B * Tn, opts).view({B, Tn}) : at::arange(Tn * B, opts).view({Tn, B}).t();
}

// Whether gathering the real rows pays: only when enough of the batch is padding (an all-real
// mask, or a nearly full one, runs the dense GEMMs).
inline bool worth_compacting(const Tensor& mask) {
  return mask.defined() && mask.numel() > 0 && mask.sum().item<int64_t>() < mask.numel() * 4 / 5;
}

// The entries of a [B, T] tensor at the real steps, in the order of the input's 2-D layout.
inline Tensor real_in_layout_order(const Tensor& bt, const Tensor& mask, bool batch_major) {
  return batch_major ? bt.masked_select(mask) : bt.t().masked_select(mask.t());
}

inline Tensor real_rows_in_layout(const RnnConfig& cfg, const Tensor& mask, bool batch_major) {
  return real_in_layout_order(row_layout(cfg, mask, batch_major), mask, batch_major);
}

// [B, T]: the row of h_prev (processing order, [T, B] flattened) that step (b, t) reads.
inline Tensor processing_rows(const RnnConfig& cfg, bool reversed, const at::TensorOptions& opts) {
  const int64_t B = cfg.batch, Tn = cfg.time;
  Tensor step_base = at::arange(Tn, opts.dtype(at::kLong)).mul_(B);  // s * B at time t
  if (reversed) step_base = step_base.flip(0);
  return step_base.view({1, Tn}) + at::arange(B, opts.dtype(at::kLong)).view({B, 1});
}

inline RealRows real_rows(const RnnConfig& cfg, const Tensor& mask, bool batch_major, bool reversed) {
  const int64_t B = cfg.batch, Tn = cfg.time;
  const Tensor mask_p = (reversed ? mask.flip(1) : mask).t();  // [T, B]: step s, row b
  RealRows r;
  r.in_layout = real_rows_in_layout(cfg, mask, batch_major);
  r.processing_of_in_layout = real_in_layout_order(processing_rows(cfg, reversed, mask.options()), mask, batch_major);
  r.processing = at::arange(Tn * B, mask.options().dtype(at::kLong)).view({Tn, B}).masked_select(mask_p);
  return r;
}

// The weight-gradient products A^T · D (A: [rows, k], D: [rows, N]) in the precision the
// backend asks for: float32, or the caller's float16 / bfloat16 (Policy::low_precision_weight_grads)
// with ATen's GEMM (float32 accumulation; oneDNN's AMX kernels on the CPU), whose result comes in
// that precision, as the caller's weight gradients do (backward_any_precision need not convert a
// gradient that is such a product whole). D_low: D already converted, or undefined.
// A^T goes to the GEMM as a row-major copy in the low precision (Policy::transposed_to): oneDNN's
// bfloat16 GEMM ran a transposed view's product at half the speed (fastrnns LSTM: 11.4 against
// 6.5 ms).
struct WeightProducts {
  bool low = false;
  at::ScalarType dtype = at::kFloat;
  Tensor (*transposed_to)(const Tensor&, at::ScalarType) = nullptr;
  using Parts = std::vector<std::pair<Tensor, Tensor>>;
  Tensor (*own)(const Parts&, const Tensor&, bool) = nullptr;  // Policy::weight_grad
  Tensor operator()(const Tensor& A, const Tensor& D, const Tensor& D_low = Tensor()) const {
    if (!low) {
      Tensor product = own ? own({{A, Tensor()}}, D, false) : Tensor();
      return product.defined() ? product : at::mm(A.t(), D);
    }
    return at::mm(transposed_to(A, dtype), D_low.defined() ? D_low : D.to(dtype));
  }
  // The backend's own float32 [A_1 | A_2 ... (| 1)]^T · D (stacked_weight_grad), or undefined.
  Tensor own_stacked(const Parts& parts, const Tensor& D, bool ones) const {
    return !low && own ? own(parts, D, ones) : Tensor();
  }
};

// [A_1 | A_2 | ... (| 1)]^T · D: the weight gradients of several inputs (rows `rows_k` of each
// 2-D A_k, all its rows in order where rows_k is undefined) and, with `ones`, the bias's as the
// last row, in one GEMM over the rows of D: the backend's own (which reads the parts where they
// are), else ATen's over a stacked copy. Returns the [sum of widths (+ 1), N] product.
template <typename Policy>
Tensor stacked_weight_grad(const std::vector<std::pair<Tensor, Tensor>>& parts, bool ones, const Tensor& D,
                           const WeightProducts& product) {
  Tensor own = product.own_stacked(parts, D, ones);
  if (own.defined()) return own;
  int64_t width = ones ? 1 : 0;
  for (const auto& part : parts) width += part.first.size(1);
  Tensor A = Policy::workspace({D.size(0), width}, D.options());
  int64_t col = 0;
  for (const auto& [src, rows] : parts) {
    A.narrow(1, col, src.size(1)).copy_(rows.defined() ? src.index_select(0, rows) : src);
    col += src.size(1);
  }
  if (ones) A.narrow(1, col, 1).fill_(1);
  return product(A, D);
}

// What a backend's time_loop_backward may compute beside dxw and dh, while it has them in cache.
struct BackwardExtras {
  bool bias_sums = false;  // in: whether the driver wants the bias gradients from the loop
  // in: whether the driver reads dxw after the loop; without, a loop that leaves dxw_low may
  // keep only the current step's float32 gate gradients (a [B, G*u] buffer that stays in cache)
  bool keep_dxw = true;
  // out: the bias gradients (float32 or the call's T: the sums over rows of dxw, and for GRU
  // reset_after [2, G*u] with drec's), or undefined
  Tensor dbias;
  // out: the gate gradients in cfg.gemm_dtype, [x3.size(0), x3.size(1), Kp] (Kp >= G*u, the
  // columns past G*u zero) in dxw's layout, or undefined
  Tensor dxw_low;
};

// What a Policy may leave out: policies derive from this and override what they have.
struct PolicyDefaults {
  // Large per-call buffers (the CPU backend keeps a pool of them; at::empty reuses through the
  // CUDA caching allocator).
  static Tensor workspace(at::IntArrayRef sizes, const at::TensorOptions& opts) { return at::empty(sizes, opts); }

  // A float16 / bfloat16 weight in float32, for a low-precision call computed in float32 (the CPU
  // backend keeps the copy across calls while the weight is unchanged).
  static Tensor float_weight(const Tensor& w) { return w.to(at::kFloat); }

  // out2[r] = (accumulate ? out2[r] : bias, or 0) + in2[r] · op(W) for the rows r listed in
  // `rows` (int64; every row when undefined), op(W) = W [K, N] or, with trans_w, the transpose
  // of W [N, K]: the hoisted input projection and the input-gradient GEMM. false leaves it to
  // the driver's ATen GEMMs. in2_low: in2 already in cfg.gemm_dtype, as time_loop_backward
  // leaves BackwardExtras::dxw_low, or undefined; W_low: W in the caller's precision
  // (DirectionArgs::w_low), or undefined.
  template <typename T>
  static bool row_gemm(const RnnConfig&, const Tensor&, const Tensor&, const Tensor&, bool, const Tensor&, bool,
                       const Tensor&, const Tensor& = Tensor(), const Tensor& = Tensor()) {
    return false;
  }
  template <typename T>
  static bool takes_time_loop(const RnnConfig&, const DirectionArgs&) {
    return false;
  }
  // Whether time_loop_forward will project each step's input itself (and take the loop).
  template <typename T>
  static bool projects_input_in_loop(const RnnConfig&, const DirectionArgs&) {
    return false;
  }
  // Whether time_loop_forward will add the input bias itself (and take the loop): the hoisted
  // projection then leaves it out.
  template <typename T>
  static bool takes_input_bias(const RnnConfig&, const DirectionArgs&) {
    return false;
  }
  // Whether the weight-gradient GEMMs of a low-precision call (RnnConfig::gemm_dtype) run in it.
  template <typename T>
  static bool low_precision_weight_grads(const RnnConfig&) {
    return false;
  }
  // A^T (A: [rows, k]) as a row-major [k, rows] tensor of dtype.
  static Tensor transposed_to(const Tensor& A, at::ScalarType dtype) {
    return A.t().to(dtype, /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::Contiguous);
  }
  // float32 [A_1 | A_2 ... (| 1)]^T · D (stacked_weight_grad) by the backend's own GEMM, or
  // undefined for ATen's.
  static Tensor weight_grad(const std::vector<std::pair<Tensor, Tensor>>&, const Tensor&, bool) { return Tensor(); }
  template <typename T>
  static bool time_loop_forward(const RnnConfig&, const DirectionArgs&, ForwardStep<T>&) {
    return false;
  }
  template <typename T>
  static bool time_loop_backward(const RnnConfig&, const DirectionArgs&, BackwardStep<T>&, const Tensor&, Tensor&,
                                 const Tensor&, BackwardExtras&) {
    return false;
  }
};

// Whether a direction runs its GEMMs over the real rows of a masked batch only (the time loop
// never reads a masked step's input projection and writes zero gate gradients there).
template <typename Policy, typename T>
bool compacts(const RnnConfig& cfg, const DirectionArgs& a) {
  return !a.dmask.defined() && Policy::template takes_time_loop<T>(cfg, a) && worth_compacting(a.mask);
}

template <typename Policy, typename T>
void direction_forward(const RnnConfig& cfg, const DirectionArgs& a, const Tensor& out3, bool out_batch_major) {
  const int64_t B = cfg.batch, Tn = cfg.time, u = cfg.units, G = cfg.gates();
  const bool gru_before = cfg.cell == CellKind::GRU && !cfg.reset_after;

  const bool compact = compacts<Policy, T>(cfg, a);
  // A time loop that projects each step's input itself gets no hoisted projection (step.xw empty);
  // one that adds the input bias itself gets a projection without it.
  const bool in_loop = Policy::template projects_input_in_loop<T>(cfg, a);
  DirWeights projected = a.w;
  if (Policy::template takes_input_bias<T>(cfg, a)) projected.bias_in = Tensor();
  Tensor xw = in_loop ? Tensor()
                      : input_projection<Policy, T>(cfg, a.x3, a.in_batch_major, projected, a.dmask,
                                                    compact ? real_rows_in_layout(cfg, a.mask, a.in_batch_major) : Tensor());
  const auto opts = a.x3.options();
  // Per row, whether a real step has been processed: on the host without a tensor on the CPU (an
  // ATen op costs a microsecond, and a one-step call makes few).
  const uint8_t seen_init = a.mask.defined() ? 0 : 1;
  std::vector<uint8_t> seen_host;
  Tensor seen;
  if (opts.device().is_cpu()) {
    seen_host.assign(static_cast<size_t>(B), seen_init);
  } else {
    seen = at::full({B}, seen_init, opts.dtype(at::kByte));
  }

  ForwardStep<T> step{};
  fill_common(step, cfg, a);
  if (xw.defined()) step.xw = const_seq_of<T>(xw, a.in_batch_major);
  step.out = seq_of<T>(out3, out_batch_major);
  step.mask = a.mask.defined() ? a.mask.data_ptr<bool>() : nullptr;
  step.seen = seen.defined() ? seen.data_ptr<uint8_t>() : seen_host.data();
  if (Policy::template time_loop_forward<T>(cfg, a, step)) return;
  TORCH_INTERNAL_ASSERT(!in_loop, "direction_forward: a policy that projects in its loop must take the loop");

  Tensor rec = at::empty({B, G * u}, opts);
  Tensor hd_buf = at::empty({B, u}, opts);
  Tensor rh = gru_before ? at::empty({B, u}, opts) : Tensor();
  Tensor rec_h = gru_before ? at::empty({B, u}, opts) : Tensor();
  step.rec = rec.data_ptr<T>();
  step.rec_h = gru_before ? rec_h.data_ptr<T>() : nullptr;
  step.rh = gru_before ? rh.data_ptr<T>() : nullptr;
  step.mask_h = (gru_before && a.rmask.defined()) ? a.rmask[a.rmask.size(0) == 1 ? 0 : 2].data_ptr<T>() : nullptr;

  for (int64_t s = 0; s < Tn; ++s) {
    set_forward_step(step, cfg, a, s);
    Tensor h_prev = a.rs.h[cfg.state_slot(s)];
    recurrent_projection(cfg, h_prev, a.w.recurrent, a.w.bias_rec, a.rmask, 0, gru_before ? 2 : G, hd_buf, rec);
    if (gru_before) {
      Policy::template gru_before_gates<T>(step);  // z, r and the candidate matmul's input r * hd_h
      at::mm_out(rec_h, rh, a.w.recurrent.narrow(1, 2 * u, u));
    }
    Policy::template forward_step<T>(step);
  }
}

struct DirectionGrads {
  Tensor dx3;  // accumulated gradient of the layer input (same layout as x3)
  bool dx3_fresh = false;  // dx3 holds nothing yet (not even zeros): the first direction writes it
  Tensor dkernel, drecurrent, dbias;
  Tensor dh0, dc0;  // [B, u]
};

// Whether direction_backward reads the float32 values of the layer input x3: everywhere except
// the kernel gradient's low-precision GEMM over every row, which reads x3_low where given.
template <typename Policy, typename T>
bool backward_reads_input(const RnnConfig& cfg, const DirectionArgs& a) {
  return a.dmask.defined() || !Policy::template low_precision_weight_grads<T>(cfg) || compacts<Policy, T>(cfg, a);
}

template <typename Policy, typename T>
void direction_backward(const RnnConfig& cfg, const DirectionArgs& a, const Tensor& dout3, bool out_batch_major,
                        const Tensor& dhn, const Tensor& dcn, DirectionGrads& g) {
  const int64_t B = cfg.batch, Tn = cfg.time, u = cfg.units, G = cfg.gates();
  const bool reversed = cfg.reversed(a.dir);
  const bool gru_before = cfg.cell == CellKind::GRU && !cfg.reset_after;
  const bool gru_after = cfg.cell == CellKind::GRU && cfg.reset_after;
  const auto opts = a.x3.options();

  // dxw: input-side pre-activation gradients, in the layer input's layout.
  // drec: recurrent-side gradients in processing order (the weight GEMM's right operand).
  Tensor dxw = Policy::workspace({a.x3.size(0), a.x3.size(1), G * u}, opts);
  Tensor drec = gru_after ? Policy::workspace({Tn, B, G * u}, opts) : Tensor();
  Tensor first = first_real_step(cfg, a.mask, reversed, opts);

  Tensor dh = dhn.defined() ? dhn.clone() : at::zeros({B, u}, opts);
  Tensor dc = cfg.has_cell_state() ? (dcn.defined() ? dcn.clone() : at::zeros({B, u}, opts)) : Tensor();

  BackwardStep<T> step{};
  fill_common(step, cfg, a);
  step.dout = const_seq_of<T>(dout3, out_batch_major);
  step.dxw = seq_of<T>(dxw, a.in_batch_major);
  step.dc = cfg.has_cell_state() ? dc.data_ptr<T>() : nullptr;
  step.mask = a.mask.defined() ? a.mask.data_ptr<bool>() : nullptr;
  step.first = first.data_ptr<int64_t>();
  // The weight gradients below take the real rows only where the time loop allows (compact);
  // otherwise the loop may sum the bias gradients as it goes.
  const bool compact = compacts<Policy, T>(cfg, a);
  BackwardExtras extras;
  extras.bias_sums = cfg.use_bias && !compact;
  // The non-compacted weight and input gradients read dxw_low only, where it is left.
  extras.keep_dxw = compact || a.dmask.defined() || !Policy::template low_precision_weight_grads<T>(cfg);
  if (!Policy::template time_loop_backward<T>(cfg, a, step, dxw, dh, drec, extras)) {
    Tensor dh_next = at::empty({B, u}, opts);
    Tensor tmp = at::empty({B, u}, opts);
    Tensor step_drec = at::empty({B, G * u}, opts);  // this step's recurrent-side gradients
    Tensor d_rh = gru_before ? at::empty({B, u}, opts) : Tensor();
    step.drec = step_drec.data_ptr<T>();
    step.d_rh = gru_before ? d_rh.data_ptr<T>() : nullptr;
    step.mask_h = (gru_before && a.rmask.defined()) ? a.rmask[a.rmask.size(0) == 1 ? 0 : 2].data_ptr<T>() : nullptr;
    for (int64_t s = Tn - 1; s >= 0; --s) {
      set_backward_step(step, cfg, a, s, dh.data_ptr<T>(), dh_next.data_ptr<T>());
      Policy::template backward_step<T>(step);
      if (gru_before) {
        // d(r * hd_h) = dn_pre . R_h^T; then the r gate and the candidate's share of dh.
        at::mm_out(d_rh, step_drec.narrow(1, 2 * u, u), a.w.recurrent.narrow(1, 2 * u, u).t());
        Policy::template gru_before_backward_b<T>(step);
        recurrent_projection_backward(cfg, step_drec.narrow(1, 0, 2 * u), a.w.recurrent, a.rmask, 0, 2, tmp, dh_next);
      } else {
        recurrent_projection_backward(cfg, step_drec, a.w.recurrent, a.rmask, 0, G, tmp, dh_next);
      }
      if (gru_after) drec[s].copy_(step_drec);
      std::swap(dh, dh_next);
    }
  }

  // Weight gradients: GEMMs over all T*B rows at once (over the real rows only, where the time
  // loop allows: the others' gate gradients are zero).
  const int64_t rows = a.x3.size(0) * a.x3.size(1);
  const int64_t in = a.x3.size(2);
  Tensor dxw2 = dxw.view({rows, G * u});
  // Over the real rows only, where the time loop allows (the others' gate gradients are zero):
  // the kernel, recurrent kernel and bias gradients in one GEMM, [x | h_prev | 1]^T · d (GRU
  // reset_after: two, its recurrent side having gradients of its own). (Over every row, the
  // separate GEMMs below measured faster: no copy of x.)
  // (own stays null for a policy without a weight-gradient GEMM of its own: no row lists are built for it)
  const WeightProducts product{Policy::template low_precision_weight_grads<T>(cfg), cfg.gemm_dtype,
                               &Policy::transposed_to,
                               &Policy::weight_grad == &PolicyDefaults::weight_grad ? nullptr : &Policy::weight_grad};
  if (extras.dbias.defined()) g.dbias = extras.dbias;
  // The input gradient is written by a GEMM without accumulating where it is the first and that
  // GEMM covers every row (a zero fill and a read of [T, B, In] the less); else added to zeros.
  const bool dx3_write = g.dx3_fresh && !compact && !a.dmask.defined();
  if (g.dx3_fresh && !dx3_write) g.dx3.zero_();
  if (compact) {
    const RealRows real = real_rows(cfg, a.mask, a.in_batch_major, reversed);
    const Tensor d = select_rows<Policy>(dxw2, real.in_layout);
    // dx3's real rows += d · K^T: in place, or gathered, one GEMM, scattered back
    Tensor dx2 = g.dx3.view({rows, in});
    if (!Policy::template row_gemm<T>(cfg, dxw2, real.in_layout, a.w.kernel, true, Tensor(), true, dx2, Tensor(),
                                      a.w_low.kernel)) {
      dx2.index_copy_(0, real.in_layout, select_rows<Policy>(dx2, real.in_layout).addmm_(d, a.w.kernel.t()));
    }
    const Tensor x2 = a.x3.reshape({rows, in});
    const Tensor h2 = a.rs.h.narrow(0, 0, Tn).reshape({Tn * B, u});  // processing order
    if (gru_after) {
      const Tensor drec2 = drec.view({Tn * B, G * u});
      const Tensor in_side = stacked_weight_grad<Policy>({{x2, real.in_layout}}, cfg.use_bias, d, product);
      const Tensor rec_side = stacked_weight_grad<Policy>({{h2, real.processing}}, cfg.use_bias,
                                                          select_rows<Policy>(drec2, real.processing), product);
      g.dkernel = in_side.narrow(0, 0, in);
      g.drecurrent = rec_side.narrow(0, 0, u);
      if (cfg.use_bias) g.dbias = at::stack({in_side[in], rec_side[u]});
    } else {
      const Tensor both =
          stacked_weight_grad<Policy>({{x2, real.in_layout}, {h2, real.processing_of_in_layout}}, cfg.use_bias, d,
                                      product);
      g.dkernel = both.narrow(0, 0, in);  // owns the product; the others are copies of their rows
      g.drecurrent = both.narrow(0, in, u).clone();
      if (cfg.use_bias) g.dbias = both[in + u].clone();
    }
  } else {
    // The low-precision gate gradients, read by two products: the time loop's, or converted here.
    const Tensor& dxw_low = extras.dxw_low;
    const Tensor dxw2_padded = product.low && dxw_low.defined() ? dxw_low.view({rows, dxw_low.size(2)}) : Tensor();
    const Tensor dxw2_low = !product.low            ? Tensor()
                            : dxw2_padded.defined() ? dxw2_padded.narrow(1, 0, G * u)
                                                    : dxw2.to(product.dtype);
    if (!a.dmask.defined() || a.dmask.size(0) == 1) {
      Tensor xd = a.dmask.defined() ? a.x3 * over_time(a.dmask[0], a.in_batch_major)
                  : a.x3_low.defined() ? a.x3_low
                                       : a.x3;
      if (product.own && !product.low && !gru_after && !gru_before && !a.rmask.defined()) {
        // The kernel's and the recurrent kernel's gradients in one product over dxw's rows, where
        // the backend has its own: [x | h_prev]^T · dxw, h_prev's rows read in the input's order.
        const Tensor P = processing_rows(cfg, reversed, opts);  // [B, T]
        const Tensor h_rows = !a.in_batch_major && !reversed ? Tensor()
                              : a.in_batch_major            ? P.reshape({rows})
                                                            : P.t().contiguous().view({rows});
        const Tensor both = product.own_stacked(
            {{xd.reshape({rows, in}), Tensor()}, {a.rs.h.narrow(0, 0, Tn).reshape({Tn * B, u}), h_rows}}, dxw2, false);
        if (both.defined()) {
          g.dkernel = both.narrow(0, 0, in);  // owns the product; the recurrent kernel's is a copy
          g.drecurrent = both.narrow(0, in, u).clone();
        }
      }
      if (!g.dkernel.defined()) g.dkernel = product(xd.reshape({rows, in}), dxw2, dxw2_low);
      if (a.dmask.defined()) {
        g.dx3.add_(at::mm(dxw2, a.w.kernel.t()).view(a.x3.sizes()) * over_time(a.dmask[0], a.in_batch_major));
      } else if (!Policy::template row_gemm<T>(cfg, dxw2, Tensor(), a.w.kernel, true, Tensor(), !dx3_write,
                                                 g.dx3.view({rows, in}), dxw2_padded, a.w_low.kernel)) {
        TORCH_INTERNAL_ASSERT(extras.keep_dxw, "direction_backward: dxw was kept one step at a time");
        Tensor dx2 = g.dx3.view({rows, in});
        if (dx3_write) {
          at::mm_out(dx2, dxw2, a.w.kernel.t());
        } else {
          dx2.addmm_(dxw2, a.w.kernel.t());
        }
      }
    } else {
      g.dkernel = at::empty({in, G * u}, opts);
      for (int64_t k = 0; k < G; ++k) {
        Tensor mk = over_time(a.dmask[k], a.in_batch_major);
        Tensor dk = dxw2.narrow(1, k * u, u);
        g.dkernel.narrow(1, k * u, u).copy_(product((a.x3 * mk).reshape({rows, in}), dk));
        g.dx3.add_(at::mm(dk, a.w.kernel.narrow(1, k * u, u).t()).view(a.x3.sizes()) * mk);
      }
    }

    // Recurrent kernel: sum over steps of (h_prev * m)^T · drec. GRU reset_after has its own
    // recurrent-side gradients, in processing order like h_prev; the other cells share the input
    // side's (dxw), so h_prev is re-indexed to the input's layout instead (a quarter of the bytes).
    Tensor hprev = a.rs.h.narrow(0, 0, Tn);  // [T, B, u], processing order
    auto in_input_layout = [&](const Tensor& p) {  // [T, B, k] processing order -> [rows, k]
      if (!a.in_batch_major && !reversed) return p.reshape({rows, p.size(2)});
      Tensor out = Policy::workspace(a.in_batch_major ? at::IntArrayRef({B, Tn, p.size(2)}) : p.sizes(), opts);
      const Tensor by_time = reversed ? p.flip(0) : p;  // [T, B, k] in time order
      out.copy_(a.in_batch_major ? by_time.transpose(0, 1) : by_time);  // one strided copy, not T
      return out.view({rows, p.size(2)});
    };
    const int64_t hr_gates = gru_before ? 2 : G;
    auto rec_grad = [&](const Tensor& hin, int64_t g0, int64_t g1) {
      const Tensor h2 = gru_after ? hin.reshape({Tn * B, u}) : in_input_layout(hin);
      const Tensor d2 = (gru_after ? drec.view({Tn * B, G * u}) : dxw2).narrow(1, g0 * u, (g1 - g0) * u);
      const Tensor d2_low = gru_after || !dxw2_low.defined() ? Tensor() : dxw2_low.narrow(1, g0 * u, (g1 - g0) * u);
      if (g0 == 0 && g1 == G) {
        g.drecurrent = product(h2, d2, d2_low);  // every gate: the product is the gradient (no copy)
      } else {
        if (!g.drecurrent.defined()) g.drecurrent = at::empty({u, G * u}, opts);
        g.drecurrent.narrow(1, g0 * u, (g1 - g0) * u).copy_(product(h2, d2, d2_low));
      }
    };
    if (g.drecurrent.defined()) {
      // computed with the kernel's above
    } else if (!a.rmask.defined()) {
      rec_grad(hprev, 0, hr_gates);
    } else if (a.rmask.size(0) == 1) {
      rec_grad(hprev * a.rmask[0].unsqueeze(0), 0, hr_gates);
    } else {
      for (int64_t k = 0; k < hr_gates; ++k) rec_grad(hprev * a.rmask[k].unsqueeze(0), k, k + 1);
    }
    if (gru_before) {
      // The candidate's recurrent matmul reads r * hd_h, saved in the reserve's 4th block.
      rec_grad(a.rs.saved.narrow(2, 3 * u, u), 2, 3);
    }
  }

  if (cfg.use_bias && !g.dbias.defined()) {
    Tensor db_in = dxw2.sum(0);
    g.dbias = gru_after ? at::stack({db_in, drec.view({Tn * B, G * u}).sum(0)}) : db_in;
  }
  g.dh0 = dh;
  g.dc0 = dc;
}

// Layer 0's input. In a low-precision call computed in float32 (forward_any_precision), in.x is a
// data-less float32 stand-in of x's shape and the caller's x travels as x_low: a direction that
// reads only x_low gets it as x3_low (and the stand-in as x3, for its shape and options); the
// others get x in float32, converted on first need. Other calls: x made contiguous.
struct Layer0Input {
  Tensor x, x_low, x_float;
  Layer0Input(const Tensor& x, const Tensor& low)
      : x(x), x_low(low.defined() ? low.contiguous() : Tensor()), x_float(low.defined() ? Tensor() : x.contiguous()) {}
  void give(DirectionArgs& a, bool reads_only_low) {
    if (x_low.defined() && reads_only_low) {
      a.x3 = x;
      a.x3_low = x_low;
      return;
    }
    if (!x_float.defined()) x_float = x_low.to(x.scalar_type());
    a.x3 = x_float;
    a.x3_low = Tensor();
  }
};

// The whole stack, forward. The reserve is this driver's (saved activations, states, inner
// layer outputs), as bytes.
template <typename Policy>
ForwardResult forward(const RnnConfig& cfg, const ForwardCall& call) {
  const Tensor& x = call.in.x;
  const int64_t B = cfg.batch, Tn = cfg.time, u = cfg.units, D = cfg.num_directions, L = cfg.num_layers;
  Layer0Input input0(x, call.x_low);
  Tensor y = Policy::workspace({B, Tn, D * u}, x.options());
  Tensor h_n = at::empty({L * D, B, u}, x.options());
  Tensor c_n = cfg.has_cell_state() ? at::empty({L * D, B, u}, x.options()) : at::empty({0}, x.options());
  // The reserve travels as bytes (its layout is each backend's own business; see ops.cpp).
  Tensor reserve_bytes =
      Policy::workspace({cfg.reserve_size() * static_cast<int64_t>(x.element_size())}, x.options().dtype(at::kByte));
  Tensor reserve = reserve_bytes.view(x.scalar_type());
  Tensor mask = call.in.mask.has_value() ? call.in.mask->contiguous() : Tensor();

  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cudnn_rnn::rnn_forward", [&] {
    for (int64_t l = 0; l < L; ++l) {
      const bool last = l == L - 1;
      Tensor out3 = last ? y : inner_layer_output(cfg, reserve, l);
      for (int64_t d = 0; d < D; ++d) {
        const int64_t ld = l * D + d;
        DirectionArgs a = direction_args(cfg, call.in, mask, reserve, l, d, l == 0 ? x : inner_layer_output(cfg, reserve, l - 1));
        if (l == 0) input0.give(a, Policy::template projects_input_in_loop<scalar_t>(cfg, a));
        if (!call.weights_low.empty()) a.w_low = dir_weights(cfg, call.weights_low, ld);
        copy_slice(a.rs.h, 0, call.h0.has_value() ? *call.h0 : Tensor(), ld);
        if (cfg.has_cell_state()) copy_slice(a.rs.c, 0, call.c0.has_value() ? *call.c0 : Tensor(), ld);
        direction_forward<Policy, scalar_t>(cfg, a, out3, last);
        copy_slice(h_n, ld, a.rs.h, cfg.state_slot(Tn));
        if (cfg.has_cell_state()) copy_slice(c_n, ld, a.rs.c, cfg.state_slot(Tn));
      }
    }
  });
  return {y, h_n, c_n, reserve_bytes};
}

// The whole stack, backward, from the reserve forward returned (checked here: it is this
// driver's layout; make_config checked the rest).
template <typename Policy>
BackwardResult backward(const RnnConfig& cfg, const BackwardCall& call) {
  const Tensor& x = call.in.x;
  const int64_t B = cfg.batch, u = cfg.units, D = cfg.num_directions, L = cfg.num_layers;
  const int64_t reserve_bytes = cfg.reserve_size() * static_cast<int64_t>(x.element_size());
  TORCH_CHECK_VALUE(call.reserve.dim() == 1 && call.reserve.scalar_type() == at::kByte &&
                        call.reserve.size(0) == reserve_bytes,
                    "reserve must be the uint8 tensor of ", reserve_bytes, " bytes rnn_forward returned for this "
                    "configuration; got ", call.reserve.scalar_type(), " of shape ", call.reserve.sizes());

  Layer0Input input0(x, call.x_low);
  Tensor reserve = call.reserve.contiguous().view(x.scalar_type());
  Tensor mask = call.in.mask.has_value() ? call.in.mask->contiguous() : Tensor();
  std::vector<Tensor> grad_weights(call.in.weights.size());
  Tensor grad_h0 = at::empty({L * D, B, u}, x.options());
  Tensor grad_c0 = cfg.has_cell_state() ? at::empty({L * D, B, u}, x.options()) : at::empty({0}, x.options());
  Tensor grad_x;

  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cudnn_rnn::rnn_backward", [&] {
    Tensor dout = call.grad_y.contiguous();  // gradient of the current layer's output
    for (int64_t l = L - 1; l >= 0; --l) {
      const bool last = l == L - 1;
      Tensor x3 = l == 0 ? x : inner_layer_output(cfg, reserve, l - 1);
      Tensor dx3 = Policy::workspace(x3.sizes(), x3.options());  // the first direction writes it
      for (int64_t d = 0; d < D; ++d) {
        const int64_t ld = l * D + d;
        DirectionArgs a = direction_args(cfg, call.in, mask, reserve, l, d, x3);
        if (!call.weights_low.empty()) a.w_low = dir_weights(cfg, call.weights_low, ld);
        // its backward reads x only for the low-precision weight-gradient GEMM: the caller's x
        if (l == 0) input0.give(a, !backward_reads_input<Policy, scalar_t>(cfg, a));
        DirectionGrads g;
        g.dx3 = dx3;
        g.dx3_fresh = d == 0;
        direction_backward<Policy, scalar_t>(cfg, a, dout, last, call.grad_h_n[ld].contiguous(),
                                             cfg.has_cell_state() ? call.grad_c_n[ld].contiguous() : Tensor(), g);
        const int64_t base = ld * cfg.tensors_per_direction();
        grad_weights[base] = g.dkernel;
        grad_weights[base + 1] = g.drecurrent;
        if (cfg.use_bias) grad_weights[base + 2] = g.dbias;
        grad_h0[ld].copy_(g.dh0);
        if (cfg.has_cell_state()) grad_c0[ld].copy_(g.dc0);
      }
      dout = dx3;
    }
    grad_x = dout;
  });
  return {grad_x, grad_weights, grad_h0, grad_c0};
}

// float16 / bfloat16: the same computation in float32, results cast back to the caller's dtype
// (the reserve stays float32 bytes, which backward reads the same way).
inline bool low_precision(const Tensor& t) {
  return t.defined() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16);
}
inline Tensor to_float(const Tensor& t) { return low_precision(t) ? t.to(at::kFloat) : t; }
inline OptTensor to_float(const OptTensor& t) { return t.has_value() ? OptTensor(to_float(*t)) : c10::nullopt; }
inline std::vector<Tensor> to_float(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const auto& t : ts) out.push_back(to_float(t));
  return out;
}

// A float32 stand-in of x's shape without data (stride 0): in.x of a low-precision call computed
// in float32, whose x travels as x_low and is converted where a direction reads it; the weights
// in float32 through Policy::float_weight.
template <typename Policy>
RnnInputs float_inputs_but_x(const RnnInputs& call_in) {
  RnnInputs in{at::zeros({1, 1, 1}, call_in.x.options().dtype(at::kFloat)).expand(call_in.x.sizes()),
               {},
               call_in.mask,
               to_float(call_in.dropout_masks),
               to_float(call_in.recurrent_dropout_masks)};
  for (const Tensor& w : call_in.weights) in.weights.push_back(low_precision(w) ? Policy::float_weight(w) : w);
  return in;
}

// t in dtype, through Policy::workspace where t is contiguous (the CPU's pool: a training step's
// conversions of y, its gradient and dx, megabytes each, no longer fault in fresh pages on every
// call), else as ATen converts it.
template <typename Policy>
Tensor converted(const Tensor& t, at::ScalarType dtype) {
  if (!t.defined() || t.scalar_type() == dtype) return t;
  if (!t.is_contiguous()) return t.to(dtype);
  return Policy::workspace(t.sizes(), t.options().dtype(dtype)).copy_(t);
}

template <typename Policy>
ForwardResult forward_any_precision(const RnnConfig& cfg, const ForwardCall& call) {
  if (!low_precision(call.in.x)) return forward<Policy>(cfg, call);
  ForwardCall f{float_inputs_but_x<Policy>(call.in), to_float(call.h0), to_float(call.c0), call.options, call.need_grad};
  f.x_low = call.in.x;
  f.weights_low = call.in.weights;
  RnnConfig c = cfg;
  c.gemm_dtype = call.in.x.scalar_type();
  auto [y, h_n, c_n, reserve] = forward<Policy>(c, f);
  const auto dtype = call.in.x.scalar_type();
  return {converted<Policy>(y, dtype), h_n.to(dtype), c_n.to(dtype), reserve};
}

template <typename Policy>
BackwardResult backward_any_precision(const RnnConfig& cfg, const BackwardCall& call) {
  if (!low_precision(call.in.x)) return backward<Policy>(cfg, call);
  BackwardCall f{converted<Policy>(call.grad_y, at::kFloat), to_float(call.grad_h_n), to_float(call.grad_c_n),
                 float_inputs_but_x<Policy>(call.in), call.reserve, call.options};
  f.x_low = call.in.x;
  f.weights_low = call.in.weights;
  RnnConfig c = cfg;
  c.gemm_dtype = call.in.x.scalar_type();
  auto [dx, dw, dh0, dc0] = backward<Policy>(c, f);
  const auto dtype = call.in.x.scalar_type();
  // The weight gradients in the weights' dtype: as they come where they are (a low-precision
  // product, WeightProducts) and own no more memory than they hold; else converted or copied out
  // (of a stacked product they are a part of) through Policy::workspace: the CPU's pool, so no
  // page faults on every call.
  for (size_t i = 0; i < dw.size(); ++i) {
    const auto wt = call.in.weights[i].scalar_type();
    const bool part = dw[i].storage().nbytes() > static_cast<size_t>(dw[i].numel() * dw[i].element_size());
    if (dw[i].scalar_type() != wt || part) {
      dw[i] = Policy::workspace(dw[i].sizes(), dw[i].options().dtype(wt)).copy_(dw[i]);
    }
  }
  return {converted<Policy>(dx, dtype), dw, dh0.to(dtype), dc0.to(dtype)};
}

}  // namespace driver
}  // namespace cudnn_rnn
