// The packed plan: the packed-panel kernel of packed_gemm.h against the recurrent kernel packed
// gate by gate (forward: gate g's columns as the panels of a [u, u] matrix, so a block's gates
// are 16-column panels from unit j0 on) or as R^T's panels (backward, K = G*u). Masked rows are
// read and written in place through the step's row list: nothing is gathered.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/buffer_pool.h"
#include "cpu/gemm_engine.h"
#include "cpu/packed_gemm.h"
#include "cpu/step_plan.h"
#include "cpu/weight_cache.h"

namespace cudnn_rnn {
namespace cpu {
namespace {

using at::Tensor;

class PackedForward final : public ForwardPlan<float> {
 public:
  PackedForward(const PlanArgs& p, bool project_input)
      : G_(p.cfg.gates()), u_(p.cfg.units), B_(p.cfg.batch), blocks_(p.blocks), gate_panels_(packed_size(u_, u_)),
        bias_(p.step_bias), joint_(project_input) {
    const Tensor& R = p.a.w.recurrent;
    panels_ = cached_pack(R, "packed/gates", [&] {
      Tensor out = at::empty({G_ * gate_panels_}, R.options());
      const float* r = R.data_ptr<float>();
      float* d = out.data_ptr<float>();
      at::parallel_for(0, G_, 1, [&](int64_t g0, int64_t g1) {
        for (int64_t g = g0; g < g1; ++g) pack_panels(r + g * u_, G_ * u_, false, u_, u_, d + g * gate_panels_);
      });
      return out;
    });
    if (joint_) project_in_loop(p);
  }

  void product(int64_t k, const ActiveRows& act, const ForwardStep<float>& step, float* r) override {
    recurrent_product(k, act, step, r);
    if (!joint_) return;
    // r += x_t · K[block k]: the step's input product in place of a hoisted projection.
    const int64_t ldr = G_ * blocks_.width(k);
    packed_gemm(act.n, ldr, I_, x_ + step.t * x_time_stride_, {act.list(B_), x_row_stride_},
                kernel_panels_[k].const_data_ptr<float>(), nullptr, true, r, {nullptr, ldr});
  }

  const float* cell_input(int64_t k, int64_t* stride) const override {
    if (!joint_) return nullptr;
    *stride = 0;  // every row: the biases
    return joint_bias_[k].const_data_ptr<float>();
  }

 private:
  // LSTM and SimpleRNN, whose gates add the two products: each block's kernel columns packed
  // (cached while the kernel is unchanged), and the input and recurrent biases as the cell's
  // "input projection", one [G*w] row read for every batch row.
  void project_in_loop(const PlanArgs& p) {
    const driver::DirectionArgs& a = p.a;
    const Tensor& K = a.w.kernel;  // [I, G*u]
    I_ = K.size(0);
    const Tensor bias = summed_biases(p);
    bias_ = Tensor();
    kernel_panels_.resize(blocks_.n);
    joint_bias_.resize(blocks_.n);
    for (int64_t k = 0; k < blocks_.n; ++k) {
      const int64_t j0 = blocks_.start[k], w = blocks_.width(k);
      // The whole kernel's panels are the hoisted projection's form (packed_row_gemm's
      // "packed/rows"): one cache entry serves both, so a one-step call after a sequence packs
      // nothing.
      const std::string what = blocks_.n == 1 ? std::string("packed/rows")
                                              : "packed/kernel units " + std::to_string(j0) + "+" + std::to_string(w);
      kernel_panels_[k] = cached_pack(K, what.c_str(), [&] {
        const Tensor block = (blocks_.n == 1 ? K : block_columns(K, G_, u_, j0, w)).contiguous();
        Tensor out = at::empty({packed_size(I_, G_ * w)}, K.options());
        pack_panels(block.const_data_ptr<float>(), G_ * w, false, I_, G_ * w, out.data_ptr<float>());
        return out;
      });
      joint_bias_[k] = block_columns(bias, G_, u_, j0, w);
    }
    const int64_t B = p.cfg.batch, T = p.cfg.time;
    x_ = a.x3.const_data_ptr<float>();
    x_time_stride_ = a.in_batch_major ? I_ : B * I_;
    x_row_stride_ = a.in_batch_major ? T * I_ : I_;
  }

