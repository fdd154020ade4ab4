// The bfloat16 plan, for calls whose tensors are bfloat16 (the driver runs them in float32;
// RnnConfig::gemm_dtype says what they were): bfloat16 operands, float32 accumulation
// (bf16_gemm.h). Each block's kernel columns are packed once; the state the GEMMs read is kept
// in bfloat16 in two buffers (unit blocks: step s reads one while its tasks write the other),
// each block's units converted by the task that computed them. Without input dropout the forward projects
// each step's input in the loop (x converted once), never writing a [T, B, G*u] float32 array
// and reading it back. Backward keeps the gate gradients in bfloat16 too (dxw_low), which the
// recurrent GEMMs and, after the loop, the input and weight gradients read.
//
// LSTM and SimpleRNN also run the row split (step_plan.h: PlanArgs::by_rows): each row group
// converts its own rows of h_prev at its product and of the gate gradients as it finishes a step
// (end_rows), so no thread waits for another between steps. On an AMD EPYC Zen 4 (2 threads,
// T=50, I=H) it ran the bfloat16 LSTM 2-13 % faster forward and 3-20 % forward + backward than the
// unit blocks at H=256-512 (30-40 % at H=64), level at H=1024; GRU, whose candidate gate reads
// its input product apart, keeps the unit blocks.
//
// Also the bfloat16 row GEMM of the input projection and the input gradient (bf16_row_gemm).
#include <ATen/Parallel.h>

#include <string>
#include <vector>

#include "cpu/bf16_gemm.h"
#include "cpu/buffer_pool.h"
#include "cpu/step_plan.h"
#include "cpu/weight_cache.h"

namespace cudnn_rnn {
namespace cpu {
namespace {

using at::BFloat16;
using at::Tensor;

bool is_bf16(const Tensor& t) { return t.defined() && t.scalar_type() == at::kBFloat16; }

// The caller's weight where it is bfloat16 (its values exactly; nothing to round), else the
// float32 copy.
const Tensor& bf16_or(const Tensor& low, const Tensor& full) { return is_bf16(low) ? low : full; }

// The panels of gate columns [j0, j0 + w) of a weight (all of it when whole). From the caller's
// bfloat16 weight where the call has one (driver::DirectionArgs::w_low), kept across calls in the
// weight cache keyed on that tensor: inference stops converting and repacking the same weights on
// every call. Else from the float32 copy, packed for this call.
Bf16Panels panels_of(const Tensor& full, const Tensor& low, const char* form, bool whole, int64_t G, int64_t u,
                     int64_t j0, int64_t w) {
  auto block = [&](const Tensor& m) { return whole ? m : block_columns(m, G, u, j0, w); };
  if (!is_bf16(low)) return pack_bf16(block(full));
  Bf16Panels p;
  p.K = full.size(0);
  p.Kp = bf16_depth(p.K);
  p.N = whole ? full.size(1) : G * w;
  const std::string what = std::string("bf16 panels (") + bf16_gemm_kernel() + ") " + form + " of " +
                           std::to_string(G) + " gates, units " + std::to_string(j0) + "+" + std::to_string(w);
  p.data = cached_pack(low, what.c_str(), [&] { return pack_bf16(block(low)).data; });
  return p;
}

class Bf16Forward final : public ForwardPlan<float> {
 public:
  Bf16Forward(const PlanArgs& p, bool project_input)
      : G_(p.cfg.gates()), u_(p.cfg.units), B_(p.cfg.batch), blocks_(p.blocks), up_(bf16_depth(u_)),
        in_loop_(project_input), joint_(project_input && p.cfg.cell != CellKind::GRU), by_rows_(p.by_rows) {
    TORCH_INTERNAL_ASSERT(!by_rows_ || (blocks_.n == 1 && (joint_ || !in_loop_)),
                          "bf16 plan: the row split takes one unit block, and the joint or the hoisted projection");
    const driver::DirectionArgs& a = p.a;
    const int64_t n = blocks_.n;
    bf_.resize(n), bias_.resize(n);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t j0 = blocks_.start[k], w = blocks_.width(k);
      bf_[k] = panels_of(a.w.recurrent, a.w_low.recurrent, "recurrent", n == 1, G_, u_, j0, w);
      if (p.step_bias.defined()) bias_[k] = block_columns(p.step_bias, G_, u_, j0, w);
    }
    // Rows of up values, the pad (odd u) zero.
    const auto low = a.x3.options().dtype(at::kBFloat16);
    hb_ = at::zeros({2, B_, up_}, low);
    if (p.masked) hb_rows_ = at::zeros({B_, up_}, low);
    BFloat16* hb = hb_.data_ptr<BFloat16>();
    for (int64_t b = 0; b < B_; ++b) to_bf16(a.rs.h[0].data_ptr<float>() + b * u_, hb + b * up_, u_);
    if (!in_loop_) return;
    // x in bfloat16 (rows of ip values, the pad zero): the caller's bfloat16 x as it is where it
    // has the rows the GEMMs read (an even width).
    const int64_t I = a.x3.size(2);
    ip_ = bf16_depth(I);
    const bool as_is = is_bf16(a.x3_low) && ip_ == I && a.x3_low.is_contiguous();
    xb_ = as_is ? a.x3_low : at::zeros({a.x3.size(0), a.x3.size(1), ip_}, low);
    if (!as_is) xb_.narrow(2, 0, I).copy_(a.x3_low.defined() ? a.x3_low : a.x3);
    x_rows_ = Seq<const BFloat16>{xb_.data_ptr<BFloat16>(), a.in_batch_major ? ip_ : B_ * ip_,
                                  a.in_batch_major ? p.cfg.time * ip_ : ip_};
    if (p.masked) xb_rows_ = at::zeros({B_, ip_}, low);
    // LSTM and SimpleRNN, whose gates add the two products: the input's accumulates into the
    // recurrent product's output, and the cell reads the biases (input and recurrent) as its
    // "input projection", one [G*w] row for every batch row. GRU's candidate gate keeps them apart.
    const Tensor joint_bias = joint_ ? summed_biases(p) : Tensor();
    wk_.resize(n), xbias_.resize(n), xwk_.resize(n);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t j0 = blocks_.start[k], w = blocks_.width(k);
      wk_[k] = panels_of(a.w.kernel, a.w_low.kernel, "kernel", false, G_, u_, j0, w);
      if (joint_ || a.w.bias_in.defined()) xbias_[k] = block_columns(joint_ ? joint_bias : a.w.bias_in, G_, u_, j0, w);
      if (!joint_) xwk_[k] = at::empty({B_, G_ * w}, a.x3.options());
    }
  }

