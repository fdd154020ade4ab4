// GEMM plans of the CPU time loop (cpu/rnn_cpu.cpp): what each step of a direction multiplies by,
// resolved once per call and direction, as oneDNN's ref_rnn binds its iteration GEMM in init().
// A plan owns its engine's view of the recurrent kernel (packed once per call, or taken from the
// weight cache while the kernel is unchanged: cpu/weight_cache.h) and whatever its engine reads
// gathered or converted; the time loop holds no engine choice, only the calls below.
//
// Engines (one file each): plan_packed.cpp (the packed-panel kernel of packed_gemm.h, AVX-512 or
// AVX2), plan_blas.cpp (BLAS; MKL's packed GEMM API where torch exports it; float64 always),
// plan_brgemm.cpp (oneDNN's float32 micro-kernel through cpublas::brgemm), plan_bf16.cpp
// (bfloat16 operands, float32 accumulation: bf16_gemm.h), plan_int8.cpp (quantized inference:
// int8 weights, AVX512_VNNI: int8_gemm.h). plan_choice.cpp picks one.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/rnn_driver.h"
#include "cpu/time_loop.h"

namespace cudnn_rnn {
namespace cpu {

// What a plan is built from: the call, the direction, the time loop's unit blocks, and the bias
// the loop wants under each step's recurrent product (the recurrent bias, with the input bias
// where the loop takes it; undefined for none).
struct PlanArgs {
  const RnnConfig& cfg;
  const driver::DirectionArgs& a;
  const UnitBlocks& blocks;
  at::Tensor step_bias;
  bool masked;  // the call has a mask (steps may have inactive rows)
  // The loop runs the row split (time_loop.h): forward, product per row group and step, then
  // end_task; backward, add_grad_rows(s + 1), the cell backward of step s, end_rows(s), then
  // end_task. No other hook is called, so a plan keeps no per-step state there.
  bool by_rows = false;
};

// One step of the forward loop. The loop calls, per step s: begin_step on its own thread, then
// in the tasks, for each unit block k: product (when the step has active rows), the cell update
// of the block (reading cell_input(k) as its input projection), end_block; end_task once a task.
template <typename T>
class ForwardPlan {
 public:
  virtual ~ForwardPlan() = default;
  // What the engine reads of step s's active rows, gathered or converted (the calling thread).
  virtual void begin_step(int64_t s, const ActiveRows& act, const ForwardStep<T>& step) {}
  // rec[i, g*w + j] = pre-activation of gate g, unit j0 + j of the i-th active row: h_prev · R
  // (and what this plan adds: the step bias, an input projection run in the loop) for block k.
  virtual void product(int64_t k, const ActiveRows& act, const ForwardStep<T>& step, T* rec) = 0;
  // The input projection block k's cell update reads ([B, G*w] rows `stride` apart, stride 0:
  // one row for every batch row), or null for the driver's hoisted projection (step.xw).
  virtual const T* cell_input(int64_t k, int64_t* stride) const { return nullptr; }
  // After block k's cell update (step.h_next holds its units).
  virtual void end_block(int64_t k, const ForwardStep<T>& step) {}
  virtual void end_task() {}
  // Whether product() may run for disjoint row sets on several threads at once (it keeps no
  // per-step state; it reads the rows in place or gathers them into the set's own rows of a
  // scratch): the row split (time_loop.h) needs it.
  virtual bool rows_apart() const { return false; }
};

// The backward loop's recurrent products: dh[:, block k] += D · R[block k's units, :]^T, where
// D holds the recurrent-side gate gradients of a step ([B, G*u] rows ld apart, zero on inactive
// rows). The loop calls begin_grads for the step whose gradients are complete, on its own thread,
// then add_grad per block in the tasks; after each block's cell backward, end_block.
template <typename T>
class BackwardPlan {
 public:
  virtual ~BackwardPlan() = default;
  // Step s's gradients as the engine reads them (gathered, converted).
  virtual void begin_grads(int64_t s, const ActiveRows& act, const T* D, int64_t ld) = 0;
  virtual void add_grad(int64_t k, const ActiveRows& act, T* dh) = 0;
  // Block k's units of step s's gate gradients are final (the bfloat16 plan converts them).
  virtual void end_block(int64_t k, int64_t s, const BackwardStep<T>& step) {}
  virtual void end_task() {}
  // The row split's product (a plan built on one unit block): dh[act rows] += D[act rows] · R^T,
  // D (step s's gradients) rows ld apart, or the plan's own copy of them (the bfloat16 plan's,
  // made by end_rows), with no state kept between calls, so threads may run it on disjoint rows
  // at once. False (and nothing done) where the plan cannot; called with no rows to ask.
  virtual bool add_grad_rows(int64_t s, const ActiveRows& act, const T* D, int64_t ld, T* dh) { return false; }
  // The row split's: rows [b0, b1) of step s's gate gradients are final, every row of the group
  // (inactive ones are zero) at every step (the bfloat16 plan converts them), on the thread of
  // that row group.
  virtual void end_rows(int64_t s, int64_t b0, int64_t b1, const BackwardStep<T>& step) {}
};

// What the backward loop is given besides the plan args: its step (a plan may point step.dxw at
// a buffer of its own), the gate gradients and the extras the driver asked for.
template <typename T>
struct BackwardPlanArgs {
  BackwardStep<T>& step;
  const at::Tensor& dxw;
  const at::Tensor& drec;
  driver::BackwardExtras& extras;
};

// For engines that read the active rows of a step gathered (BLAS, brgemm): forward, h_prev's
// active rows in one [n, u] matrix; backward, the gradients' active rows in one [n, G*u] matrix
// and a [n, w] product per block, added back into dh's rows.
template <typename T>
struct GatheredState {
  at::Tensor h_active;
  T* active = nullptr;   // h_active's data
  const T* h = nullptr;  // what product() reads, u apart

