// CPU backend of the recurrent stack ops: the device-generic driver (rnn_driver.h) with a time
// loop of its own (TimeLoops below) for LSTM, GRU reset_after=True and SimpleRNN without
// recurrent dropout, and row loops in parallel over batch rows for the rest. Each row's gates
// are activated as arrays (cell_rows.h, vectorised). float16 and bfloat16 compute in float32.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/rnn_driver.h"
#include "cpu/bf16_gemm.h"
#include "cpu/blas.h"
#include "cpu/buffer_pool.h"
#include "cpu/cell_rows.h"
#include "cpu/step_plan.h"
#include "cpu/time_loop.h"

namespace cudnn_rnn {
namespace {

using at::Tensor;

// Large per-call buffers come from the buffer pool (no page faults on reuse).
Tensor workspace(at::IntArrayRef sizes, const at::TensorOptions& opts) {
  return cpu::pooled_empty(sizes, opts.dtype().toScalarType());
}

int64_t grain(int64_t units, int64_t gates) { return std::max<int64_t>(1, 16384 / (units * gates)); }

// acc[j] += sum over r < rows of x[r * ld + j] (float64 accumulators), vectorised for float32.
template <typename T>
void add_rows_to_f64(const T* x, int64_t ld, int64_t rows, int64_t n, double* acc) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::float_loops().add_rows_to_f64(x, ld, rows, n, acc);
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < n; ++j) acc[j] += x[r * ld + j];
    }
  }
}

// Whether the time loops below take a configuration; every size must also fit BLAS's int.
template <typename T>
bool fused_loop_applies(const RnnConfig& cfg, const driver::DirectionArgs& a) {
  if (cfg.cell == CellKind::GRU && !cfg.reset_after) return false;  // two GEMMs per step
  if (a.rmask.defined() || !cpu::have_blas<T>()) return false;
  // The largest BLAS argument: the batch, or the leading dimension of batch-major gate gradients.
  return std::max(cfg.batch, cfg.time * cfg.gates() * cfg.units) < INT_MAX / 4;
}

// One row b of a step, units [j0, j0 + w): the row loops of CpuPolicy (all units, parallel
// over rows) and the time loop of TimeLoops (a unit block, every row) share these.

// Forward. xwr, rec: the row's input and recurrent projections for these units with gate
// strides xs, rs (unused on masked rows); `seen` is the caller's to update.
template <typename T>
void forward_row(const ForwardStep<T>& p, int64_t b, int64_t j0, int64_t w, const T* xwr, int64_t xs, const T* rec,
                 int64_t rs, T* scratch) {
  const int64_t u = p.units, S = p.saved_width;
  const bool real = p.mask ? p.mask[b * p.time + p.t] : true;
  const T* hp = p.h_prev + b * u + j0;
  T* hn = p.h_next + b * u + j0;
  T* outr = p.out.row(p.out_index, b) + p.out_col + j0;
  T* sv = p.saved + b * S + j0;
  if (!real) {
    // Keras: the state is carried; the output is the previous output (zero before the first
    // real step) or zero with zero_output_for_mask.
    const bool zero = p.zero_out || !p.seen[b];
    for (int64_t j = 0; j < w; ++j) {
      hn[j] = hp[j];
      outr[j] = zero ? T(0) : hp[j];
    }
    if (p.c_next) std::copy(p.c_prev + b * u + j0, p.c_prev + b * u + j0 + w, p.c_next + b * u + j0);
    for (int64_t q = 0; q < S / u && p.keep_saved; ++q) std::fill(sv + q * u, sv + q * u + w, T(0));
    return;
  }
  switch (p.cell) {
    case CellKind::LSTM:
      cpu::lstm_row_forward<T>(p.act, p.ract, w, {xwr, xs}, {rec, rs}, p.c_prev + b * u + j0, {sv, u},
                               p.keep_saved, hn, p.c_next + b * u + j0, scratch);
      break;
    case CellKind::GRU:
      if (p.reset_after) {
        cpu::gru_after_row_forward<T>(p.act, p.ract, w, {xwr, xs}, {rec, rs}, hp, {sv, u}, p.keep_saved, hn,
                                      scratch);
      } else {  // row loops only (j0 = 0, w = u)
        cpu::gru_before_row_update<T>(p.act, p.ract, u, xwr, p.rec_h + b * u, hp, sv, hn, scratch);
      }
      break;
    case CellKind::SimpleRNN:
      cpu::simple_row_forward<T>(p.act, w, xwr, rec, sv, hn);
      break;
  }
  std::copy(hn, hn + w, outr);
}