  void begin_step(int64_t s, const ActiveRows& act, const ForwardStep<float>& step) override {
    BFloat16* hb = hb_.data_ptr<BFloat16>();
    h_in_ = hb + (s % 2) * B_ * up_;
    h_out_ = hb + ((s + 1) % 2) * B_ * up_;
    x_in_ = in_loop_ ? x_rows_.row(step.t, 0) : nullptr;
    x_ld_ = x_rows_.row_stride;
    if (act.n == B_) return;
    act.gather(h_in_, up_, up_, hb_rows_.data_ptr<BFloat16>());
    h_in_ = hb_rows_.data_ptr<BFloat16>();
    if (in_loop_) {
      act.gather(x_in_, x_ld_, ip_, xb_rows_.data_ptr<BFloat16>());
      x_in_ = xb_rows_.data_ptr<BFloat16>();
      x_ld_ = ip_;
    }
  }

  void product(int64_t k, const ActiveRows& act, const ForwardStep<float>& step, float* r) override {
    if (by_rows_) return group_product(act, step, r);
    const int64_t ldr = G_ * blocks_.width(k);
    if (joint_) {  // r = h · R + x · K, the biases in the cell's input row
      bf16_gemm(act.n, h_in_, up_, bf_[k], 0, ldr, r, ldr, false);
      bf16_gemm(act.n, x_in_, x_ld_, wk_[k], 0, ldr, r, ldr, true);
      return;
    }
    if (in_loop_) {
      float* xo = xwk_[k].data_ptr<float>();
      const bool bias = xbias_[k].defined();
      if (bias) fill_rows<float>(xbias_[k].const_data_ptr<float>(), ldr, act.n, xo);
      bf16_gemm(act.n, x_in_, x_ld_, wk_[k], 0, ldr, xo, ldr, bias);
    }
    const bool bias = bias_[k].defined();
    if (bias) fill_rows<float>(bias_[k].const_data_ptr<float>(), ldr, act.n, r);
    bf16_gemm(act.n, h_in_, up_, bf_[k], 0, ldr, r, ldr, bias);
  }