  GatheredState(const PlanArgs& p)
      : h_active(p.masked ? at::empty({p.cfg.batch, p.cfg.units}, p.a.x3.options()) : at::Tensor()),
        active(h_active.defined() ? h_active.data_ptr<T>() : nullptr) {}
  void gather(const ActiveRows& act, const ForwardStep<T>& step) {
    h = step.h_prev;
    if (act.n < step.batch) {
      act.gather(step.h_prev, step.units, step.units, active);
      h = active;
    }
  }
  // The row split's: the active rows of one row group (act.n > 0) as [act.n, u], in place or
  // gathered into h_active (ActiveRows::group_block).
  const T* group_rows(const ActiveRows& act, const ForwardStep<T>& step) const {
    if (act.n == step.batch) return step.h_prev;
    return act.group_block(step.h_prev, step.units, step.units, active).data;
  }
};

template <typename T>
struct GatheredGrads {
  at::Tensor compact;
  std::vector<at::Tensor> tmp;
  const T* D = nullptr;  // every row, ld apart
  int64_t ld = 0;

  T* compact_p = nullptr;    // compact's data
  std::vector<T*> tmp_p;     // tmp's

  GatheredGrads(const PlanArgs& p)
      : compact(p.masked ? at::empty({p.cfg.batch, p.cfg.gates() * p.cfg.units}, p.a.x3.options()) : at::Tensor()),
        tmp(p.blocks.n),
        compact_p(compact.defined() ? compact.data_ptr<T>() : nullptr),
        tmp_p(p.blocks.n) {
    for (int64_t k = 0; k < p.blocks.n; ++k) {
      tmp[k] = at::empty({p.cfg.batch, p.blocks.width(k)}, p.a.x3.options());
      tmp_p[k] = tmp[k].data_ptr<T>();
    }
  }
  void gather(const ActiveRows& act, int64_t batch, int64_t width, const T* d, int64_t l) {
    D = d, ld = l;
    if (compact.defined() && act.n < batch) act.gather(d, l, width, compact.data_ptr<T>());
  }
  const T* rows() const { return compact_p; }  // the active rows, width apart
  T* tmp_of(int64_t k) const { return tmp_p[k]; }
};

// The forward plan a call runs (plan_choice.cpp decides it once; explain() reports it).
enum class PlanKind { Int8, Bf16, Packed, Brgemm, Blas };
template <typename T>
PlanKind forward_plan_kind(const RnnConfig& cfg);
const char* plan_kind_name(PlanKind kind);  // "int8", "bfloat16", "packed", "brgemm", "blas"

template <typename T>
std::unique_ptr<ForwardPlan<T>> forward_plan(const PlanArgs& p);
template <typename T>
std::unique_ptr<BackwardPlan<T>> backward_plan(const PlanArgs& p, const BackwardPlanArgs<T>& b);

// Whether the forward plan projects each step's input itself (bfloat16, and the packed plan's LSTM
// and SimpleRNN inference over more than one step, without input dropout): the driver then
// hoists no projection.
template <typename T>
bool plan_projects_input(const RnnConfig& cfg, const driver::DirectionArgs& a);

// -- the engines (plan_*.cpp) ---------------------------------------------------------------------
template <typename T>
std::unique_ptr<ForwardPlan<T>> blas_forward_plan(const PlanArgs& p);
template <typename T>
std::unique_ptr<BackwardPlan<T>> blas_backward_plan(const PlanArgs& p);
std::unique_ptr<ForwardPlan<float>> packed_forward_plan(const PlanArgs& p, bool project_input);
std::unique_ptr<BackwardPlan<float>> packed_backward_plan(const PlanArgs& p);
std::unique_ptr<ForwardPlan<float>> brgemm_forward_plan(const PlanArgs& p);
std::unique_ptr<BackwardPlan<float>> brgemm_backward_plan(const PlanArgs& p);
std::unique_ptr<ForwardPlan<float>> bf16_forward_plan(const PlanArgs& p, bool project_input);
std::unique_ptr<BackwardPlan<float>> bf16_backward_plan(const PlanArgs& p, const BackwardPlanArgs<float>& b);
std::unique_ptr<ForwardPlan<float>> int8_forward_plan(const PlanArgs& p);

// Whether a call's GEMMs run on the bfloat16 plan: a bfloat16 call (run in float32) where
// bf16_gemm_available().
template <typename T>
bool bf16_plan(const RnnConfig& cfg);
// Whether a call runs on the int8 plan: a quantized call (rnn_forward_int8: RnnConfig::gemm_dtype
// kQInt8) where int8_gemm_available(); elsewhere it computes in float32.
template <typename T>
bool int8_plan(const RnnConfig& cfg);

// Whether the plan of a call runs rows apart (ForwardPlan::rows_apart, BackwardPlan::add_grad_rows):
// the packed float32 plan, the BLAS one where MKL's packed GEMM runs it, int8 inference, the
// bfloat16 plan's LSTM and SimpleRNN.
template <typename T>
bool plan_rows_apart(const RnnConfig& cfg, bool backward);

// out2[r] = (accumulate ? out2[r] : bias, or 0) + in2[r] · op(W) for the rows listed in `rows`
// (every row without), on the engine the call's plans use: the input projection and the input
// gradient. in2_low: in2 in bfloat16 with rows of bf16_depth(K) values, where the caller has it;
// W_low: W in the caller's precision, or undefined. False where that engine leaves the product to
// ATen.
template <typename T>
bool row_gemm(const RnnConfig& cfg, const at::Tensor& in2, const at::Tensor& rows, const at::Tensor& W, bool trans_w,
              const at::Tensor& bias, bool accumulate, const at::Tensor& out2, const at::Tensor& in2_low,
              const at::Tensor& W_low);
bool packed_row_gemm(const at::Tensor& in2, const at::Tensor& rows, const at::Tensor& W, bool trans_w,
                     const at::Tensor& bias, bool accumulate, const at::Tensor& out2);
bool int8_row_gemm(const at::Tensor& in2, const at::Tensor& rows, const at::Tensor& W, bool trans_w,
                   const at::Tensor& bias, bool accumulate, const at::Tensor& out2);
bool bf16_row_gemm(const at::Tensor& in2, const at::Tensor& rows, const at::Tensor& W, bool trans_w,
                   const at::Tensor& bias, bool accumulate, const at::Tensor& out2, const at::Tensor& in2_low,
                   const at::Tensor& W_low);

// Unit block [j0, j0 + w)'s columns of every gate of m ([K, G*u], or a bias [G*u]) as one
// contiguous [K, G*w] (or [G*w]) matrix: what one time-loop task multiplies by.
inline at::Tensor block_columns(const at::Tensor& m, int64_t G, int64_t u, int64_t j0, int64_t w) {
  const int64_t rows = m.dim() == 1 ? 1 : m.size(0);
  const at::Tensor b = m.reshape({rows, G, u}).narrow(2, j0, w).reshape({rows, G * w}).contiguous();
  return m.dim() == 1 ? b.view({G * w}) : b;
}

// The input and the step's recurrent biases summed ([G*u] float32, zeros without either): the
// cell's input row of a plan that adds each step's input product into the recurrent one (LSTM and
// SimpleRNN, whose gates add the two).
inline at::Tensor summed_biases(const PlanArgs& p) {
  at::Tensor sum = at::zeros({p.cfg.gates() * p.cfg.units}, p.a.x3.options());
  for (const at::Tensor& b : {p.a.w.bias_in, p.step_bias}) {
    if (b.defined()) sum.add_(b);
  }
  return sum;
}

// out[i, :] = v (width values) for i < n: a bias under a GEMM that adds to its output.
template <typename T>
void fill_rows(const T* v, int64_t width, int64_t n, T* out) {
  for (int64_t i = 0; i < n; ++i) std::copy(v, v + width, out + i * width);
}

// dh[rows[i], j0 : j0 + w] += tmp[i, :] for the active rows: a compact product scattered back.
template <typename T>
void scatter_add(const ActiveRows& act, const T* tmp, int64_t w, int64_t u, int64_t j0, T* dh) {
  for (int64_t i = 0; i < act.n; ++i) {
    T* d = dh + act.rows[i] * u + j0;
    for (int64_t j = 0; j < w; ++j) d[j] += tmp[i * w + j];
  }
}

}  // namespace cpu
}  // namespace cudnn_rnn
