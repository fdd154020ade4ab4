// The BLAS plan: each unit block's gate columns of the recurrent kernel as one [u, G*w] matrix
// multiplied by sgemm_/dgemm_, or, for float32 where torch exports MKL's packed-GEMM API, packed
// once per call (6-8 % of a fastrnns LSTM forward went to the repacking inside every sgemm). The
// active rows of a masked step are gathered first; with one block (the row split's), by each row
// group for its own rows, read in place where they follow one another.
#include <ATen/Parallel.h>

#include <vector>

#include "cpu/blas.h"
#include "cpu/step_plan.h"

namespace cudnn_rnn {
namespace cpu {
namespace {

using at::Tensor;

// One MKL-packed op(B) per unit block for products of up to M rows: block k's op(B) is K x n,
// read from src with leading dimension ld (B [K, n], or with trans the transpose of B [n, K]).
// Each is packed by the task that will compute with it (MKL runs best with the same thread count
// for both; with one block, the row split's, it is packed on the calling thread and each row group
// computes on one).
struct PackSource {
  int64_t n;
  const float* src;
  int64_t ld;
};

template <typename Operand>
std::vector<Tensor> mkl_pack_blocks(const UnitBlocks& blocks, int64_t M, int64_t K, bool trans, Operand operand) {
  std::vector<Tensor> packed(blocks.n);
  std::vector<float*> dest(blocks.n);
  for (int64_t k = 0; k < blocks.n; ++k) {
    const size_t bytes = cblas_sgemm_pack_get_size(kCblasBMatrix, int(M), int(operand(k).n), int(K));
    packed[k] = at::empty({static_cast<int64_t>(bytes / sizeof(float)) + 16}, at::kFloat);
    dest[k] = packed[k].data_ptr<float>();
  }
  at::parallel_for(0, blocks.n, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const PackSource b = operand(k);
      cblas_sgemm_pack(kCblasRowMajor, kCblasBMatrix, trans ? kCblasTrans : kCblasNoTrans, int(M), int(b.n), int(K),
                       1.0f, b.src, int(b.ld), dest[k]);
    }
  });
  return packed;
}

template <typename T>
bool uses_mkl_packed() {
  return std::is_same_v<T, float> && have_mkl_packed();
}

template <typename T>
class BlasForward final : public ForwardPlan<T> {
 public:
  explicit BlasForward(const PlanArgs& p) : G_(p.cfg.gates()), u_(p.cfg.units), blocks_(p.blocks), state_(p) {
    const Tensor& R = p.a.w.recurrent;
    kernel_.resize(blocks_.n), bias_.resize(blocks_.n), mkl_.resize(blocks_.n);
    for (int64_t k = 0; k < blocks_.n; ++k) {
      const int64_t j0 = blocks_.start[k], w = blocks_.width(k);
      kernel_[k] = blocks_.n == 1 ? R : block_columns(R, G_, u_, j0, w);
      if (p.step_bias.defined()) bias_[k] = block_columns(p.step_bias, G_, u_, j0, w);
    }
    if constexpr (std::is_same_v<T, float>) {
      if (uses_mkl_packed<T>()) {
        mkl_ = mkl_pack_blocks(blocks_, p.cfg.batch, u_, false, [&](int64_t k) {
          return PackSource{G_ * blocks_.width(k), kernel_[k].const_data_ptr<float>(), G_ * blocks_.width(k)};
        });
      }
    }
  }

  // One block (every unit: the row split, or a unit split of one block): product() takes its own
  // rows, so that row groups may run it at once.
  void begin_step(int64_t, const ActiveRows& act, const ForwardStep<T>& step) override {
    if (blocks_.n > 1) state_.gather(act, step);
  }

  void product(int64_t k, const ActiveRows& act, const ForwardStep<T>& step, T* r) override {
    const int64_t ldr = G_ * blocks_.width(k);
    const bool bias = bias_[k].defined();
    if (bias) fill_rows<T>(bias_[k].const_data_ptr<T>(), ldr, act.n, r);
    const T* h = blocks_.n > 1 ? state_.h : state_.group_rows(act, step);
    if constexpr (std::is_same_v<T, float>) {
      if (mkl_[k].defined()) {
        mkl_packed_gemm(act.n, ldr, u_, h, u_, mkl_[k].const_data_ptr<float>(), bias ? 1.0f : 0.0f, r, ldr);
        return;
      }
    }
    blas_gemm<T>(false, act.n, ldr, u_, h, u_, kernel_[k].const_data_ptr<T>(), ldr, bias ? T(1) : T(0), r, ldr);
  }