  const float* cell_input(int64_t k, int64_t* stride) const override {
    if (joint_) return *stride = 0, xbias_[k].const_data_ptr<float>();
    if (in_loop_) return *stride = G_ * blocks_.width(k), xwk_[k].data_ptr<float>();
    return nullptr;
  }

  void end_block(int64_t k, const ForwardStep<float>& step) override {
    const int64_t j0 = blocks_.start[k], w = blocks_.width(k);
    for (int64_t b = 0; b < B_; ++b) to_bf16(step.h_next + b * u_ + j0, h_out_ + b * up_ + j0, w);
  }

  void end_task() override { bf16_release(); }

  bool rows_apart() const override { return by_rows_; }

 private:
  // The row split's product of one row group's active rows (act.n > 0), on its thread, keeping
  // nothing between calls: h_prev's rows converted into the group's own rows of the first state
  // buffer (from its first active row on: the rows are increasing and distinct), x's rows read in
  // place where they follow one another, else gathered into the group's rows of xb_rows_.
  void group_product(const ActiveRows& act, const ForwardStep<float>& step, float* r) {
    const int64_t ldr = G_ * u_, first = act.rows[0];
    BFloat16* h = hb_.data_ptr<BFloat16>() + first * up_;
    for (int64_t i = 0; i < act.n; ++i) to_bf16(step.h_prev + act.rows[i] * u_, h + i * up_, u_);
    if (joint_) {  // r = h · R + x · K, the biases in the cell's input row
      const auto x = act.group_block(x_rows_.row(step.t, 0), x_rows_.row_stride, ip_,
                                     xb_rows_.defined() ? xb_rows_.data_ptr<BFloat16>() : nullptr);
      bf16_gemm(act.n, h, up_, bf_[0], 0, ldr, r, ldr, false);
      bf16_gemm(act.n, x.data, x.ld, wk_[0], 0, ldr, r, ldr, true);
      return;
    }
    const bool bias = bias_[0].defined();
    if (bias) fill_rows<float>(bias_[0].const_data_ptr<float>(), ldr, act.n, r);
    bf16_gemm(act.n, h, up_, bf_[0], 0, ldr, r, ldr, bias);
  }

  int64_t G_, u_, B_;
  const UnitBlocks& blocks_;
  int64_t up_, ip_ = 0;
  bool in_loop_, joint_, by_rows_;
  std::vector<Bf16Panels> bf_, wk_;
  std::vector<Tensor> bias_, xbias_, xwk_;
  Tensor hb_, hb_rows_, xb_, xb_rows_;
  Seq<const BFloat16> x_rows_{};
  const BFloat16* h_in_ = nullptr;
  BFloat16* h_out_ = nullptr;
  const BFloat16* x_in_ = nullptr;
  int64_t x_ld_ = 0;
};

class Bf16Backward final : public BackwardPlan<float> {
 public:
  Bf16Backward(const PlanArgs& p, const BackwardPlanArgs<float>& b)
      : G_(p.cfg.gates()), u_(p.cfg.units), B_(p.cfg.batch), Tn_(p.cfg.time), blocks_(p.blocks),
        gru_(p.cfg.cell == CellKind::GRU), reversed_(p.cfg.reversed(p.a.dir)), gup_(bf16_depth(G_ * u_)),
        by_rows_(p.by_rows) {
    TORCH_INTERNAL_ASSERT(!by_rows_ || (blocks_.n == 1 && !gru_), "bf16 plan: the row split takes one unit block");
    const int64_t n = blocks_.n;
    bf_.resize(n), tmp_.resize(n);
    const Tensor& r = bf16_or(p.a.w_low.recurrent, p.a.w.recurrent);
    for (int64_t k = 0; k < n; ++k) {
      bf_[k] = pack_bf16(r.narrow(0, blocks_.start[k], blocks_.width(k)).t());
      tmp_[k] = at::empty({B_, blocks_.width(k)}, b.dxw.options());
    }
    // The gate gradients in bfloat16: dxw's layout, rows of gup values, the pad zero. GRU's
    // recurrent GEMMs read its own recurrent-side gradients, converted the same way into two step
    // buffers. Db: a step's active rows gathered.
    const auto low = b.dxw.options().dtype(at::kBFloat16);
    Tensor& dxw_low = b.extras.dxw_low;
    dxw_low = pooled_empty({b.dxw.size(0), b.dxw.size(1), gup_}, at::kBFloat16);
    if (gup_ > G_ * u_) dxw_low.narrow(2, G_ * u_, gup_ - G_ * u_).zero_();
    low_ = driver::seq_of<BFloat16>(dxw_low, p.a.in_batch_major);
    if (gru_) drec_low_ = at::zeros({2, B_, gup_}, low);
    if (p.masked) Db_ = at::empty({B_, gup_}, low);
    // Where the driver reads only dxw_low after the loop, the float32 gate gradients live one
    // step at a time in a [B, G*u] buffer (not written out as [T, B, G*u]: 52 MB at fastrnns
    // size, and as much again read for ownership).
    if (!b.extras.keep_dxw) {
      dxw_step_ = at::empty({B_, G_ * u_}, b.dxw.options());
      b.step.dxw = Seq<float>{dxw_step_.data_ptr<float>(), 0, G_ * u_};
    }
  }

