// CPU backend of the recurrent stack ops: the device-generic driver (rnn_driver.h) with a time
// loop of its own (TimeLoops below) for LSTM, GRU reset_after=True and SimpleRNN without
// recurrent dropout, and row loops in parallel over batch rows for the rest. Each row's gates
// are activated as arrays (cell_rows.h, vectorised). float16 and bfloat16 compute in float32.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
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
#include "cpu/fma_peak.h"
#include "cpu/packed_gemm.h"
#include "cpu/step_plan.h"
#include "cpu/weight_cache.h"
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

// Asks for the cache lines of a row's G gates of w values (gate stride u) a couple of rows before
// the cell reads them: the forward's hoisted projection and the backward's saved gates were
// written long before the step reads them and have left L2 ([T, B, 4u] each: 6.5 MB for an LSTM at
// T=50, B=128, H=64, whose one-thread training forward ran 5-8 % faster with the prefetches, its
// training 4 % faster).
template <typename T>
void prefetch_gates(const T* x, int64_t G, int64_t u, int64_t w) {
  for (int64_t q = 0; q < G; ++q) {
    const char* p = reinterpret_cast<const char*>(x + q * u);
    for (int64_t off = 0; off < int64_t(w * sizeof(T)); off += 64) __builtin_prefetch(p + off);
  }
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

  // The driver hoists the projection unless projects_input_in_loop said the plan projects it; the
  // plan decides again when it is built (from the same settings, which another thread could change
  // in between: set_cpu_plan). A plan that reads the hoisted projection must have one.
  template <typename T>
  static void check_projection(const cpu::ForwardPlan<T>& plan, const ForwardStep<T>& step) {
    int64_t stride = 0;
    TORCH_CHECK(plan.cell_input(0, &stride) != nullptr || step.xw.data != nullptr || step.batch == 0,
                "cudnn_rnn: the CPU plan changed during the call (cudnn_rnn.set_cpu_plan from another thread?); "
                "run the call again");
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
    if (cpu::choose_split(B, u, G, at::get_num_threads(), cpu::plan_rows_apart<T>(cfg, false)) == cpu::Split::Rows) {
      const cpu::UnitBlocks whole(u);
      const auto plan = cpu::forward_plan<T>({cfg, a, whole, step_bias, step.mask != nullptr, true});
      TORCH_INTERNAL_ASSERT(plan->rows_apart(), "time_loop_forward: plan_rows_apart and the plan disagree");
      forward_by_rows(cfg, a, step, *plan);
      return true;
    }
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
      if (s == 0) check_projection(*plan, step);
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
    if (cpu::choose_split(B, u, G, at::get_num_threads(), cpu::plan_rows_apart<T>(cfg, true)) == cpu::Split::Rows) {
      const cpu::UnitBlocks whole(u);
      const auto plan = cpu::backward_plan<T>({cfg, a, whole, Tensor(), step.mask != nullptr, true},
                                              {step, dxw, drec, extras});
      backward_by_rows(cfg, a, step, dh, drec, extras, *plan);
      return true;
    }
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
  // Row groups, one per thread: [B * g / n, B * (g + 1) / n).
  static int64_t row_groups(int64_t B) { return std::min<int64_t>(B, std::max(1, at::get_num_threads())); }

  // The row split's forward: each thread runs its rows through every step, no barrier between
  // steps (its own step fields, active rows, product and scratch buffers).
  template <typename T>
  static void forward_by_rows(const RnnConfig& cfg, const driver::DirectionArgs& a, const ForwardStep<T>& step,
                              cpu::ForwardPlan<T>& plan) {
    const int64_t B = cfg.batch, u = cfg.units, G = cfg.gates(), n = row_groups(B);
    at::parallel_for(0, n, 1, [&](int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t b0 = B * g / n, b1 = B * (g + 1) / n;
        ForwardStep<T> st = step;
        cpu::ActiveRows act(B);
        std::vector<T> rec((b1 - b0) * G * u), scratch(cpu::row_scratch_size(u));
        int64_t xw_stride = 0;
        const T* xw = plan.cell_input(0, &xw_stride);  // null: the hoisted projection
        for (int64_t s = 0; s < cfg.time; ++s) {
          driver::set_forward_step(st, cfg, a, s);
          if (s == 0) check_projection(plan, st);
          act.collect(st.mask, b0, b1, cfg.time, st.t);
          if (act.n > 0) plan.product(0, act, st, rec.data());
          forward_rows<T>(st, b0, b1, 0, u, xw, xw_stride, rec.data(), scratch.data());
          for (int64_t b = b0; b < b1 && st.mask; ++b) st.seen[b] |= st.mask[b * cfg.time + st.t];
        }
      }
      plan.end_task();
    });
  }

  // The row split's backward.
  template <typename T>
  static void backward_by_rows(const RnnConfig& cfg, const driver::DirectionArgs& a, const BackwardStep<T>& step,
                               Tensor& dh, const Tensor& drec, driver::BackwardExtras& extras,
                               cpu::BackwardPlan<T>& plan) {
    const int64_t B = cfg.batch, u = cfg.units, G = cfg.gates(), Tn = cfg.time, n = row_groups(B);
    const bool gru = cfg.cell == CellKind::GRU;
    cpu::ActiveRows none(B);
    none.n = 0;
    TORCH_INTERNAL_ASSERT(plan.add_grad_rows(0, none, nullptr, 0, nullptr), "backward_by_rows: a plan that runs rows apart");
    Tensor dh_next = at::empty({B, u}, dh.options());
    const int64_t width = (gru ? 2 : 1) * G * u;
    Tensor sums = extras.bias_sums ? at::zeros({n, width}, dh.options().dtype(at::kDouble)) : Tensor();
    double* sums_p = sums.defined() ? sums.data_ptr<double>() : nullptr;
    T* dh_p = dh.data_ptr<T>();
    T* dh_next_p = dh_next.data_ptr<T>();
    const T* drec_p = gru ? drec.data_ptr<T>() : nullptr;
    auto time_of = [&](int64_t s) { return cfg.reversed(a.dir) ? Tn - 1 - s : s; };
    at::parallel_for(0, n, 1, [&](int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t b0 = B * g / n, b1 = B * (g + 1) / n;
        BackwardStep<T> st = step;
        cpu::ActiveRows act(B), act_later(B);
        std::vector<T> scratch(cpu::row_scratch_size(u));
        T* cur = dh_p;
        T* next = dh_next_p;
        auto grads_of = [&](int64_t s) -> std::pair<const T*, int64_t> {
          if (gru) return {drec_p + s * B * G * u, G * u};
          return {st.dxw.row(time_of(s), 0), st.dxw.row_stride};
        };
        for (int64_t s = Tn - 1; s >= 0; --s) {
          driver::set_backward_step(st, cfg, a, s, cur, next);
          st.drec = gru ? const_cast<T*>(drec_p) + s * B * G * u : nullptr;
          act.collect(st.mask, b0, b1, Tn, st.t);
          if (s + 1 < Tn && act_later.n > 0) {
            const auto [D, ld] = grads_of(s + 1);
            plan.add_grad_rows(s + 1, act_later, D, ld, cur);
          }
          backward_rows<T>(st, b0, b1, 0, u, scratch.data());
          plan.end_rows(s, b0, b1, st);
          if (sums_p) {
            double* acc = sums_p + g * width;
            const int64_t t = st.t;
            add_rows_to_f64<T>(st.dxw.row(t, b0), st.dxw.row_stride, b1 - b0, G * u, acc);
            if (gru) add_rows_to_f64<T>(st.drec + b0 * G * u, G * u, b1 - b0, G * u, acc + G * u);
          }
          std::swap(cur, next);
          std::swap(act, act_later);
        }
        if (act_later.n > 0) {
          const auto [D, ld] = grads_of(0);
          plan.add_grad_rows(0, act_later, D, ld, cur);
        }
      }
      plan.end_task();
    });
    if (Tn % 2) std::swap(dh, dh_next);  // every group swapped its two buffers Tn times
    if (sums_p) {
      const Tensor total = sums.sum(0).view({gru ? 2 : 1, G * u});
      extras.dbias = (gru ? total : total[0]).to(dh.scalar_type());
    }
  }

  // Units [j0, j0 + w) of one forward step, every row, given the step's recurrent products of
  // those units (rec: [active rows, G*w], gate stride w; its row i belongs to the i-th real row).
  // xw: those units' input projections in the same form (rows of the real rows, gate stride w,
  // xw_stride apart: 0 for one row every row reads) when the loop projected them, or null for
  // the hoisted projection's.
  template <typename T>
  static void forward_block(const ForwardStep<T>& p, int64_t j0, int64_t w, const T* xw, int64_t xw_stride,
                            const T* rec, T* scratch) {
    forward_rows<T>(p, 0, p.batch, j0, w, xw, xw_stride, rec, scratch);
  }

  // The same for rows [b0, b1) (rec's rows: the real ones among them).
  template <typename T>
  static void forward_rows(const ForwardStep<T>& p, int64_t b0, int64_t b1, int64_t j0, int64_t w, const T* xw,
                           int64_t xw_stride, const T* rec, T* scratch) {
    const T* recr = rec;
    const T* xwr = xw;
    for (int64_t b = b0; b < b1; ++b) {
      const bool real = p.mask ? p.mask[b * p.time + p.t] : true;
      if (xw) {
        forward_row<T>(p, b, j0, w, xwr, w, recr, w, scratch);
      } else {
        if (b + 2 < b1) prefetch_gates(p.xw.row(p.t, b + 2) + j0, p.gates, p.units, w);
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
    backward_rows<T>(p, 0, p.batch, j0, w, scratch);
  }

  template <typename T>
  static void backward_rows(const BackwardStep<T>& p, int64_t b0, int64_t b1, int64_t j0, int64_t w, T* scratch) {
    for (int64_t b = b0; b < b1; ++b) {
      if (b + 2 < b1) prefetch_gates(p.saved + (b + 2) * p.saved_width + j0, p.saved_width / p.units, p.units, w);
      backward_row<T>(p, b, j0, w, scratch);
    }
  }
};

struct CpuPolicy : TimeLoops {
  static Tensor workspace(at::IntArrayRef sizes, const at::TensorOptions& opts) {
    return cudnn_rnn::workspace(sizes, opts);
  }

  // The float32 copy of a float16 / bfloat16 weight, kept in the weight cache while the weight is
  // unchanged (a training step's backward reuses its forward's; inference converts once):
  // converting into fresh memory on every call costs about a fifth of a one-thread bfloat16 LSTM
  // training step at H=512, B=8.
  static Tensor float_weight(const Tensor& w) {
    return cpu::cached_pack(w, "float32 copy", [&] { return w.to(at::kFloat); });
  }

  // float32 weight gradients on the packed kernel where it serves the shape, several operands in
  // one product (cpu/plan_packed.cpp).
  static Tensor weight_grad(const std::vector<std::pair<Tensor, Tensor>>& parts, const Tensor& D, bool ones) {
    return cpu::packed_weight_grad(parts, D, ones);
  }

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
                       const Tensor& bias, bool accumulate, const Tensor& out2, const Tensor& in2_low = Tensor(),
                       const Tensor& W_low = Tensor()) {
    return cpu::row_gemm<T>(cfg, in2, rows, W, trans_w, bias, accumulate, out2, in2_low, W_low);
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

// rnn_forward_int8: rnn_forward's inference on the int8 plan (plan_int8.cpp), float32 in and out.
struct CpuInt8Backend {
  static ForwardResult forward(RnnConfig cfg, const ForwardCall& call) {
    TORCH_CHECK_TYPE(call.in.x.scalar_type() == at::kFloat, "rnn_forward_int8: x must be float32 (a quantized ",
                     "layer computes in float32 between its int8 products); got ", call.in.x.scalar_type());
    cfg.keep_saved = false;
    cfg.gemm_dtype = at::kQInt8;
    return driver::forward<CpuPolicy>(cfg, call);
  }
};

std::tuple<Tensor, Tensor, Tensor> rnn_forward_int8(const Tensor& x, at::TensorList weights, const OptTensor& mask,
                                                    const OptTensor& h0, const OptTensor& c0, c10::string_view cell,
                                                    c10::string_view activation,
                                                    c10::string_view recurrent_activation, bool use_bias,
                                                    bool reset_after, int64_t num_layers, bool bidirectional,
                                                    bool go_backwards, bool zero_output_for_mask) {
  auto [y, h_n, c_n, reserve] = OpAdapter<Validated<CpuInt8Backend>>::forward(
      x, weights, mask, h0, c0, {}, {}, cell, activation, recurrent_activation, use_bias, reset_after, num_layers,
      bidirectional, go_backwards, zero_output_for_mask, /*need_grad=*/false);
  return {y, h_n, c_n};
}

}  // namespace

int cpu::StepScheduler::set_blas_threads(int n) {
  return MKL_Set_Num_Threads_Local ? MKL_Set_Num_Threads_Local(n) : 0;
}

cpu::UnitBlocks::UnitBlocks(int64_t batch, int64_t units, int64_t gates) {
  const int64_t work = batch * gates * units * units;  // multiply-adds of one step's GEMM
  n = std::min<int64_t>({at::get_num_threads(), std::max<int64_t>(1, work >> 15), std::max<int64_t>(1, units / 16)});
  for (int64_t k = 0; k <= n; ++k) start.push_back(k == n ? units : (units * k / n + 8) / 16 * 16);
}

namespace cpu {
namespace {
std::atomic<int>& split_override() {
  static std::atomic<int> slot{-1};
  return slot;
}
int parse_split(const std::string& v, const char* what) {
  TORCH_CHECK_VALUE(v == "units" || v == "rows" || v == "auto", what, " must be 'units', 'rows' or 'auto'; got '", v,
                    "'");
  return v == "units" ? int(Split::Units) : v == "rows" ? int(Split::Rows) : -1;
}
}  // namespace

// 12 rows where the packed GEMM runs AVX-512 on a core with full-width 512-bit FMAs (twice the
// multiply-adds a cycle of the others: a thread's products then finish before the kernel has
// streamed in from L3), else 4.
int64_t rows_to_cover_kernel() {
  return packed_gemm_isa() == PackedIsa::Avx512 && full_width_avx512() ? 12 : 4;
}

Split choose_split(int64_t batch, int64_t units, int64_t gates, int64_t threads, bool plan_rows) {
  if (!plan_rows || threads < 2 || batch < 2) return Split::Units;
  const int forced = split_override().load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<Split>(forced);
  static const int from_environment = [] {
    const char* v = std::getenv("CUDNN_RNN_CPU_SPLIT");
    return v && *v ? parse_split(v, "CUDNN_RNN_CPU_SPLIT") : -1;
  }();
  if (from_environment >= 0) return static_cast<Split>(from_environment);
  // The row split reads the whole recurrent kernel (W bytes) on every thread each step, the unit
  // split a 1/threads share of it and pays a barrier a step. Measured on an AMD EPYC Zen 4 (2
  // threads; LSTM, T=50, I=H; AVX-512 and AVX2 builds of the packed kernel): rows won 1.0-1.95x
  // wherever W fits a quarter of L2 (H <= 128: 256 KiB of 1 MiB), and from 4 rows a thread up to
  // W = 8 L2 (H = 512: 1.03-1.1x); with 1-2 rows a thread at H >= 256 it lost (0.72-0.9x), and
  // at H = 1024 (16 MiB) the two were level.
  // Beyond L2 a thread's rows must also take long enough to cover streaming W from L3: a faster
  // core needs more of them (rows_to_cover_kernel). On an AMD EPYC Zen 5 (AVX-512 at 256-264
  // GFLOP/s a core, twice Zen 4's and twice its own AVX2 rate) the forward at H = 256-512 with 4
  // and 8 rows a thread ran 1.1-1.45x faster split by units, the two were level at 12 rows and
  // rows won from 16. At its AVX2 level (128 GFLOP/s a core, about Zen 4's) the two were within
  // 2-7 % either way at 4 and 8 rows, and it keeps Zen 4's 4. On an Intel Xeon (Ice Lake, 2
  // threads) the BLAS plan (MKL's packed GEMM) at H = 256 ran the B = 32 and B = 128 forwards
  // 2-9 % faster by rows (16 and 64 rows a thread), and H = 512 alike both ways. The bfloat16
  // plan (its recurrent and input kernels in bfloat16: about the float32 recurrent kernel's bytes)
  // follows the same rule: on the Zen 4, rows won by 2-20 % at H = 64-512, B = 8-128 and were
  // level with units at H = 1024 (16 MiB, where the rule keeps units).
  static const int64_t l2 = [] {
    const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return v > 0 ? static_cast<int64_t>(v) : int64_t(1) << 20;
  }();
  const int64_t kernel_bytes = gates * units * units * static_cast<int64_t>(sizeof(float));
  const int64_t rows_per_thread = batch / threads;
  if (rows_per_thread >= 1 && 4 * kernel_bytes <= l2) return Split::Rows;
  if (rows_per_thread >= rows_to_cover_kernel() && kernel_bytes <= 8 * l2) return Split::Rows;
  return Split::Units;
}

const char* split_name(Split s) { return s == Split::Rows ? "rows" : "units"; }

void override_split(const std::string& name) {
  split_override().store(name.empty() ? -1 : parse_split(name, "split"));
}
}  // namespace cpu

TORCH_LIBRARY_IMPL(cudnn_rnn, CPU, m) {
  OpAdapter<Validated<CpuBackend>>::register_kernels(m);
  m.impl("rnn_forward_int8", &rnn_forward_int8);
}

}  // namespace cudnn_rnn