// Time t's input projection for units [j0, j0 + w) (every gate, every row) on its way to L2
// while the step before it multiplies: a step's rows lie a sequence apart, each unit block's
// piece of a gate only w values, too short a stream for the hardware prefetchers (the cell's
// loads of it were the time loop's hottest instructions).
template <typename T>
void prefetch_projection(const ForwardStep<T>& p, int64_t t, int64_t j0, int64_t w) {
  constexpr int64_t line = 64 / sizeof(T);
  for (int64_t b = 0; b < p.batch; ++b) {
    const T* row = p.xw.row(t, b) + j0;
    for (int64_t q = 0; q < p.gates; ++q) {
      for (int64_t j = 0; j < w; j += line) __builtin_prefetch(row + q * p.units + j, 0, 2);
    }
  }
}

// Backward. Writes the input-side gate gradients (dxw), the direct part of dh_next and, where
// p.drec is set, the recurrent-side gradients of the gates this phase knows (GRU reset_after:
// its own; the others: a copy of dxw's, except GRU reset_after=False's r gate, phase B's).
template <typename T>
void backward_row(const BackwardStep<T>& p, int64_t b, int64_t j0, int64_t w, T* scratch) {
  const int64_t u = p.units, G = p.gates, S = p.saved_width;
  const bool real = p.mask ? p.mask[b * p.time + p.t] : true;
  // Which output positions read this step's state: the step itself when real, and with
  // carry-over also every masked step after the first real one.
  const bool reads = p.zero_out ? real : p.s >= p.first[b];
  T* dhr = p.dh + b * u + j0;
  if (reads) {
    const T* dor = p.dout.row(p.out_index, b) + p.out_col + j0;
    for (int64_t j = 0; j < w; ++j) dhr[j] += dor[j];
  }
  T* dxr = p.dxw.row(p.t, b) + j0;
  T* drr = p.drec ? p.drec + b * G * u + j0 : nullptr;
  T* dnr = p.dh_next + b * u + j0;
  if (!real) {
    for (int64_t q = 0; q < G; ++q) {
      std::fill(dxr + q * u, dxr + q * u + w, T(0));
      if (drr) std::fill(drr + q * u, drr + q * u + w, T(0));
    }
    std::copy(dhr, dhr + w, dnr);
    return;  // dc carries through unchanged
  }
  const T* sv = p.saved + b * S + j0;
  const T* hp = p.h_prev + b * u + j0;
  bool copy_to_drec = drr != nullptr;
  switch (p.cell) {
    case CellKind::LSTM:
      cpu::lstm_row_backward<T>(p.act, p.ract, w, {sv, u}, p.c_prev + b * u + j0,
                                p.c_new + b * u + j0, dhr, p.dc + b * u + j0, {dxr, u}, scratch);
      std::fill(dnr, dnr + w, T(0));
      break;
    case CellKind::GRU:
      if (p.reset_after) {
        cpu::gru_after_row_backward<T>(p.act, p.ract, w, {sv, u}, hp, dhr, {dxr, u}, {drr, u}, dnr, scratch);
        copy_to_drec = false;
      } else {  // row loops only (j0 = 0, w = u); the r gate comes in phase B
        cpu::gru_before_row_backward_a<T>(p.act, p.ract, u, sv, hp, dhr, dxr, dnr, scratch);
        if (drr) {
          std::copy(dxr, dxr + u, drr);
          std::copy(dxr + 2 * u, dxr + 3 * u, drr + 2 * u);
        }
        copy_to_drec = false;
      }
      break;
    case CellKind::SimpleRNN:
      cpu::simple_row_backward<T>(p.act, w, sv, p.h_new + b * u + j0, dhr, dxr);
      std::fill(dnr, dnr + w, T(0));
      break;
  }
  if (copy_to_drec) {
    for (int64_t q = 0; q < G; ++q) std::copy(dxr + q * u, dxr + q * u + w, drr + q * u);
  }
}