  void recurrent_product(int64_t k, const ActiveRows& act, const ForwardStep<float>& step, float* r) {
    const int64_t j0 = blocks_.start[k], w = blocks_.width(k), ldr = G_ * w;
    const int64_t from_j0 = j0 / kPanel * packed_size(u_, kPanel);  // the panel of unit j0
    const float* panels = panels_.const_data_ptr<float>();
    const float* bias = bias_.defined() ? bias_.const_data_ptr<float>() : nullptr;
    if (w == u_ && u_ % kPanel == 0) {
      // The block is every unit and the gates' panels lie end to end: the packed [u, G*u] matrix,
      // one product for all gates.
      packed_gemm(act.n, G_ * u_, u_, step.h_prev, {act.list(B_), u_}, panels, bias, false, r, {nullptr, ldr});
      return;
    }
    for (int64_t g = 0; g < G_; ++g) {
      packed_gemm(act.n, w, u_, step.h_prev, {act.list(B_), u_}, panels + g * gate_panels_ + from_j0,
                  bias ? bias + g * u_ + j0 : nullptr, false, r + g * w, {nullptr, ldr});
    }
  }

 public:
  bool rows_apart() const override { return true; }

 private:
  int64_t G_, u_, B_;
  const UnitBlocks& blocks_;
  int64_t gate_panels_;
  Tensor bias_, panels_;
  bool joint_;
  int64_t I_ = 0, x_time_stride_ = 0, x_row_stride_ = 0;
  const float* x_ = nullptr;
  std::vector<Tensor> kernel_panels_, joint_bias_;
};

class PackedBackward final : public BackwardPlan<float> {
 public:
  explicit PackedBackward(const PlanArgs& p)
      : G_(p.cfg.gates()), u_(p.cfg.units), B_(p.cfg.batch), blocks_(p.blocks) {
    const Tensor& R = p.a.w.recurrent;  // [u, G*u]
    panels_ = cached_pack(R, "packed/transposed", [&] {
      const int64_t K = G_ * u_, np = panel_count(u_), panel = packed_size(K, kPanel);
      Tensor out = at::empty({packed_size(K, u_)}, R.options());
      const float* r = R.data_ptr<float>();
      float* d = out.data_ptr<float>();
      at::parallel_for(0, np, 1, [&](int64_t q0, int64_t q1) {
        const int64_t n0 = q0 * kPanel, n1 = std::min(u_, q1 * kPanel);
        pack_panels(r + n0 * K, K, true, K, n1 - n0, d + q0 * panel);
      });
      return out;
    });
  }

  void begin_grads(int64_t, const ActiveRows&, const float* D, int64_t ld) override { D_ = D, ld_ = ld; }

  void add_grad(int64_t k, const ActiveRows& act, float* dh) override {
    const int64_t j0 = blocks_.start[k], w = blocks_.width(k), K = G_ * u_;
    const int64_t* rows = act.list(B_);
    const int64_t from_j0 = j0 / kPanel * packed_size(K, kPanel);  // the panel of unit j0
    packed_gemm(act.n, w, K, D_, {rows, ld_}, panels_.const_data_ptr<float>() + from_j0, nullptr, true, dh + j0, {rows, u_});
  }

  bool add_grad_rows(int64_t, const ActiveRows& act, const float* D, int64_t ld, float* dh) override {
    TORCH_INTERNAL_ASSERT(blocks_.n == 1, "add_grad_rows: a plan of one unit block");
    packed_gemm(act.n, u_, G_ * u_, D, {act.rows.data(), ld}, panels_.const_data_ptr<float>(), nullptr, true, dh,
                {act.rows.data(), u_});
    return true;
  }

