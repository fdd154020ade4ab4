// Which plan a call's time loop runs (step_plan.h): bfloat16 for a bfloat16 call where the CPU
// multiplies bfloat16; else the float32 engine gemm_engine.h names for the shape; float64 on
// BLAS. The one place the CPU backend chooses an engine.
#include "cpu/bf16_gemm.h"
#include "cpu/blas.h"
#include "cpu/gemm_engine.h"
#include "cpu/int8_gemm.h"
#include "cpu/step_plan.h"
#include "cpu/time_loop.h"

#include <cstdlib>
#include <string>

namespace cudnn_rnn {
namespace cpu {

template <typename T>
bool bf16_plan(const RnnConfig& cfg) {
  return std::is_same_v<T, float> && cfg.gemm_dtype == at::kBFloat16 && bf16_gemm_available();
}

template <typename T>
bool int8_plan(const RnnConfig& cfg) {
  return std::is_same_v<T, float> && cfg.gemm_dtype == at::kQInt8 && int8_gemm_available() &&
         cfg.units <= kInt8MaxDepth;
}

template <typename T>
PlanKind forward_plan_kind(const RnnConfig& cfg);
template <typename T>
bool plan_rows_apart(const RnnConfig& cfg, bool backward);

// The packed plan's in-loop projection, for inference over more than one step with the batch rows
// split between the threads (the whole kernel's panels, shared with the hoisted projection's cache
// entry; LSTM and SimpleRNN:
// the input product accumulates into the recurrent one; GRU's candidate gate reads them apart):
// no [T, B, G*u] projection written before the loop and read back by the cell. On an AMD EPYC
// Zen 4 it took the B=128, H=128-256 LSTM forward from 0.87-0.96x torch.nn to 1.01-1.05x; in
// training (0.94-1.01x against 0.96-1.07x) and for one step (per-call set-up) the hoisted
// projection stays ahead. CUDNN_RNN_CPU_PROJECTION=hoisted keeps the hoisted one, for measurement.
bool packed_projects_input() {
  static const bool on = [] {
    const char* v = std::getenv("CUDNN_RNN_CPU_PROJECTION");
    return !(v && std::string(v) == "hoisted");
  }();
  return on;
}

template <typename T>
bool plan_projects_input(const RnnConfig& cfg, const driver::DirectionArgs& a) {
  if (a.dmask.defined()) return false;
  if (bf16_plan<T>(cfg)) return true;
  return forward_plan_kind<T>(cfg) == PlanKind::Packed && cfg.cell != CellKind::GRU && !cfg.keep_saved &&
         cfg.time > 1 && a.x3.is_contiguous() && a.w.kernel.is_contiguous() && packed_projects_input() &&
         choose_split(cfg.batch, cfg.units, cfg.gates(), at::get_num_threads(), plan_rows_apart<T>(cfg, false)) ==
             Split::Rows;
}

template <typename T>
bool plan_rows_apart(const RnnConfig& cfg, bool backward) {
  const int64_t u = cfg.units, G = cfg.gates();
  if (int8_plan<T>(cfg)) return !backward;
  // bfloat16: LSTM and SimpleRNN on the AVX512_BF16 kernel (measured); oneDNN's AMX tiles multiply
  // several times faster, which the row split's rule (streaming the kernel from L3 covered by a
  // thread's rows) was not fitted for, so they keep the unit blocks.
  if (bf16_plan<T>(cfg)) return cfg.cell != CellKind::GRU && std::string(bf16_gemm_kernel()) == "avx512_bf16";
  if (!std::is_same_v<T, float>) return false;
  // The packed plan, and the BLAS plan where MKL's packed GEMM runs it (one thread per row group:
  // MKL inside a parallel region; measured on x86-64 Intel, where it is the default from K x N =
  // 2^18).
  const GemmEngine e = backward ? float_gemm_engine(G * u, u) : float_recurrent_engine(u, G * u, cfg.batch, cfg.time);
  return e == GemmEngine::Packed || (e == GemmEngine::Blas && have_mkl_packed());
}

template <typename T>
PlanKind forward_plan_kind(const RnnConfig& cfg) {
  if (int8_plan<T>(cfg)) return PlanKind::Int8;
  if (bf16_plan<T>(cfg)) return PlanKind::Bf16;
  if (!std::is_same_v<T, float>) return PlanKind::Blas;
  switch (float_recurrent_engine(cfg.units, cfg.gates() * cfg.units, cfg.batch, cfg.time)) {
    case GemmEngine::Packed: return PlanKind::Packed;
    case GemmEngine::Brgemm: return PlanKind::Brgemm;
    case GemmEngine::Blas: break;
  }
  return PlanKind::Blas;
}

const char* plan_kind_name(PlanKind kind) {
  static const char* kNames[] = {"int8", "bfloat16", "packed", "brgemm", "blas"};
  return kNames[static_cast<int>(kind)];
}

template <typename T>
std::unique_ptr<ForwardPlan<T>> forward_plan(const PlanArgs& p) {
  if constexpr (std::is_same_v<T, float>) {
    switch (forward_plan_kind<T>(p.cfg)) {
      case PlanKind::Int8: return int8_forward_plan(p);
      case PlanKind::Bf16: return bf16_forward_plan(p, plan_projects_input<T>(p.cfg, p.a));
      case PlanKind::Packed: return packed_forward_plan(p, plan_projects_input<T>(p.cfg, p.a));
      case PlanKind::Brgemm: return brgemm_forward_plan(p);
      case PlanKind::Blas: break;
    }
  }
  return blas_forward_plan<T>(p);
}

template <typename T>
std::unique_ptr<BackwardPlan<T>> backward_plan(const PlanArgs& p, const BackwardPlanArgs<T>& b) {
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_plan<T>(p.cfg)) return bf16_backward_plan(p, b);
    switch (float_gemm_engine(p.cfg.gates() * p.cfg.units, p.cfg.units)) {
      case GemmEngine::Packed: return packed_backward_plan(p);
      case GemmEngine::Brgemm: return brgemm_backward_plan(p);
      case GemmEngine::Blas: break;
    }
  }
  return blas_backward_plan<T>(p);
}