  void begin_grads(int64_t s, const ActiveRows& act, const float*, int64_t) override {
    if (gru_) {
      D_ = drec_low_.data_ptr<BFloat16>() + (s % 2) * B_ * gup_, ld_ = gup_;
    } else {
      D_ = low_.row(time_of(s), 0), ld_ = low_.row_stride;
    }
    if (act.n < B_) {
      act.gather(D_, ld_, gup_, Db_.data_ptr<BFloat16>());
      D_ = Db_.data_ptr<BFloat16>(), ld_ = gup_;
    }
  }

  void add_grad(int64_t k, const ActiveRows& act, float* dh) override {
    const int64_t j0 = blocks_.start[k], w = blocks_.width(k);
    if (act.n == B_) {
      bf16_gemm(B_, D_, ld_, bf_[k], 0, w, dh + j0, u_, true);
    } else if (act.n > 0) {
      float* tmp = tmp_[k].data_ptr<float>();
      bf16_gemm(act.n, D_, ld_, bf_[k], 0, w, tmp, w, false);
      scatter_add<float>(act, tmp, w, u_, j0, dh);
    }
  }

  void end_block(int64_t k, int64_t s, const BackwardStep<float>& step) override {
    const int64_t t = time_of(s), j0 = blocks_.start[k], w = blocks_.width(k);
    BFloat16* drec_low = gru_ ? drec_low_.data_ptr<BFloat16>() + (s % 2) * B_ * gup_ : nullptr;
    for (int64_t q = 0; q < G_; ++q) {
      const int64_t col = q * u_ + j0;
      for (int64_t b = 0; b < B_; ++b) {
        to_bf16(step.dxw.row(t, b) + col, low_.row(t, b) + col, w);
        if (gru_) to_bf16(step.drec + b * G_ * u_ + col, drec_low + b * gup_ + col, w);
      }
    }
  }

  void end_task() override { bf16_release(); }

  // The row split's: dh[act rows] += step s's gate gradients (in bfloat16 since end_rows) · R^T,
  // read in place where the rows follow one another, else gathered into the group's rows of Db_
  // and their product (in the group's rows of the scratch) added back.
  bool add_grad_rows(int64_t s, const ActiveRows& act, const float*, int64_t, float* dh) override {
    if (!by_rows_) return false;
    if (act.n == 0) return true;
    const auto grads = act.group_block(low_.row(time_of(s), 0), low_.row_stride, gup_,
                                       Db_.defined() ? Db_.data_ptr<BFloat16>() : nullptr);
    if (grads.in_place) {
      bf16_gemm(act.n, grads.data, grads.ld, bf_[0], 0, u_, dh + act.rows[0] * u_, u_, true);
      return true;
    }
    float* tmp = tmp_[0].data_ptr<float>() + act.rows[0] * u_;
    bf16_gemm(act.n, grads.data, grads.ld, bf_[0], 0, u_, tmp, u_, false);
    scatter_add<float>(act, tmp, u_, u_, 0, dh);
    return true;
  }

  void end_rows(int64_t s, int64_t b0, int64_t b1, const BackwardStep<float>& step) override {
    const int64_t t = time_of(s);
    for (int64_t b = b0; b < b1; ++b) to_bf16(step.dxw.row(t, b), low_.row(t, b), G_ * u_);
  }

 private:
  int64_t time_of(int64_t s) const { return reversed_ ? Tn_ - 1 - s : s; }

  int64_t G_, u_, B_, Tn_;
  const UnitBlocks& blocks_;
  bool gru_, reversed_;
  int64_t gup_;
  bool by_rows_;
  std::vector<Bf16Panels> bf_;
  std::vector<Tensor> tmp_;
  Seq<BFloat16> low_{};
  Tensor drec_low_, Db_, dxw_step_;
  const BFloat16* D_ = nullptr;
  int64_t ld_ = 0;
};

}  // namespace