 private:
  int64_t G_, u_, B_;
  const UnitBlocks& blocks_;
  Tensor panels_;
  const float* D_ = nullptr;
  int64_t ld_ = 0;
};

}  // namespace

// out2[r] = (accumulate ? out2[r] : bias, or 0) + in2[r] · op(W) for the listed rows (all
// without a list): the input projection and the input gradient. W packed (its panels split
// across threads; taken from the weight cache while W is unchanged), then the rows in 6-row
// tiles across threads, listed rows read and written in place (no gather, no scatter). False
// where an operand is not contiguous.
bool packed_row_gemm(const Tensor& in2, const Tensor& rows, const Tensor& W, bool trans_w, const Tensor& bias,
                     bool accumulate, const Tensor& out2) {
  if (!in2.is_contiguous() || !out2.is_contiguous() || !W.is_contiguous() || (bias.defined() && !bias.is_contiguous())) {
    return false;
  }
  const int64_t K = in2.size(1), N = out2.size(1);
  const int64_t M = rows.defined() ? rows.numel() : in2.size(0);
  if (M == 0) return true;
  // Fewer than 4 output columns (the input gradient of a 1-3 feature input: a time series) fill
  // 1-3 of a panel's 16: BLAS's matrix-vector path instead. AMD EPYC Zen 4, LSTM training with
  // 1-3 input features at H=32-256: 1-10 % faster; from 6 columns the packed kernel is as fast.
  if (N < 4) return false;
  const int64_t np = panel_count(N), panel = packed_size(K, kPanel);
  const Tensor panels = cached_pack(W, trans_w ? "packed/rows-transposed" : "packed/rows", [&] {
    Tensor out = at::empty({np * panel}, at::kFloat);
    const float* w = W.data_ptr<float>();
    float* pp = out.data_ptr<float>();
    at::parallel_for(0, np, std::max<int64_t>(1, 4096 / K), [&](int64_t q0, int64_t q1) {
      const int64_t n0 = q0 * kPanel, n1 = std::min(N, q1 * kPanel);
      pack_panels(trans_w ? w + n0 * K : w + n0, trans_w ? K : N, trans_w, K, n1 - n0, pp + q0 * panel);
    });
    return out;
  });
  const float* pp = panels.data_ptr<float>();
  const int64_t* r = rows.defined() ? rows.data_ptr<int64_t>() : nullptr;
  const float* a = in2.data_ptr<float>();
  float* c = out2.data_ptr<float>();
  const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
  constexpr int64_t tile = 6;
  const int64_t tiles = (M + tile - 1) / tile;
  if (tiles == 1 && at::get_num_threads() > 1 && K * N >= (int64_t(1) << 16)) {
    // One row tile (a streaming step's projection): the columns across threads instead, in groups
    // of 4 panels.
    const int64_t groups = (np + 3) / 4;
    at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
      const int64_t n0 = g0 * 4 * kPanel, n1 = std::min(N, g1 * 4 * kPanel);
      packed_gemm(M, n1 - n0, K, a, {r, K}, pp + g0 * 4 * panel, b ? b + n0 : nullptr, accumulate, c + n0, {r, N});
    });
    return true;
  }
  at::parallel_for(0, tiles, std::max<int64_t>(1, (int64_t(1) << 18) / (tile * K * N)), [&](int64_t t0, int64_t t1) {
    const int64_t m0 = t0 * tile, m = std::min(M, t1 * tile) - m0;
    if (r) {
      packed_gemm(m, N, K, a, {r + m0, K}, pp, b, accumulate, c, {r + m0, N});
    } else {
      packed_gemm(m, N, K, a + m0 * K, {nullptr, K}, pp, b, accumulate, c + m0 * N, {nullptr, N});
    }
  });
  return true;
}

namespace {

// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols, in 64 x 64 blocks (a block's rows
// read whole, its columns written whole) across threads: ATen's copy of the transposed view took
// 2.5 ns a value on one thread, 5 ms of an LSTM's H=512, B=1 training call.
void transpose_into(const float* src, int64_t rows, int64_t cols, int64_t lds, float* dst, int64_t ldd) {
  constexpr int64_t kBlock = 64;
  const int64_t col_blocks = (cols + kBlock - 1) / kBlock, row_blocks = (rows + kBlock - 1) / kBlock;
  at::parallel_for(0, col_blocks * row_blocks, 4, [&](int64_t b0, int64_t b1) {
    float tile[kBlock][kBlock];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t c0 = b / row_blocks * kBlock, r0 = b % row_blocks * kBlock;
      const int64_t nc = std::min(kBlock, cols - c0), nr = std::min(kBlock, rows - r0);
      for (int64_t r = 0; r < nr; ++r) {
        const float* s = src + (r0 + r) * lds + c0;
        for (int64_t c = 0; c < nc; ++c) tile[c][r] = s[c];
      }
      for (int64_t c = 0; c < nc; ++c) std::memcpy(dst + (c0 + c) * ldd + r0, tile[c], nr * sizeof(float));
    }
  });
}