// The time loop of LSTM, GRU reset_after=True and SimpleRNN: each step's unit blocks across
// threads (cpu::UnitBlocks, cpu::StepScheduler), each block's recurrent product on the call's
// plan (cpu/step_plan.h) followed by the cell update of those units for every row.
struct TimeLoops {
  template <typename T>
  static bool takes_time_loop(const RnnConfig& cfg, const driver::DirectionArgs& a) {
    return fused_loop_applies<T>(cfg, a);
  }

  template <typename T>
  static bool low_precision_weight_grads(const RnnConfig& cfg) {
    return cpu::bf16_plan<T>(cfg);
  }

  // A plan that projects each step's input in the loop (bfloat16): no hoisted projection.
  template <typename T>
  static bool projects_input_in_loop(const RnnConfig& cfg, const driver::DirectionArgs& a) {
    return fused_loop_applies<T>(cfg, a) && cpu::plan_projects_input<T>(cfg, a);
  }

  // LSTM and SimpleRNN with a hoisted projection: the input bias joins the recurrent GEMM's
  // (one [G*u] vector under each step's product) instead of a bias copied under the whole
  // [T, B, G*u] projection, which its GEMM then reads back (BLAS's addmm: 2.5 ms of a fastrnns
  // LSTM forward for the copy alone). GRU's candidate gate reads its recurrent part apart.
  template <typename T>
  static bool takes_input_bias(const RnnConfig& cfg, const driver::DirectionArgs& a) {
    return cfg.cell != CellKind::GRU && a.w.bias_in.defined() && fused_loop_applies<T>(cfg, a) &&
           !projects_input_in_loop<T>(cfg, a);
  }