  bool rows_apart() const override { return blocks_.n == 1; }

 private:
  int64_t G_, u_;
  const UnitBlocks& blocks_;
  GatheredState<T> state_;
  std::vector<Tensor> kernel_, bias_, mkl_;
};

template <typename T>
class BlasBackward final : public BackwardPlan<T> {
 public:
  explicit BlasBackward(const PlanArgs& p)
      : G_(p.cfg.gates()), u_(p.cfg.units), B_(p.cfg.batch), blocks_(p.blocks), R_(p.a.w.recurrent.data_ptr<T>()),
        grads_(p), mkl_(blocks_.n) {
    if constexpr (std::is_same_v<T, float>) {
      if (uses_mkl_packed<T>()) {  // each block's R[j0 : j0 + w, :]^T
        mkl_ = mkl_pack_blocks(blocks_, B_, G_ * u_, true, [&](int64_t k) {
          return PackSource{blocks_.width(k), R_ + blocks_.start[k] * G_ * u_, G_ * u_};
        });
      }
    }
  }

  void begin_grads(int64_t, const ActiveRows& act, const T* D, int64_t ld) override {
    grads_.gather(act, B_, G_ * u_, D, ld);
  }

  void add_grad(int64_t k, const ActiveRows& act, T* dh) override {
    const int64_t j0 = blocks_.start[k], w = blocks_.width(k), K = G_ * u_;
    if (act.n == 0) return;
    const bool all = act.n == B_;
    const T* D = all ? grads_.D : grads_.rows();
    const int64_t ld = all ? grads_.ld : K;
    T* C = all ? dh + j0 : grads_.tmp_of(k);
    const int64_t ldc = all ? u_ : w;
    const T beta = all ? T(1) : T(0);
    bool done = false;
    if constexpr (std::is_same_v<T, float>) {
      if (mkl_[k].defined()) {
        mkl_packed_gemm(act.n, w, K, D, ld, mkl_[k].const_data_ptr<float>(), beta, C, ldc);
        done = true;
      }
    }
    if (!done) blas_gemm<T>(true, act.n, w, K, D, ld, R_ + j0 * K, K, beta, C, ldc);
    if (!all) scatter_add<T>(act, C, w, u_, j0, dh);
  }

  // The row split's (one block of every unit): a row group's active rows, read and added in place
  // where they follow one another, else gathered into the group's own rows of the scratch
  // (ActiveRows::group_block) and added back.
  bool add_grad_rows(int64_t, const ActiveRows& act, const T* D, int64_t ld, T* dh) override {
    if (blocks_.n != 1) return false;
    if (act.n == 0) return true;
    const int64_t K = G_ * u_;
    const auto block = act.group_block(D, ld, K, grads_.compact_p);
    const bool in_place = block.in_place;
    const T* A = block.data;
    const int64_t lda = block.ld;
    T* C = (in_place ? dh : grads_.tmp_of(0)) + act.rows[0] * u_;
    const T beta = in_place ? T(1) : T(0);
    bool done = false;
    if constexpr (std::is_same_v<T, float>) {
      if (mkl_[0].defined()) {
        mkl_packed_gemm(act.n, u_, K, A, lda, mkl_[0].const_data_ptr<float>(), beta, C, u_);
        done = true;
      }
    }
    if (!done) blas_gemm<T>(true, act.n, u_, K, A, lda, R_, K, beta, C, u_);
    if (!in_place) scatter_add<T>(act, C, u_, u_, 0, dh);
    return true;
  }

 private:
  int64_t G_, u_, B_;
  const UnitBlocks& blocks_;
  const T* R_;
  GatheredGrads<T> grads_;
  std::vector<Tensor> mkl_;
};

}  // namespace

template <typename T>
std::unique_ptr<ForwardPlan<T>> blas_forward_plan(const PlanArgs& p) {
  return std::make_unique<BlasForward<T>>(p);
}
template <typename T>
std::unique_ptr<BackwardPlan<T>> blas_backward_plan(const PlanArgs& p) {
  return std::make_unique<BlasBackward<T>>(p);
}

template std::unique_ptr<ForwardPlan<float>> blas_forward_plan<float>(const PlanArgs&);
template std::unique_ptr<ForwardPlan<double>> blas_forward_plan<double>(const PlanArgs&);
template std::unique_ptr<BackwardPlan<float>> blas_backward_plan<float>(const PlanArgs&);
template std::unique_ptr<BackwardPlan<double>> blas_backward_plan<double>(const PlanArgs&);

}  // namespace cpu
}  // namespace cudnn_rnn