// out2[r] = (accumulate ? out2[r] : bias, or 0) + in2[r] · op(W) (CpuPolicy::row_gemm) with
// bfloat16 operands: tiles of up to 64 rows across threads, each converted to bfloat16 (or read from
// in2_low, in2 in bfloat16 with rows of bf16_depth(K) values, where given and every row is
// wanted), multiplied into a float32 tile and written to its rows. W packed from W_low where that
// is bfloat16.
bool bf16_row_gemm(const Tensor& in2, const Tensor& rows, const Tensor& W, bool trans_w, const Tensor& bias,
                   bool accumulate, const Tensor& out2, const Tensor& in2_low, const Tensor& W_low) {
  if (!in2.is_contiguous() || !out2.is_contiguous() || (bias.defined() && !bias.is_contiguous())) return false;
  const int64_t K = in2.size(1), N = out2.size(1);
  const int64_t M = rows.defined() ? rows.numel() : in2.size(0);
  if (M == 0) return true;
  const Tensor& w = bf16_or(W_low, W);
  const Bf16Panels panels = pack_bf16(trans_w ? w.t() : w);
  const int64_t Kp = panels.Kp;
  const bool low = in2_low.defined() && !rows.defined();
  TORCH_INTERNAL_ASSERT(!low || (in2_low.is_contiguous() && in2_low.size(0) == M && in2_low.size(1) == Kp &&
                                 in2_low.scalar_type() == at::kBFloat16),
                        "bf16_row_gemm: in2_low is in2 in bfloat16, rows of bf16_depth(K)");
  const at::BFloat16* a_low = low ? in2_low.data_ptr<at::BFloat16>() : nullptr;
  const int64_t* r = rows.defined() ? rows.data_ptr<int64_t>() : nullptr;
  const float* a = in2.data_ptr<float>();
  const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* c = out2.data_ptr<float>();
  // At most 64 rows a tile, as many tiles as makes every thread's share equal (400 rows on two
  // threads: 8 tiles of 50, not 7 of 64 shared 4 to 3) while a tile keeps 24 rows or more (each
  // tile streams all of W's panels; many threads over few rows keep fewer, fuller tiles).
  constexpr int64_t tile = 64;
  const int64_t threads = at::get_num_threads(), fewest = (M + tile - 1) / tile;
  const int64_t even = (fewest + threads - 1) / threads * threads;
  const int64_t tiles = M / even >= 24 ? even : fewest;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<at::BFloat16> at_(low ? 0 : tile * Kp);  // zeros: the pad column of an odd K stays zero
    std::vector<float> ct(r ? tile * N : 0);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m0 = M * t / tiles, m = M * (t + 1) / tiles - m0;
      if (m == 0) continue;
      for (int64_t i = 0; i < m && !low; ++i) to_bf16(a + (r ? r[m0 + i] : m0 + i) * K, at_.data() + i * Kp, K);
      if (!r) {  // consecutive rows: straight into out2, over the bias or what it holds
        float* d = c + m0 * N;
        if (b && !accumulate) fill_rows<float>(b, N, m, d);
        bf16_gemm(m, low ? a_low + m0 * Kp : at_.data(), Kp, panels, 0, N, d, N, accumulate || b);
        continue;
      }
      bf16_gemm(m, at_.data(), Kp, panels, 0, N, ct.data(), N, false);
      for (int64_t i = 0; i < m; ++i) {
        float* d = c + r[m0 + i] * N;
        const float* p = ct.data() + i * N;
        if (accumulate) {
          for (int64_t j = 0; j < N; ++j) d[j] += p[j];
        } else if (b) {
          for (int64_t j = 0; j < N; ++j) d[j] = p[j] + b[j];
        } else {
          std::copy(p, p + N, d);
        }
      }
    }
    bf16_release();
  });
  return true;
}

std::unique_ptr<ForwardPlan<float>> bf16_forward_plan(const PlanArgs& p, bool project_input) {
  return std::make_unique<Bf16Forward>(p, project_input);
}
std::unique_ptr<BackwardPlan<float>> bf16_backward_plan(const PlanArgs& p, const BackwardPlanArgs<float>& b) {
  return std::make_unique<Bf16Backward>(p, b);
}

}  // namespace cpu
}  // namespace cudnn_rnn