  template <typename T>
  static bool time_loop_forward(const RnnConfig& cfg, const driver::DirectionArgs& a, ForwardStep<T>& step) {
    if (!fused_loop_applies<T>(cfg, a)) return false;
    // The bias under each step's recurrent product: the recurrent bias, the input bias's too
    // where the loop takes it.
    const Tensor step_bias = !takes_input_bias<T>(cfg, a) ? a.w.bias_rec
                             : a.w.bias_rec.defined()     ? a.w.bias_in + a.w.bias_rec
                                                          : a.w.bias_in;
    const int64_t B = cfg.batch, u = cfg.units, G = cfg.gates();
    const cpu::UnitBlocks blocks(B, u, G);
    const auto plan = cpu::forward_plan<T>({cfg, a, blocks, step_bias, step.mask != nullptr});
    // Per block the product's output [B, G*w] and the row kernel's scratch; raw pointers taken
    // here: the worker threads make no ATen calls.
    std::vector<Tensor> rec(blocks.n), scratch(blocks.n);
    std::vector<T*> rec_p(blocks.n), scratch_p(blocks.n);
    for (int64_t k = 0; k < blocks.n; ++k) {
      rec[k] = at::empty({B, G * blocks.width(k)}, a.x3.options());
      scratch[k] = at::empty({cpu::row_scratch_size(blocks.width(k))}, a.x3.options());
      rec_p[k] = rec[k].data_ptr<T>();
      scratch_p[k] = scratch[k].data_ptr<T>();
    }
    cpu::ActiveRows act(B);
    cpu::StepScheduler scheduler(blocks.n);
    for (int64_t s = 0; s < cfg.time; ++s) {
      driver::set_forward_step(step, cfg, a, s);
      act.collect(step.mask, B, cfg.time, step.t);
      plan->begin_step(s, act, step);
      scheduler.run([&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t j0 = blocks.start[k], w = blocks.width(k);
          int64_t xw_stride = 0;
          const T* xw = plan->cell_input(k, &xw_stride);
          if (s + 1 < cfg.time && !xw) prefetch_projection<T>(step, cfg.reversed(a.dir) ? step.t - 1 : step.t + 1, j0, w);
          if (act.n > 0) plan->product(k, act, step, rec_p[k]);
          forward_block<T>(step, j0, w, xw, xw_stride, rec_p[k], scratch_p[k]);
          plan->end_block(k, step);
        }
        plan->end_task();
      });
      if (step.mask) {
        for (int64_t b = 0; b < B; ++b) step.seen[b] |= step.mask[b * cfg.time + step.t];
      }
    }
    return true;
  }

  // Backward: a task first finishes its units of dh (adding the recurrent GEMM of the step
  // processed before, whose gate gradients are complete after the previous fork-join), then runs
  // the cell backward of those units. The last GEMM (into dh0) runs after the loop.
  template <typename T>
  static bool time_loop_backward(const RnnConfig& cfg, const driver::DirectionArgs& a, BackwardStep<T>& step,
                                 const Tensor& dxw, Tensor& dh, const Tensor& drec, driver::BackwardExtras& extras) {
    if (!fused_loop_applies<T>(cfg, a)) return false;
    const int64_t B = cfg.batch, u = cfg.units, G = cfg.gates(), Tn = cfg.time;
    const bool gru = cfg.cell == CellKind::GRU;
    const cpu::UnitBlocks blocks(B, u, G);
    const auto plan = cpu::backward_plan<T>({cfg, a, blocks, Tensor(), step.mask != nullptr},
                                            {step, dxw, drec, extras});
    std::vector<Tensor> scratch(blocks.n);
    std::vector<T*> scratch_p(blocks.n);
    for (int64_t k = 0; k < blocks.n; ++k) {
      scratch[k] = at::empty({cpu::row_scratch_size(blocks.width(k))}, dxw.options());
      scratch_p[k] = scratch[k].data_ptr<T>();
    }
    Tensor dh_next = at::empty({B, u}, dxw.options());
    auto time_of = [&](int64_t s) { return cfg.reversed(a.dir) ? Tn - 1 - s : s; };
    // The recurrent-side gate gradients of step s, [B, G*u] rows: GRU's own, else the input side's.
    auto grads_of = [&](int64_t s) -> std::pair<const T*, int64_t> {
      if (gru) return {drec.data_ptr<T>() + s * B * G * u, G * u};
      return {step.dxw.row(time_of(s), 0), step.dxw.row_stride};
    };
    // The bias gradients (extras.bias_sums): the sums over rows of dxw (and of drec, GRU),
    // accumulated in float64 by the tasks as they finish a step's units.
    Tensor sums = extras.bias_sums ? at::zeros({gru ? 2 : 1, G * u}, dxw.options().dtype(at::kDouble)) : Tensor();
    double* sums_p = sums.defined() ? sums.data_ptr<double>() : nullptr;
    auto add_to_sums = [&](int64_t s, int64_t j0, int64_t w) {
      const int64_t t = time_of(s);
      for (int64_t q = 0; q < G; ++q) {
        const int64_t col = q * u + j0;
        add_rows_to_f64<T>(step.dxw.row(t, 0) + col, step.dxw.row_stride, B, w, sums_p + col);
        if (gru) add_rows_to_f64<T>(step.drec + col, G * u, B, w, sums_p + G * u + col);
      }
    };
    cpu::ActiveRows act(B), act_later(B);  // rows of step s and of step s + 1
    cpu::StepScheduler scheduler(blocks.n);
    for (int64_t s = Tn - 1; s >= 0; --s) {
      driver::set_backward_step(step, cfg, a, s, dh.data_ptr<T>(), dh_next.data_ptr<T>());
      step.drec = gru ? drec.data_ptr<T>() + s * B * G * u : nullptr;
      act.collect(step.mask, B, Tn, step.t);
      const bool later = s + 1 < Tn;
      if (later) {
        const auto [D, ld] = grads_of(s + 1);
        plan->begin_grads(s + 1, act_later, D, ld);
      }
      scheduler.run([&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t j0 = blocks.start[k], w = blocks.width(k);
          if (later) plan->add_grad(k, act_later, step.dh);
          backward_block<T>(step, j0, w, scratch_p[k]);
          plan->end_block(k, s, step);
          if (sums_p) add_to_sums(s, j0, w);
        }
        plan->end_task();
      });
      std::swap(dh, dh_next);
      std::swap(act, act_later);
    }
    const auto [D, ld] = grads_of(0);
    plan->begin_grads(0, act_later, D, ld);
    T* dh0 = dh.data_ptr<T>();
    at::parallel_for(0, blocks.n, 1, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) plan->add_grad(k, act_later, dh0);
      plan->end_task();
    });
    if (sums_p) extras.dbias = (gru ? sums : sums[0]).to(dxw.scalar_type());
    return true;
  }

 private:
  // Units [j0, j0 + w) of one forward step, every row, given the step's recurrent products of
  // those units (rec: [active rows, G*w], gate stride w; its row i belongs to the i-th real row).
  // xw: those units' input projections in the same form (rows of the real rows, gate stride w,
  // xw_stride apart: 0 for one row every row reads) when the loop projected them, or null for
  // the hoisted projection's.
  template <typename T>
  static void forward_block(const ForwardStep<T>& p, int64_t j0, int64_t w, const T* xw, int64_t xw_stride,
                            const T* rec, T* scratch) {
    const T* recr = rec;
    const T* xwr = xw;
    for (int64_t b = 0; b < p.batch; ++b) {
      const bool real = p.mask ? p.mask[b * p.time + p.t] : true;
      if (xw) {
        forward_row<T>(p, b, j0, w, xwr, w, recr, w, scratch);
      } else {
        forward_row<T>(p, b, j0, w, p.xw.row(p.t, b) + j0, p.units, recr, w, scratch);
      }
      if (real) {
        recr += p.gates * w;
        xwr += xw ? xw_stride : 0;
      }
    }
  }

  // Units [j0, j0 + w) of one backward step, every row.
  template <typename T>
  static void backward_block(const BackwardStep<T>& p, int64_t j0, int64_t w, T* scratch) {
    for (int64_t b = 0; b < p.batch; ++b) backward_row<T>(p, b, j0, w, scratch);
  }
};

