// The brgemm plan: oneDNN's float32 micro-kernel through at::native::cpublas::brgemm (JIT for the
// machine's ISA), opt-in (CUDNN_RNN_CPU_GEMM=brgemm). Forward reads gate g's columns of the
// recurrent kernel in place (leading dimension G*u); backward reads R^T, made once per call
// (brgemm takes no transposed operand). The active rows of a masked step are gathered.
#include <ATen/native/CPUBlas.h>

#include "cpu/step_plan.h"

namespace cudnn_rnn {
namespace cpu {
namespace {

using at::Tensor;

// Row-major C[M, N] (leading dimension ldc) = A[M, K] · B[K, N] (+ C with add_C), on the calling thread.
void brgemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* Bm, int64_t ldb, bool add_C,
            float* C, int64_t ldc) {
#if defined(CPUBLAS_BRGEMM_F32F32F32)
  at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, add_C, A, Bm, C);
#else
  TORCH_INTERNAL_ASSERT(false, "brgemm: a torch with cpublas::brgemm only");
#endif
}

class BrgemmForward final : public ForwardPlan<float> {
 public:
  explicit BrgemmForward(const PlanArgs& p)
      : G_(p.cfg.gates()), u_(p.cfg.units), blocks_(p.blocks), R_(p.a.w.recurrent.data_ptr<float>()),
        bias_(p.step_bias), state_(p) {}

  void begin_step(int64_t, const ActiveRows& act, const ForwardStep<float>& step) override { state_.gather(act, step); }

  void product(int64_t k, const ActiveRows& act, const ForwardStep<float>&, float* r) override {
    const int64_t j0 = blocks_.start[k], w = blocks_.width(k), ldr = G_ * w;
    const float* bias = bias_.defined() ? bias_.const_data_ptr<float>() : nullptr;
    for (int64_t g = 0; g < G_; ++g) {
      float* c = r + g * w;
      for (int64_t i = 0; i < act.n && bias; ++i) std::copy(bias + g * u_ + j0, bias + g * u_ + j0 + w, c + i * ldr);
      brgemm(act.n, w, u_, state_.h, u_, R_ + g * u_ + j0, G_ * u_, bias != nullptr, c, ldr);
    }
  }

 private:
  int64_t G_, u_;
  const UnitBlocks& blocks_;
  const float* R_;
  Tensor bias_;
  GatheredState<float> state_;
};

class BrgemmBackward final : public BackwardPlan<float> {
 public:
  explicit BrgemmBackward(const PlanArgs& p)
      : G_(p.cfg.gates()), u_(p.cfg.units), B_(p.cfg.batch), blocks_(p.blocks),
        RT_(p.a.w.recurrent.t().contiguous()), grads_(p) {}

  void begin_grads(int64_t, const ActiveRows& act, const float* D, int64_t ld) override {
    grads_.gather(act, B_, G_ * u_, D, ld);
  }

  void add_grad(int64_t k, const ActiveRows& act, float* dh) override {
    const int64_t j0 = blocks_.start[k], w = blocks_.width(k), K = G_ * u_;
    const float* RT = RT_.const_data_ptr<float>();  // [G*u, u]
    if (act.n == B_) {
      brgemm(B_, w, K, grads_.D, grads_.ld, RT + j0, u_, true, dh + j0, u_);
    } else if (act.n > 0) {
      float* tmp = grads_.tmp_of(k);
      brgemm(act.n, w, K, grads_.rows(), K, RT + j0, u_, false, tmp, w);
      scatter_add<float>(act, tmp, w, u_, j0, dh);
    }
  }

 private:
  int64_t G_, u_, B_;
  const UnitBlocks& blocks_;
  Tensor RT_;
  GatheredGrads<float> grads_;
};

}  // namespace

std::unique_ptr<ForwardPlan<float>> brgemm_forward_plan(const PlanArgs& p) {
  return std::make_unique<BrgemmForward>(p);
}
std::unique_ptr<BackwardPlan<float>> brgemm_backward_plan(const PlanArgs& p) {
  return std::make_unique<BrgemmBackward>(p);
}

}  // namespace cpu
}  // namespace cudnn_rnn