template <typename T>
bool row_gemm(const RnnConfig& cfg, const at::Tensor& in2, const at::Tensor& rows, const at::Tensor& W, bool trans_w,
              const at::Tensor& bias, bool accumulate, const at::Tensor& out2, const at::Tensor& in2_low,
              const at::Tensor& W_low) {
  if constexpr (std::is_same_v<T, float>) {
    if (int8_plan<T>(cfg)) return int8_row_gemm(in2, rows, W, trans_w, bias, accumulate, out2);
    if (bf16_plan<T>(cfg)) return bf16_row_gemm(in2, rows, W, trans_w, bias, accumulate, out2, in2_low, W_low);
    if (float_gemm_engine(in2.size(1), out2.size(1), rows.defined() ? rows.numel() : in2.size(0)) ==
        GemmEngine::Packed) {
      return packed_row_gemm(in2, rows, W, trans_w, bias, accumulate, out2);
    }
  }
  return false;
}

#define CUDNN_RNN_PLANS(T)                                                                                       \
  template bool bf16_plan<T>(const RnnConfig&);                                                                  \
  template bool int8_plan<T>(const RnnConfig&);                                                                  \
  template bool plan_rows_apart<T>(const RnnConfig&, bool);                                                     \
  template bool plan_projects_input<T>(const RnnConfig&, const driver::DirectionArgs&);                         \
  template PlanKind forward_plan_kind<T>(const RnnConfig&);                                                      \
  template std::unique_ptr<ForwardPlan<T>> forward_plan<T>(const PlanArgs&);                                    \
  template std::unique_ptr<BackwardPlan<T>> backward_plan<T>(const PlanArgs&, const BackwardPlanArgs<T>&);      \
  template bool row_gemm<T>(const RnnConfig&, const at::Tensor&, const at::Tensor&, const at::Tensor&, bool,    \
                            const at::Tensor&, bool, const at::Tensor&, const at::Tensor&, const at::Tensor&);
CUDNN_RNN_PLANS(float)
CUDNN_RNN_PLANS(double)
#undef CUDNN_RNN_PLANS

}  // namespace cpu
}  // namespace cudnn_rnn