struct CpuPolicy : TimeLoops {
  static Tensor workspace(at::IntArrayRef sizes, const at::TensorOptions& opts) {
    return cudnn_rnn::workspace(sizes, opts);
  }

  // float32 weight gradients on the packed kernel's AVX-512 build where it serves the shape
  // (cpu/plan_packed.cpp).
  static Tensor weight_grad(const Tensor& A, const Tensor& D) { return cpu::packed_weight_grad(A, D); }

  // bfloat16 from float32 or bfloat16 through the tiled transposes (cpu/bf16_gemm.h); the rest
  // through ATen.
  static Tensor transposed_to(const Tensor& A, at::ScalarType dtype) {
    const bool from_float = A.scalar_type() == at::kFloat, from_bf16 = A.scalar_type() == at::kBFloat16;
    if (dtype != at::kBFloat16 || !(from_float || from_bf16) || A.dim() != 2 || A.stride(1) != 1) {
      return driver::PolicyDefaults::transposed_to(A, dtype);
    }
    Tensor out = workspace({A.size(1), A.size(0)}, A.options().dtype(at::kBFloat16));
    if (from_float) {
      cpu::transpose_to_bf16(A.data_ptr<float>(), A.size(0), A.size(1), A.stride(0), out.data_ptr<at::BFloat16>(),
                             A.size(0));
    } else {
      cpu::transpose_bf16(A.data_ptr<at::BFloat16>(), A.size(0), A.size(1), A.stride(0), out.data_ptr<at::BFloat16>(),
                          A.size(0));
    }
    return out;
  }

  // The input projection and the input gradient on the call's engine (cpu/plan_choice.cpp).
  template <typename T>
  static bool row_gemm(const RnnConfig& cfg, const Tensor& in2, const Tensor& rows, const Tensor& W, bool trans_w,
                       const Tensor& bias, bool accumulate, const Tensor& out2, const Tensor& in2_low = Tensor()) {
    return cpu::row_gemm<T>(cfg, in2, rows, W, trans_w, bias, accumulate, out2, in2_low);
  }