// packed_weight_grad where R (T x B) is small beside the product: the [width, N] product itself,
// D packed into panels and the parts gathered side by side into one [R, width] matrix that the
// kernel reads as its transposed operand, each thread a block of the product's rows: R x (width +
// N) values moved instead of the width x N product transposed (at H=512, B=1 an LSTM's training
// moved 2M values, about 1 ms, in a transpose).
Tensor few_rows_weight_grad(const std::vector<std::pair<Tensor, Tensor>>& parts, const Tensor& D, int64_t width,
                            int64_t extra) {
  const int64_t R = D.size(0), N = D.size(1);
  Tensor a = pooled_empty({R * width}, at::kFloat);
  float* ap = a.data_ptr<float>();
  at::parallel_for(0, R, std::max<int64_t>(1, 4096 / width), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t col = 0;
      for (const auto& [A, rows] : parts) {
        const int64_t k = A.size(1), src = rows.defined() ? rows.data_ptr<int64_t>()[r] : r;
        std::memcpy(ap + r * width + col, A.data_ptr<float>() + src * A.stride(0), k * sizeof(float));
        col += k;
      }
    }
  });
  const int64_t np = panel_count(N), panel = packed_size(R, kPanel);
  Tensor panels = pooled_empty({np * panel}, at::kFloat);
  float* pp = panels.data_ptr<float>();
  const float* d = D.data_ptr<float>();
  at::parallel_for(0, np, 1, [&](int64_t q0, int64_t q1) {
    pack_panels(d + q0 * kPanel, D.stride(0), false, R, std::min(N, q1 * kPanel) - q0 * kPanel, pp + q0 * panel);
  });
  Tensor out = at::empty({width + extra, N}, D.options());
  float* o = out.data_ptr<float>();
  const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), width / 16));
  at::parallel_for(0, nt, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m0 = width * t / nt, m1 = width * (t + 1) / nt;
      packed_gemm_at(m1 - m0, N, R, ap + m0, width, pp, false, o + m0 * N, N);
    }
  });
  if (extra) {
    Tensor sums = out[width];
    at::sum_out(sums, D, {0});
  }
  return out;
}

}  // namespace

