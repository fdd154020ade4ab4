// The int8 plan, for dynamically quantized inference (the rnn_forward_int8 op): the recurrent
// kernel quantized per output column and packed gate by gate once (taken from the weight cache
// while the float32 kernel is unchanged), each step's state rows quantized on the fly by the
// task that multiplies them, products on AVX512_VNNI or AVX2 (int8_gemm.h), the cell in float32. Rows
// apart like the packed plan. Also the int8 row GEMM of the input projection and of
// cudnn_rnn::linear_int8 (quantized Dense layers).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "cpu/int8_gemm.h"
#include "cpu/step_plan.h"
#include "cpu/weight_cache.h"

namespace cudnn_rnn {
namespace cpu {
namespace {

using at::Tensor;

class Int8Forward final : public ForwardPlan<float> {
 public:
  explicit Int8Forward(const PlanArgs& p)
      : G_(p.cfg.gates()), u_(p.cfg.units), B_(p.cfg.batch), blocks_(p.blocks), bias_(p.step_bias) {
    const Tensor& R = p.a.w.recurrent;  // [u, G*u]: gate g's columns as a [u, u] matrix
    TORCH_INTERNAL_ASSERT(G_ <= 4, "Int8Forward: at most 4 gates");
    packed_ = cached_pack(R, "int8/gates", [&] {  // the gates' packs one after another, one entry
      std::vector<Tensor> gates;
      for (int64_t g = 0; g < G_; ++g) gates.push_back(pack_int8(R.const_data_ptr<float>() + g * u_, G_ * u_, 1, u_, u_));
      return at::cat(gates);
    });
    const int64_t size = packed_.numel() / G_;
    for (int64_t g = 0; g < G_; ++g) view_[g] = int8_view(packed_.narrow(0, g * size, size), u_, u_);
    if (bias_.defined()) bias_p_ = bias_.const_data_ptr<float>();
  }

  void product(int64_t k, const ActiveRows& act, const ForwardStep<float>& step, float* r) override {
    const int64_t j0 = blocks_.start[k], w = blocks_.width(k), ldr = G_ * w, Kq = int8_depth(u_);
    thread_local std::vector<uint8_t> a;
    thread_local std::vector<float> scale;
    a.resize(act.n * Kq);
    scale.resize(act.n);
    quantize_rows(step.h_prev, u_, act.list(B_), act.n, u_, Kq, a.data(), scale.data());
    for (int64_t g = 0; g < G_; ++g) {
      int8_gemm(act.n, a.data(), scale.data(), view_[g], j0, w, bias_p_ ? bias_p_ + g * u_ + j0 : nullptr, false,
                r + g * w, {nullptr, ldr});
    }
  }

  bool rows_apart() const override { return true; }

 private:
  int64_t G_, u_, B_;
  const UnitBlocks& blocks_;
  Tensor bias_, packed_;
  const float* bias_p_ = nullptr;
  Int8Panels view_[4];
};

}  // namespace

std::unique_ptr<ForwardPlan<float>> int8_forward_plan(const PlanArgs& p) { return std::make_unique<Int8Forward>(p); }

bool int8_row_gemm(const Tensor& in2, const Tensor& rows, const Tensor& W, bool trans_w, const Tensor& bias,
                   bool accumulate, const Tensor& out2) {
  if (trans_w || !in2.is_contiguous() || !out2.is_contiguous() || (bias.defined() && !bias.is_contiguous())) {
    return false;
  }
  const int64_t K = in2.size(1), N = out2.size(1), Kq = int8_depth(K);
  if (K > kInt8MaxDepth) return false;  // int32 sums could wrap: float32
  const int64_t M = rows.defined() ? rows.numel() : in2.size(0);
  if (M == 0) return true;
  const Tensor packed =
      cached_pack(W, "int8/rows", [&] { return pack_int8(W.const_data_ptr<float>(), W.stride(0), W.stride(1), K, N); });
  const Int8Panels B = int8_view(packed, K, N);
  const int64_t* r = rows.defined() ? rows.data_ptr<int64_t>() : nullptr;
  const float* x = in2.data_ptr<float>();
  const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* c = out2.data_ptr<float>();
  constexpr int64_t tile = 48;
  at::parallel_for(0, (M + tile - 1) / tile, 1, [&](int64_t t0, int64_t t1) {
    std::vector<uint8_t> a(tile * Kq);
    std::vector<float> scale(tile);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m0 = t * tile, m = std::min(tile, M - m0);
      const int64_t* rr = r ? r + m0 : nullptr;
      quantize_rows(r ? x : x + m0 * K, K, rr, m, K, Kq, a.data(), scale.data());
      int8_gemm(m, a.data(), scale.data(), B, 0, N, b, accumulate, r ? c : c + m0 * N, {rr, N});
    }
  });
  return true;
}

namespace {

// cudnn_rnn::linear_int8: x [..., K] · kernel [K, N] (+ bias [N]), the kernel (any strides: a
// torch.nn.Linear's weight.t() as it is) quantized per column and cached, x per row; float32 on
// the CPU. Where the CPU has no AVX2: float32 matmul.
Tensor linear_int8(const Tensor& x, const Tensor& kernel, const c10::optional<Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && kernel.device().is_cpu(), "linear_int8: CPU tensors only; got x on ",
              x.device(), " and kernel on ", kernel.device());
  TORCH_CHECK(x.scalar_type() == at::kFloat && kernel.scalar_type() == at::kFloat,
              "linear_int8: x and kernel must be float32; got ", x.scalar_type(), " and ", kernel.scalar_type());
  TORCH_CHECK(kernel.dim() == 2 && x.dim() >= 1 && x.size(-1) == kernel.size(0), "linear_int8: x [..., ",
              kernel.size(0), "] for a kernel of shape ", kernel.sizes(), "; got x of shape ", x.sizes());
  const Tensor b = bias.has_value() ? bias->contiguous() : Tensor();
  TORCH_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == kernel.size(1) && b.scalar_type() == at::kFloat),
              "linear_int8: bias must be float32 of shape [", kernel.size(1), "]");
  const Tensor x2 = x.reshape({-1, x.size(-1)}).contiguous();
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = kernel.size(1);
  Tensor out = at::empty({x2.size(0), kernel.size(1)}, x.options());
  if (!int8_gemm_available() || !int8_row_gemm(x2, Tensor(), kernel, false, b, false, out)) {
    out = b.defined() ? at::addmm(b, x2, kernel) : at::mm(x2, kernel);
  }
  return out.view(shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_rnn, CPU, m) { m.impl("linear_int8", &linear_int8); }

}  // namespace cpu
}  // namespace cudnn_rnn