  template <typename T>
  static void gru_before_gates(const ForwardStep<T>& p) {
    const int64_t u = p.units, G = p.gates, S = p.saved_width;
    at::parallel_for(0, p.batch, grain(u, G), [&](int64_t b0, int64_t b1) {
      std::vector<T> scratch(cpu::row_scratch_size(u));
      std::vector<T> hd(u);
      for (int64_t b = b0; b < b1; ++b) {
        const T* hp = p.h_prev + b * u;
        for (int64_t j = 0; j < u; ++j) hd[j] = p.mask_h ? hp[j] * p.mask_h[b * u + j] : hp[j];
        cpu::gru_before_row_gates<T>(p.ract, u, p.xw.row(p.t, b), p.rec + b * G * u, hd.data(), p.saved + b * S,
                                     p.rh + b * u, scratch.data());
      }
    });
  }

  template <typename T>
  static void forward_step(const ForwardStep<T>& p) {
    const int64_t u = p.units, G = p.gates;
    at::parallel_for(0, p.batch, grain(u, G), [&](int64_t b0, int64_t b1) {
      std::vector<T> scratch(cpu::row_scratch_size(u));
      for (int64_t b = b0; b < b1; ++b) {
        if (!p.mask || p.mask[b * p.time + p.t]) p.seen[b] = 1;
        forward_row<T>(p, b, 0, u, p.xw.row(p.t, b), u, p.rec + b * G * u, u, scratch.data());
      }
    });
  }

  template <typename T>
  static void backward_step(const BackwardStep<T>& p) {
    const int64_t u = p.units, G = p.gates;
    at::parallel_for(0, p.batch, grain(u, G), [&](int64_t b0, int64_t b1) {
      std::vector<T> scratch(cpu::row_scratch_size(u));
      for (int64_t b = b0; b < b1; ++b) backward_row<T>(p, b, 0, u, scratch.data());
    });
  }

  template <typename T>
  static void gru_before_backward_b(const BackwardStep<T>& p) {
    const int64_t u = p.units, G = p.gates, S = p.saved_width;
    at::parallel_for(0, p.batch, grain(u, G), [&](int64_t b0, int64_t b1) {
      std::vector<T> scratch(cpu::row_scratch_size(u));
      for (int64_t b = b0; b < b1; ++b) {
        const bool real = p.mask ? p.mask[b * p.time + p.t] : true;
        if (!real) continue;
        T* dxr = p.dxw.row(p.t, b);
        cpu::gru_before_row_backward_b<T>(p.ract, u, p.saved + b * S, p.h_prev + b * u,
                                          p.mask_h ? p.mask_h + b * u : nullptr, p.d_rh + b * u, dxr,
                                          p.dh_next + b * u, scratch.data());
        T* drr = p.drec + b * G * u;
        for (int64_t j = 0; j < u; ++j) drr[u + j] = dxr[u + j];
      }
    });
  }
};

struct CpuBackend {
  static ForwardResult forward(RnnConfig cfg, const ForwardCall& call) {
    cfg.keep_saved = call.need_grad;  // inference: no per-step activations to keep (and no pages to fault in)
    return driver::forward_any_precision<CpuPolicy>(cfg, call);
  }
  static BackwardResult backward(const RnnConfig& cfg, const BackwardCall& call) {
    return driver::backward_any_precision<CpuPolicy>(cfg, call);
  }
};

}  // namespace

int cpu::StepScheduler::set_blas_threads(int n) {
  return MKL_Set_Num_Threads_Local ? MKL_Set_Num_Threads_Local(n) : 0;
}

cpu::UnitBlocks::UnitBlocks(int64_t batch, int64_t units, int64_t gates) {
  const int64_t work = batch * gates * units * units;  // multiply-adds of one step's GEMM
  n = std::min<int64_t>({at::get_num_threads(), std::max<int64_t>(1, work >> 15), std::max<int64_t>(1, units / 16)});
  for (int64_t k = 0; k <= n; ++k) start.push_back(k == n ? units : (units * k / n + 8) / 16 * 16);
}

TORCH_LIBRARY_IMPL(cudnn_rnn, CPU, m) { OpAdapter<Validated<CpuBackend>>::register_kernels(m); }

}  // namespace cudnn_rnn