// [A_1 | A_2 | ... (| 1)]^T · D (D: [R, N]; part p's row r is A_p's row rows_p[r], or r without
// a list; float32, unit column stride) on the packed kernel (either build) where the machine runs
// its large GEMMs on the packed engine (gemm_engine.h: CPUs other than Intel's, where MKL runs its
// AVX2 kernels, or CUDNN_RNN_CPU_GEMM=packed), else undefined. D^T · [A_1 | A_2 ...] with D as
// the transposed operand (packed_gemm_at) and the parts packed side by side (gathering their rows
// as they pack: h_prev needs no re-indexed copy), the threads
// splitting D's columns, then the [N, k] product transposed. One pass over D for the kernel's and
// the recurrent kernel's gradients: the LSTM's training at H=64-128, B=32-128 (AMD EPYC Zen 4)
// spent 2.7-2.9 ms in MKL's two GEMMs (145-160 GFLOP/s), reading D twice and a copy of h_prev;
// in one packed pass training ran 4-7 % faster at AVX-512 and 1-4 % at the AVX2 level, GRU (its
// products apart) 13 %; from H=512 the two are within 2 % at either level.
Tensor packed_weight_grad(const std::vector<std::pair<Tensor, Tensor>>& parts, const Tensor& D, bool ones) {
  if (parts.empty() || D.scalar_type() != at::kFloat || D.dim() != 2 || D.stride(1) != 1 || !packed_gemm_available() ||
      float_gemm_engine() != GemmEngine::Packed) {
    return Tensor();
  }
  const int64_t R = D.size(0), N = D.size(1);
  int64_t width = 0;
  for (const auto& [A, rows] : parts) {
    const bool listed = rows.defined();
    if (A.scalar_type() != at::kFloat || A.dim() != 2 || A.stride(1) != 1 ||
        (listed ? (rows.scalar_type() != at::kLong || rows.dim() != 1 || rows.numel() != R || !rows.is_contiguous())
                : A.size(0) != R)) {
      return Tensor();
    }
    width += A.size(1);
  }
  // Below kPackedWeightGradFloor multiply-adds the two tie (a 50-row call).
  if (double(R) * double(width) * double(N) < kPackedWeightGradFloor) return Tensor();
  const int64_t extra = ones ? 1 : 0;
  if (R * (width + N) < width * N) return few_rows_weight_grad(parts, D, width, extra);
  // The parts side by side as one [R, width] matrix in panels of 16 columns, a panel spanning
  // two parts where a width is not a multiple of 16 (an input of 1-10 features costs no padded
  // panel of its own): panel q's columns as runs, each a part's row segment copied as it packs.
  const int64_t np = panel_count(width);
  const int64_t panel = packed_size(R, kPanel);
  Tensor panels = pooled_empty({np * panel}, at::kFloat);
  float* pp = panels.data_ptr<float>();
  struct Run {
    const float* a;  // the part's first column of the run
    int64_t ld;
    const int64_t* rows;
    int64_t at, cols;  // where in the panel, how many
  };
  std::vector<std::vector<Run>> runs(np);
  int64_t col = 0;
  for (const auto& [A, rows] : parts) {
    const int64_t k = A.size(1);
    for (int64_t c = 0; c < k;) {
      const int64_t q = (col + c) / kPanel, at = (col + c) % kPanel, n = std::min(kPanel - at, k - c);
      runs[q].push_back({A.data_ptr<float>() + c, A.stride(0), rows.defined() ? rows.data_ptr<int64_t>() : nullptr,
                         at, n});
      c += n;
    }
    col += k;
  }
  const int64_t last = width - (np - 1) * kPanel;  // columns of the last panel
  at::parallel_for(0, np, 1, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      float* dst = pp + q * panel;
      for (int64_t r = 0; r < R; ++r) {
        float* d = dst + r * kPanel;
        for (const Run& run : runs[q]) {
          std::memcpy(d + run.at, run.a + (run.rows ? run.rows[r] : r) * run.ld, run.cols * sizeof(float));
        }
        if (q == np - 1 && last < kPanel) std::memset(d + last, 0, (kPanel - last) * sizeof(float));
      }
    }
  });
  const int64_t kp = np * kPanel;
  Tensor ct = pooled_empty({N, kp}, at::kFloat);
  float* c = ct.data_ptr<float>();
  const float* d = D.data_ptr<float>();
  // Whole 16-column strips of D per thread (no cache line of D read by two threads' tiles).
  const int64_t nt = std::max<int64_t>(1, at::get_num_threads()), strips = panel_count(N);
  const int64_t per = (strips + nt - 1) / nt;
  at::parallel_for(0, nt, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m0 = std::min(N, t * per * kPanel), m1 = std::min(N, (t + 1) * per * kPanel);
      if (m1 > m0) packed_gemm_at(m1 - m0, kp, R, d + m0, D.stride(0), pp, false, c + m0 * kp, kp);
    }
  });
  Tensor out = at::empty({width + extra, N}, D.options());
  transpose_into(c, N, width, kp, out.data_ptr<float>(), N);
  if (ones) {
    Tensor sums = out[width];
    at::sum_out(sums, D, {0});
  }
  return out;
}

std::unique_ptr<ForwardPlan<float>> packed_forward_plan(const PlanArgs& p, bool project_input) {
  return std::make_unique<PackedForward>(p, project_input);
}
std::unique_ptr<BackwardPlan<float>> packed_backward_plan(const PlanArgs& p) {
  return std::make_unique<PackedBackward>(p);
}

}  // namespace cpu
}  // namespace cudnn_rnn
