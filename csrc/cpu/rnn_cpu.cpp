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
#include "cpu/buffer_pool.h"
#include "cpu/cell_rows.h"
#include "cpu/gemm_engine.h"
#include "cpu/packed_gemm.h"
#include "cpu/time_loop.h"

namespace cudnn_rnn {
namespace {

using at::Tensor;

// Large per-call buffers come from the buffer pool (no page faults on reuse).
Tensor workspace(at::IntArrayRef sizes, const at::TensorOptions& opts) {
  return cpu::pooled_empty(sizes, opts.dtype().toScalarType());
}

int64_t grain(int64_t units, int64_t gates) { return std::max<int64_t>(1, 16384 / (units * gates)); }

// The BLAS ATen itself calls (MKL in the x86-64 wheels), for GEMMs issued from our own worker
// threads, where the dispatcher's thread-local state is not set up. Weak: without it the
// generic loops run instead.
extern "C" {
void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc) __attribute__((weak));
void dgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc) __attribute__((weak));
}

// MKL's packed GEMM (what oneDNN's RNNs use on Intel; torch's x86-64 wheels export it): the
// recurrent kernel is packed once per call instead of inside every step's sgemm (6-8 % of a
// fastrnns LSTM forward went to that repacking). Weak: without it the steps call sgemm_.
extern "C" {
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k) __attribute__((weak));
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha, const float* src,
                      int ld, float* dest) __attribute__((weak));
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc) __attribute__((weak));
}
// MKL's per-thread thread count for the GEMMs a thread issues (the C entry point; mkl.h maps
// mkl_set_num_threads_local to it, the lowercase symbol is the Fortran one, by pointer).
extern "C" int MKL_Set_Num_Threads_Local(int n) __attribute__((weak));
constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112, kCblasPacked = 151, kCblasBMatrix = 162;

template <typename T>
bool have_mkl_packed() {
  return std::is_same_v<T, float> && cblas_sgemm_pack_get_size != nullptr && cblas_sgemm_pack != nullptr &&
         cblas_sgemm_compute != nullptr;
}

// One MKL-packed B per unit block of the time loop, for products of up to M rows: block k's
// op(B) is K x n, read from src with leading dimension ld (B [K, n], or with trans the transpose
// of B [n, K]), where {n, src, ld} = operand(k). The buffers are allocated here; each is packed
// by the task that will compute with it (MKL wants the same thread count for both).
struct PackSource {
  int64_t n;
  const float* src;
  int64_t ld;
};

template <typename Operand>
std::vector<Tensor> mkl_pack_blocks(const cpu::UnitBlocks& blocks, int64_t M, int64_t K, bool trans, Operand operand) {
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

// Row-major C[M, N] = A[M, K] · op(B) + beta · C with op(B) packed by mkl_pack_blocks.
template <typename T>
void mkl_packed_gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* packed, T beta, T* C,
                     int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm_compute(kCblasRowMajor, kCblasNoTrans, kCblasPacked, int(M), int(N), int(K), A, int(lda), packed,
                        int(N), beta, C, int(ldc));
    return;
  }
  TORCH_INTERNAL_ASSERT(false, "mkl_packed_gemm: float32 only");
}

template <typename T>
bool have_blas() {
  return std::is_same_v<T, float> ? sgemm_ != nullptr : dgemm_ != nullptr;
}

// Row-major C[M, N] = A[M, K] · op(B) + beta · C on the calling thread, where op(B) is B [K, N]
// or, with trans_b, the transpose of B [N, K]. (In BLAS's column-major terms: C^T = op(B)^T A^T.)
template <typename T>
void gemm(bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* Bm, int64_t ldb, T beta,
          T* C, int64_t ldc) {
  const int m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
  const int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(ldc);
  const T one = 1;
  const char* ta = trans_b ? "T" : "N";
  if constexpr (std::is_same_v<T, float>) {
    sgemm_(ta, "N", &m, &n, &k, &one, Bm, &la, A, &lb, &beta, C, &lc);
  } else {
    dgemm_(ta, "N", &m, &n, &k, &one, Bm, &la, A, &lb, &beta, C, &lc);
  }
}

// The engine of a GEMM whose operand B is K x N (cpu/gemm_engine.h): float32's, or BLAS for float64.
template <typename T>
cpu::GemmEngine gemm_engine(int64_t k, int64_t n) {
  return std::is_same_v<T, float> ? cpu::float_gemm_engine(k, n) : cpu::GemmEngine::Blas;
}

// Row-major C[M, N] (leading dimension ldc) = A[M, K] · B[K, N] (+ C with add_C) through
// oneDNN's micro-kernel, on the calling thread.
template <typename T>
void brgemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* Bm, int64_t ldb, bool add_C, T* C,
            int64_t ldc) {
#if defined(CPUBLAS_BRGEMM_F32F32F32)
  if constexpr (std::is_same_v<T, float>) {
    at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, add_C, A, Bm, C);
    return;
  }
#endif
  TORCH_INTERNAL_ASSERT(false, "brgemm: float32 with a torch that has cpublas::brgemm only");
}

// cpu::packed_gemm for T = float (the only type the packed engine runs).
template <typename T>
void packed_product(int64_t M, int64_t N, int64_t K, const T* A, cpu::Rows a, const T* panels, const T* bias,
                    bool accumulate, T* C, cpu::Rows c) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::packed_gemm(M, N, K, A, a, panels, bias, accumulate, C, c);
  } else {
    TORCH_INTERNAL_ASSERT(false, "packed_product: float32 only");
  }
}

template <typename T>
void pack_panels(const T* src, int64_t ld, bool trans, int64_t K, int64_t N, T* dst) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::pack_panels(src, ld, trans, K, N, dst);
  } else {
    TORCH_INTERNAL_ASSERT(false, "pack_panels: float32 only");
  }
}

// out[i, :] = v (width values) for i < n: a bias under a GEMM that adds to its output.
template <typename T>
void fill_rows(const T* v, int64_t width, int64_t n, T* out) {
  for (int64_t i = 0; i < n; ++i) std::copy(v, v + width, out + i * width);
}

// Unit block [j0, j0 + w)'s columns of every gate of m ([K, G*u], or a bias [G*u]) as one
// contiguous [K, G*w] (or [G*w]) matrix: what one time-loop task multiplies by.
inline Tensor block_columns(const Tensor& m, int64_t G, int64_t u, int64_t j0, int64_t w) {
  const int64_t rows = m.dim() == 1 ? 1 : m.size(0);
  const Tensor b = m.reshape({rows, G, u}).narrow(2, j0, w).reshape({rows, G * w}).contiguous();
  return m.dim() == 1 ? b.view({G * w}) : b;
}

}  // namespace

namespace cpu {

// A^T · D (A: [R, k], D: [R, N], float32, unit column stride) on the packed kernel's AVX-512
// build where the machine runs its large GEMMs on the packed engine (gemm_engine.h: CPUs other
// than Intel's, where MKL runs its AVX2 kernels, or CUDNN_RNN_CPU_GEMM=packed), else undefined:
// D^T · A with D as the transposed operand (packed_gemm_at) and A packed (the smaller of the two
// at every weight-gradient shape: k = In or u against N = G*u), the threads splitting D's
// columns, then the [N, k] product transposed. fastrnns weight gradient (6400 x 512 x 2048) on
// the Intel Xeon: 52 ms against MKL's 34-38 at AVX-512 and 61 at AVX2.
Tensor packed_weight_grad(const Tensor& A, const Tensor& D) {
  if (A.scalar_type() != at::kFloat || D.scalar_type() != at::kFloat || A.dim() != 2 || D.dim() != 2 ||
      A.size(0) != D.size(0) || A.stride(1) != 1 || D.stride(1) != 1 || !packed_gemm_available() ||
      packed_gemm_isa() != PackedIsa::Avx512 || float_gemm_engine() != GemmEngine::Packed) {
    return Tensor();
  }
  // Below 2^28 multiply-adds BLAS won even at AVX2 (MKL_ENABLE_INSTRUCTIONS=AVX2 on the Intel
  // Xeon: Keras-typical LSTM training 4.7-4.9 ms against 5.3-5.5 with the packing and transposes).
  if (double(A.size(0)) * double(A.size(1)) * double(D.size(1)) < double(int64_t(1) << 28)) return Tensor();
  const int64_t R = A.size(0), k = A.size(1), N = D.size(1);
  const int64_t np = panel_count(k), panel = packed_size(R, kPanel);
  Tensor panels = cudnn_rnn::workspace({np * panel}, A.options());
  const float* a = A.data_ptr<float>();
  float* pp = panels.data_ptr<float>();
  at::parallel_for(0, np, 1, [&](int64_t q0, int64_t q1) {
    const int64_t n0 = q0 * kPanel, n1 = std::min(k, q1 * kPanel);
    pack_panels(a + n0, A.stride(0), false, R, n1 - n0, pp + q0 * panel);
  });
  Tensor ct = cudnn_rnn::workspace({N, k}, A.options());
  float* c = ct.data_ptr<float>();
  const float* d = D.data_ptr<float>();
  // Whole 16-column strips of D per thread (no cache line of D read by two threads' tiles).
  const int64_t nt = std::max<int64_t>(1, at::get_num_threads()), strips = panel_count(N);
  const int64_t per = (strips + nt - 1) / nt;
  at::parallel_for(0, nt, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m0 = std::min(N, t * per * kPanel), m1 = std::min(N, (t + 1) * per * kPanel);
      if (m1 > m0) packed_gemm_at(m1 - m0, k, R, d + m0, D.stride(0), pp, false, c + m0 * k, k);
    }
  });
  return ct.t().contiguous();
}

}  // namespace cpu

namespace {

// bfloat16 GEMMs (cpu/bf16_gemm.h) for a float32 run of a bfloat16 call, where oneDNN packs them.
template <typename T>
bool bf16_gemms(const RnnConfig& cfg) {
  return std::is_same_v<T, float> && cfg.gemm_dtype == at::kBFloat16 && cpu::bf16_gemm_available();
}

// cpu::to_bf16 and cpu::bf16_gemm for T = float (the only type bf16_gemms takes).
template <typename T>
void to_bf16(const T* src, at::BFloat16* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::to_bf16(src, dst, n);
  } else {
    TORCH_INTERNAL_ASSERT(false, "to_bf16: float32 only");
  }
}

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

template <typename T>
void bf16_product(int64_t M, const at::BFloat16* A, int64_t lda, const cpu::Bf16Panels& B, int64_t nw, T* C,
                  int64_t ldc, bool add_C) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::bf16_gemm(M, A, lda, B, 0, nw, C, ldc, add_C);
  } else {
    TORCH_INTERNAL_ASSERT(false, "bf16_product: float32 only");
  }
}

// out2[r] = (accumulate ? out2[r] : bias, or 0) + in2[r] · op(W) (CpuPolicy::row_gemm) with
// bfloat16 operands: tiles of 64 rows across threads, each converted to bfloat16 (or read from
// in2_low, in2 in bfloat16 with rows of bf16_depth(K) values, where given and every row is
// wanted), multiplied into a float32 tile and written to its rows.
inline bool bf16_row_gemm(const Tensor& in2, const Tensor& rows, const Tensor& W, bool trans_w, const Tensor& bias,
                          bool accumulate, const Tensor& out2, const Tensor& in2_low) {
  if (!in2.is_contiguous() || !out2.is_contiguous() || (bias.defined() && !bias.is_contiguous())) return false;
  const int64_t K = in2.size(1), N = out2.size(1);
  const int64_t M = rows.defined() ? rows.numel() : in2.size(0);
  if (M == 0) return true;
  const cpu::Bf16Panels panels = cpu::pack_bf16(trans_w ? W.t() : W);
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
  constexpr int64_t tile = 64;
  at::parallel_for(0, (M + tile - 1) / tile, 1, [&](int64_t t0, int64_t t1) {
    std::vector<at::BFloat16> at_(low ? 0 : tile * Kp);  // zeros: the pad column of an odd K stays zero
    std::vector<float> ct(r ? tile * N : 0);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m0 = t * tile, m = std::min(tile, M - m0);
      for (int64_t i = 0; i < m && !low; ++i) cpu::to_bf16(a + (r ? r[m0 + i] : m0 + i) * K, at_.data() + i * Kp, K);
      if (!r) {  // consecutive rows: straight into out2, over the bias or what it holds
        float* d = c + m0 * N;
        if (b && !accumulate) fill_rows(b, N, m, d);
        cpu::bf16_gemm(m, low ? a_low + m0 * Kp : at_.data(), Kp, panels, 0, N, d, N, accumulate || b);
        continue;
      }
      cpu::bf16_gemm(m, at_.data(), Kp, panels, 0, N, ct.data(), N, false);
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
    cpu::bf16_release();
  });
  return true;
}

// Whether the time loops below take a configuration; every size must also fit BLAS's int.
template <typename T>
bool fused_loop_applies(const RnnConfig& cfg, const driver::DirectionArgs& a) {
  if (cfg.cell == CellKind::GRU && !cfg.reset_after) return false;  // two GEMMs per step
  if (a.rmask.defined() || !have_blas<T>()) return false;
  // The largest BLAS argument: the batch, or the leading dimension of batch-major gate gradients.
  return std::max(cfg.batch, cfg.time * cfg.gates() * cfg.units) < INT_MAX / 4;
}

// The rows of a step that are real (not masked), in increasing order. Only they enter the
// recurrent GEMMs: with padded batches (Keras masks) the GEMMs shrink with the active batch.
template <typename T>
struct ActiveRows {
  std::vector<int64_t> rows;
  int64_t n = 0;

  ActiveRows(int64_t batch) : rows(batch) {}
  void collect(const bool* mask, int64_t batch, int64_t time, int64_t t) {
    n = 0;
    for (int64_t b = 0; b < batch; ++b) {
      if (mask == nullptr || mask[b * time + t]) rows[n++] = b;
    }
  }
  // dst[i] = src row rows[i] (width values each), i < n.
  template <typename E>
  void gather(const E* src, int64_t ld, int64_t width, E* dst) const {
    for (int64_t i = 0; i < n; ++i) std::copy(src + rows[i] * ld, src + rows[i] * ld + width, dst + i * width);
  }
};

// dh[:, j0 : j0 + w] += D[active rows] · R[j0 : j0 + w, :]^T on the calling thread, for a step
// whose recurrent-side gate gradients D ([B, G*u] rows, leading dimension ld) are zero on the
// inactive rows. compact: the active rows of D gathered ([n, G*u]) when some are inactive, else
// null. tmp: [B, w] scratch for the compact product before it is scattered into dh's rows.
// With `panels` (R^T packed, K = G*u), the product reads D's and writes dh's active rows in
// place instead (compact and tmp unused).
//
// With `RT` (R^T, [G*u, u] contiguous: brgemm reads no transposed operand), oneDNN's micro-kernel
// runs the product instead of BLAS.
// With `mkl` (this block's R[j0 : j0 + w, :]^T packed by mkl_pack_blocks), BLAS reads it packed.
// With `bf` (this block's R[j0 : j0 + w, :]^T packed for bfloat16), Db (D's active rows in
// bfloat16, rows of bf16_depth(G*u) values a leading dimension ldb apart) is multiplied on
// oneDNN's micro-kernel.
template <typename T>
void add_recurrent_grad(const ActiveRows<T>& act, int64_t B, int64_t u, int64_t G, const T* D, int64_t ld,
                        const T* compact, const T* R, const T* RT, const T* mkl, const T* panels,
                        const cpu::Bf16Panels* bf, const at::BFloat16* Db, int64_t ldb, int64_t j0, int64_t w, T* tmp,
                        T* dh) {
  if (panels) {
    const int64_t* rows = act.n < B ? act.rows.data() : nullptr;
    const int64_t from_j0 = j0 / cpu::kPanel * cpu::packed_size(G * u, cpu::kPanel);  // panel of unit j0
    packed_product<T>(act.n, w, G * u, D, {rows, ld}, panels + from_j0, nullptr, true, dh + j0, {rows, u});
  } else if (act.n == B) {
    if (bf) {
      bf16_product<T>(B, Db, ldb, *bf, w, dh + j0, u, true);
    } else if (RT) {
      brgemm<T>(B, w, G * u, D, ld, RT + j0, u, true, dh + j0, u);
    } else if (mkl) {
      mkl_packed_gemm<T>(B, w, G * u, D, ld, mkl, T(1), dh + j0, u);
    } else {
      gemm<T>(true, B, w, G * u, D, ld, R + j0 * G * u, G * u, T(1), dh + j0, u);
    }
  } else if (act.n > 0) {
    if (bf) {
      bf16_product<T>(act.n, Db, ldb, *bf, w, tmp, w, false);
    } else if (RT) {
      brgemm<T>(act.n, w, G * u, compact, G * u, RT + j0, u, false, tmp, w);
    } else if (mkl) {
      mkl_packed_gemm<T>(act.n, w, G * u, compact, G * u, mkl, T(0), tmp, w);
    } else {
      gemm<T>(true, act.n, w, G * u, compact, G * u, R + j0 * G * u, G * u, T(0), tmp, w);
    }
    for (int64_t i = 0; i < act.n; ++i) {
      T* d = dh + act.rows[i] * u + j0;
      for (int64_t j = 0; j < w; ++j) d[j] += tmp[i * w + j];
    }
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

struct TimeLoops {
  template <typename T>
  static bool takes_time_loop(const RnnConfig& cfg, const driver::DirectionArgs& a) {
    return fused_loop_applies<T>(cfg, a);
  }

  template <typename T>
  static bool low_precision_weight_grads(const RnnConfig& cfg) {
    return bf16_gemms<T>(cfg);
  }

  // bfloat16: each step's input projected in the loop (x converted once, a block's kernel
  // columns packed), never written out as a [T, B, G*u] float32 array and read back.
  template <typename T>
  static bool projects_input_in_loop(const RnnConfig& cfg, const driver::DirectionArgs& a) {
    return bf16_gemms<T>(cfg) && fused_loop_applies<T>(cfg, a) && !a.dmask.defined();
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
    const bool bf16 = bf16_gemms<T>(cfg);
    const cpu::GemmEngine engine = gemm_engine<T>(u, G * u);
    const bool packed = !bf16 && engine == cpu::GemmEngine::Packed, blas = !bf16 && engine == cpu::GemmEngine::Blas;
    // The recurrent kernel as the GEMMs read it: packed, gate by gate (gate g's columns as the
    // panels of a [u, u] matrix); for BLAS and bfloat16 per block its gate columns as one
    // [u, G*w] matrix (and the recurrent bias's); brgemm reads gate g's columns in place
    // (leading dimension G*u).
    // Per block also the GEMM's output [B, G*w] and the row kernel's scratch.
    const int64_t gate_panels = cpu::packed_size(u, u);
    Tensor panels = packed ? workspace({G * gate_panels}, a.x3.options()) : Tensor();
    if (packed) {
      for (int64_t g = 0; g < G; ++g) {
        pack_panels<T>(a.w.recurrent.data_ptr<T>() + g * u, G * u, false, u, u, panels.data_ptr<T>() + g * gate_panels);
      }
    }
    std::vector<Tensor> kernel(blocks.n), bias(blocks.n), rec(blocks.n), scratch(blocks.n);
    for (int64_t k = 0; k < blocks.n; ++k) {
      const int64_t j0 = blocks.start[k], w = blocks.width(k);
      if (blas || bf16) {
        kernel[k] = blocks.n == 1 ? a.w.recurrent : block_columns(a.w.recurrent, G, u, j0, w);
        if (step_bias.defined()) bias[k] = block_columns(step_bias, G, u, j0, w);
      }
      rec[k] = at::empty({B, G * w}, a.x3.options());
      scratch[k] = at::empty({cpu::row_scratch_size(w)}, a.x3.options());
    }
    // BLAS with MKL's packed API: each block's kernel [u, G*w] packed once.
    std::vector<Tensor> mkl(blocks.n);
    if constexpr (std::is_same_v<T, float>) {
      if (blas && have_mkl_packed<T>()) {
        mkl = mkl_pack_blocks(blocks, B, u, false, [&](int64_t k) {
          return PackSource{G * blocks.width(k), kernel[k].data_ptr<float>(), G * blocks.width(k)};
        });
      }
    }
    // bfloat16: each block's kernel packed for oneDNN, and the state as the GEMMs read it, in two
    // buffers (step s reads one while its tasks write the other).
    std::vector<cpu::Bf16Panels> bf(blocks.n);
    for (int64_t k = 0; k < blocks.n && bf16; ++k) bf[k] = cpu::pack_bf16(kernel[k]);
    // Rows of up = bf16_depth(u) values, the pad (odd u) zero.
    const int64_t up = cpu::bf16_depth(u);
    Tensor hb = bf16 ? at::zeros({2, B, up}, a.x3.options().dtype(at::kBFloat16)) : Tensor();
    Tensor hb_rows = bf16 && step.mask ? at::zeros({B, up}, hb.options()) : Tensor();
    at::BFloat16* hb_p = bf16 ? hb.data_ptr<at::BFloat16>() : nullptr;
    for (int64_t b = 0; b < B && bf16; ++b) to_bf16<T>(a.rs.h[0].data_ptr<T>() + b * u, hb_p + b * up, u);
    // The input projected in the loop (projects_input_in_loop): x in bfloat16 (rows of ip values,
    // the pad zero), each block's kernel columns [In, G*w] packed and its bias, its output [B, G*w].
    const bool in_loop = projects_input_in_loop<T>(cfg, a);
    const int64_t I = a.x3.size(2), ip = cpu::bf16_depth(I);
    // The caller's bfloat16 x as it is where it has the rows the GEMMs read (an even width).
    const bool x_as_is = in_loop && a.x3_low.defined() && a.x3_low.scalar_type() == at::kBFloat16 && ip == I &&
                         a.x3_low.is_contiguous();
    Tensor xb = x_as_is  ? a.x3_low
                : in_loop ? at::zeros({a.x3.size(0), a.x3.size(1), ip}, hb.options())
                          : Tensor();
    if (in_loop && !x_as_is) xb.narrow(2, 0, I).copy_(a.x3_low.defined() ? a.x3_low : a.x3);
    const Seq<const at::BFloat16> x_rows =
        in_loop ? Seq<const at::BFloat16>{xb.data_ptr<at::BFloat16>(), a.in_batch_major ? ip : B * ip,
                                                  a.in_batch_major ? cfg.time * ip : ip}
                : Seq<const at::BFloat16>{};
    Tensor xb_rows = in_loop && step.mask ? at::zeros({B, ip}, hb.options()) : Tensor();
    // LSTM and SimpleRNN, whose gates add the two products: the input's accumulates into the
    // recurrent product's output, and the cell reads the biases (input and recurrent) as its
    // "input projection", one [G*w] row for every batch row (no per-step bias fill, one
    // [B, G*w] array the less through the cache). GRU's candidate gate keeps them apart.
    const bool joint = in_loop && cfg.cell != CellKind::GRU;
    std::vector<cpu::Bf16Panels> wk(blocks.n);
    std::vector<Tensor> xbias(blocks.n), xwk(blocks.n);
    std::vector<T*> xwk_p(blocks.n, nullptr);
    std::vector<const T*> xbias_p(blocks.n, nullptr);
    Tensor joint_bias = joint ? at::zeros({G * u}, a.x3.options()) : Tensor();
    for (const Tensor& b : {a.w.bias_in, step_bias}) {
      if (joint && b.defined()) joint_bias.add_(b);
    }
    for (int64_t k = 0; k < blocks.n && in_loop; ++k) {
      const int64_t j0 = blocks.start[k], w = blocks.width(k);
      wk[k] = cpu::pack_bf16(block_columns(a.w.kernel, G, u, j0, w));
      if (joint || a.w.bias_in.defined()) {
        xbias[k] = block_columns(joint ? joint_bias : a.w.bias_in, G, u, j0, w);
        xbias_p[k] = xbias[k].data_ptr<T>();
      }
      if (!joint) {
        xwk[k] = at::empty({B, G * w}, a.x3.options());
        xwk_p[k] = xwk[k].data_ptr<T>();
      }
    }
    // Raw pointers, taken here: the worker threads make no ATen calls.
    const T* panels_p = packed ? panels.data_ptr<T>() : nullptr;
    const T* bias_rec = step_bias.defined() ? step_bias.data_ptr<T>() : nullptr;
    const T* R = a.w.recurrent.data_ptr<T>();
    std::vector<const T*> mkl_p(blocks.n, nullptr);
    for (int64_t k = 0; k < blocks.n; ++k) mkl_p[k] = mkl[k].defined() ? mkl[k].data_ptr<T>() : nullptr;
    std::vector<const T*> kernel_p(blocks.n), bias_p(blocks.n);
    std::vector<T*> rec_p(blocks.n), scratch_p(blocks.n);
    for (int64_t k = 0; k < blocks.n; ++k) {
      kernel_p[k] = kernel[k].defined() ? kernel[k].data_ptr<T>() : nullptr;
      bias_p[k] = bias[k].defined() ? bias[k].data_ptr<T>() : nullptr;
      rec_p[k] = rec[k].data_ptr<T>();
      scratch_p[k] = scratch[k].data_ptr<T>();
    }
    ActiveRows<T> act(B);
    // BLAS and brgemm read the active rows of h_prev gathered; the packed kernel reads them in place.
    Tensor h_active = step.mask && !packed && !bf16 ? at::empty({B, u}, a.x3.options()) : Tensor();
    cpu::StepScheduler scheduler(blocks.n);
    for (int64_t s = 0; s < cfg.time; ++s) {
      driver::set_forward_step(step, cfg, a, s);
      act.collect(step.mask, B, cfg.time, step.t);
      const T* h_in = step.h_prev;
      const int64_t* rows = act.n < B ? act.rows.data() : nullptr;
      const at::BFloat16* hb_in = bf16 ? hb_p + (s % 2) * B * up : nullptr;
      at::BFloat16* hb_out = bf16 ? hb_p + ((s + 1) % 2) * B * up : nullptr;
      const at::BFloat16* x_in = in_loop ? x_rows.row(step.t, 0) : nullptr;
      int64_t x_ld = x_rows.row_stride;
      if (rows && bf16) {
        act.gather(hb_in, up, up, hb_rows.data_ptr<at::BFloat16>());
        hb_in = hb_rows.data_ptr<at::BFloat16>();
        if (in_loop) {
          act.gather(x_in, x_ld, ip, xb_rows.data_ptr<at::BFloat16>());
          x_in = xb_rows.data_ptr<at::BFloat16>();
          x_ld = ip;
        }
      } else if (rows && !packed) {
        act.gather(step.h_prev, u, u, h_active.data_ptr<T>());
        h_in = h_active.data_ptr<T>();
        rows = nullptr;
      }
      scheduler.run([&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t j0 = blocks.start[k], w = blocks.width(k), ldr = G * w;
          T* r = rec_p[k];
          if (s + 1 < cfg.time && !in_loop) {
            prefetch_projection<T>(step, cfg.reversed(a.dir) ? step.t - 1 : step.t + 1, j0, w);
          }
          if (act.n > 0 && in_loop && !joint) {
            T* xo = xwk_p[k];
            if (xbias_p[k]) fill_rows<T>(xbias_p[k], ldr, act.n, xo);
            bf16_product<T>(act.n, x_in, x_ld, wk[k], ldr, xo, ldr, xbias_p[k] != nullptr);
          }
          // r[i, g*w + j] = recurrent pre-activation of gate g, unit j0 + j, for the i-th active row
          if (act.n > 0 && joint) {  // r = h · R + x · K, the biases in the cell's xw row
            bf16_product<T>(act.n, hb_in, up, bf[k], ldr, r, ldr, false);
            bf16_product<T>(act.n, x_in, x_ld, wk[k], ldr, r, ldr, true);
          } else if (act.n > 0 && bf16) {
            if (bias_p[k]) fill_rows<T>(bias_p[k], ldr, act.n, r);
            bf16_product<T>(act.n, hb_in, up, bf[k], ldr, r, ldr, bias_p[k] != nullptr);
          } else if (act.n > 0 && packed) {
            const int64_t from_j0 = j0 / cpu::kPanel * cpu::packed_size(u, cpu::kPanel);  // panel of unit j0
            for (int64_t g = 0; g < G; ++g) {
              packed_product<T>(act.n, w, u, h_in, {rows, u}, panels_p + g * gate_panels + from_j0,
                                bias_rec ? bias_rec + g * u + j0 : nullptr, false, r + g * w, {nullptr, ldr});
            }
          } else if (act.n > 0 && !blas) {
            for (int64_t g = 0; g < G; ++g) {
              T* c = r + g * w;
              if (bias_rec) {
                for (int64_t i = 0; i < act.n; ++i) std::copy(bias_rec + g * u + j0, bias_rec + g * u + j0 + w, c + i * ldr);
              }
              brgemm<T>(act.n, w, u, h_in, u, R + g * u + j0, G * u, bias_rec != nullptr, c, ldr);
            }
          } else if (act.n > 0) {
            if (bias_p[k]) fill_rows<T>(bias_p[k], ldr, act.n, r);
            if (mkl_p[k]) {
              mkl_packed_gemm<T>(act.n, ldr, u, h_in, u, mkl_p[k], bias_p[k] ? T(1) : T(0), r, ldr);
            } else {
              gemm<T>(false, act.n, ldr, u, h_in, u, kernel_p[k], ldr, bias_p[k] ? T(1) : T(0), r, ldr);
            }
          }
          if (joint) {
            forward_block<T>(step, j0, w, xbias_p[k], 0, r, scratch_p[k]);
          } else {
            forward_block<T>(step, j0, w, xwk_p[k], G * w, r, scratch_p[k]);
          }
          if (bf16) {
            for (int64_t b = 0; b < B; ++b) to_bf16<T>(step.h_next + b * u + j0, hb_out + b * up + j0, w);
          }
        }
        if (bf16) cpu::bf16_release();
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
    const bool bf16 = bf16_gemms<T>(cfg);
    const cpu::GemmEngine engine = gemm_engine<T>(G * u, u);
    const bool packed = !bf16 && engine == cpu::GemmEngine::Packed;
    std::vector<Tensor> scratch(blocks.n), tmp(blocks.n);
    for (int64_t k = 0; k < blocks.n; ++k) {
      scratch[k] = at::empty({cpu::row_scratch_size(blocks.width(k))}, dxw.options());
      if (!packed) tmp[k] = at::empty({B, blocks.width(k)}, dxw.options());
    }
    std::vector<T*> scratch_p(blocks.n), tmp_p(blocks.n);
    for (int64_t k = 0; k < blocks.n; ++k) {
      scratch_p[k] = scratch[k].data_ptr<T>();
      tmp_p[k] = tmp[k].defined() ? tmp[k].data_ptr<T>() : nullptr;
    }
    Tensor dh_next = at::empty({B, u}, dxw.options());
    // BLAS reads the active rows of the gate gradients gathered (compact); the packed kernel
    // reads R^T's panels (K = G*u) and the rows in place.
    Tensor compact = step.mask && !packed && !bf16 ? at::empty({B, G * u}, dxw.options()) : Tensor();
    T* compact_p = compact.defined() ? compact.data_ptr<T>() : nullptr;
    const T* R = a.w.recurrent.data_ptr<T>();  // [u, G*u]
    Tensor panels = packed ? workspace({cpu::packed_size(G * u, u)}, dxw.options()) : Tensor();
    if (packed) pack_panels<T>(R, G * u, true, G * u, u, panels.data_ptr<T>());
    const T* panels_p = packed ? panels.data_ptr<T>() : nullptr;
    Tensor RT = !bf16 && engine == cpu::GemmEngine::Brgemm ? a.w.recurrent.t().contiguous() : Tensor();  // [G*u, u]
    // bfloat16: each block's R[j0 : j0 + w, :]^T packed for oneDNN. The gate gradients also in
    // bfloat16 (dxw_low: dxw's layout, rows of gup values, the pad zero), each row's units
    // converted by the task that computed them: the recurrent GEMMs of LSTM and SimpleRNN read
    // them, and after the loop the input and weight gradients (no float32 pass over [T, B, G*u]
    // converting them); GRU's recurrent GEMMs read its own recurrent-side gradients, converted
    // the same way into two step buffers (drec_low). Db: a step's active rows gathered.
    std::vector<cpu::Bf16Panels> bf(blocks.n);
    for (int64_t k = 0; k < blocks.n && bf16; ++k) {
      bf[k] = cpu::pack_bf16(a.w.recurrent.narrow(0, blocks.start[k], blocks.width(k)).t());
    }
    const int64_t gup = cpu::bf16_depth(G * u);
    const auto bf16_opts = dxw.options().dtype(at::kBFloat16);
    Tensor& dxw_low = extras.dxw_low;
    if (bf16) {
      dxw_low = workspace({dxw.size(0), dxw.size(1), gup}, bf16_opts);
      if (gup > G * u) dxw_low.narrow(2, G * u, gup - G * u).zero_();
    }
    const Seq<at::BFloat16> low = bf16 ? driver::seq_of<at::BFloat16>(dxw_low, a.in_batch_major) : Seq<at::BFloat16>{};
    Tensor drec_low = bf16 && gru ? at::zeros({2, B, gup}, bf16_opts) : Tensor();
    at::BFloat16* drec_low_p = drec_low.defined() ? drec_low.data_ptr<at::BFloat16>() : nullptr;
    Tensor Db = bf16 && step.mask ? at::empty({B, gup}, bf16_opts) : Tensor();
    // Where the driver reads only dxw_low after the loop, the float32 gate gradients live one
    // step at a time in a [B, G*u] buffer (not written out as [T, B, G*u]: 52 MB at fastrnns
    // size, and as much again read for ownership).
    Tensor dxw_step = bf16 && !extras.keep_dxw ? at::empty({B, G * u}, dxw.options()) : Tensor();
    if (dxw_step.defined()) step.dxw = Seq<T>{dxw_step.data_ptr<T>(), 0, G * u};
    at::BFloat16* Db_p = Db.defined() ? Db.data_ptr<at::BFloat16>() : nullptr;
    const T* RT_p = RT.defined() ? RT.data_ptr<T>() : nullptr;
    // BLAS with MKL's packed API: each block's R[j0 : j0 + w, :]^T packed once.
    std::vector<Tensor> mkl(blocks.n);
    if constexpr (std::is_same_v<T, float>) {
      if (!bf16 && engine == cpu::GemmEngine::Blas && have_mkl_packed<T>()) {
        mkl = mkl_pack_blocks(blocks, B, G * u, true, [&](int64_t k) {
          return PackSource{blocks.width(k), R + blocks.start[k] * G * u, G * u};
        });
      }
    }
    std::vector<const T*> mkl_p(blocks.n, nullptr);
    for (int64_t k = 0; k < blocks.n; ++k) mkl_p[k] = mkl[k].defined() ? mkl[k].data_ptr<T>() : nullptr;
    auto time_of = [&](int64_t s) { return cfg.reversed(a.dir) ? Tn - 1 - s : s; };
    // The recurrent-side gate gradients of step s, [B, G*u] rows: GRU's own, else the input side's.
    auto grads_of = [&](int64_t s) -> std::pair<const T*, int64_t> {
      if (gru) return {drec.data_ptr<T>() + s * B * G * u, G * u};
      return {step.dxw.row(time_of(s), 0), step.dxw.row_stride};
    };
    // The same in bfloat16.
    auto low_grads_of = [&](int64_t s) -> std::pair<const at::BFloat16*, int64_t> {
      if (gru) return {drec_low_p + (s % 2) * B * gup, gup};
      return {low.row(time_of(s), 0), low.row_stride};
    };
    // The bias gradients (extras.bias_sums): the sums over rows of dxw (and of drec, GRU),
    // accumulated in float64 by the tasks as they finish a step's units.
    Tensor sums = extras.bias_sums ? at::zeros({gru ? 2 : 1, G * u}, dxw.options().dtype(at::kDouble)) : Tensor();
    double* sums_p = sums.defined() ? sums.data_ptr<double>() : nullptr;
    // Units [j0, j0 + w) of step s's gate gradients, every row: into their bfloat16 copies, and
    // added to the bias sums.
    auto finish_block = [&](int64_t s, int64_t j0, int64_t w) {
      const int64_t t = time_of(s);
      for (int64_t q = 0; q < G; ++q) {
        const int64_t col = q * u + j0;
        for (int64_t b = 0; b < B && bf16; ++b) {
          to_bf16<T>(step.dxw.row(t, b) + col, low.row(t, b) + col, w);
          if (gru) to_bf16<T>(step.drec + b * G * u + col, drec_low_p + ((s % 2) * B + b) * gup + col, w);
        }
        if (sums_p) {
          add_rows_to_f64<T>(step.dxw.row(t, 0) + col, step.dxw.row_stride, B, w, sums_p + col);
          if (gru) add_rows_to_f64<T>(step.drec + col, G * u, B, w, sums_p + G * u + col);
        }
      }
    };

    // Step s's gate gradients for its recurrent GEMM into dh (tasks over unit blocks); `act`
    // holds step s's rows.
    struct Grads {
      const T* D;
      int64_t ld;
      const at::BFloat16* low;  // bfloat16: the active rows, a leading dimension ldl apart
      int64_t ldl;
    };
    auto gather_grads = [&](const ActiveRows<T>& act, int64_t s) {
      const auto [D, ld] = grads_of(s);
      if (compact_p && act.n < B) act.gather(D, ld, G * u, compact_p);
      Grads g{D, ld, nullptr, 0};
      if (bf16) {
        std::tie(g.low, g.ldl) = low_grads_of(s);
        if (act.n < B) {
          act.gather(g.low, g.ldl, gup, Db_p);
          g.low = Db_p;
          g.ldl = gup;
        }
      }
      return g;
    };
    ActiveRows<T> act(B), act_later(B);  // rows of step s and of step s + 1
    cpu::StepScheduler scheduler(blocks.n);
    for (int64_t s = Tn - 1; s >= 0; --s) {
      driver::set_backward_step(step, cfg, a, s, dh.data_ptr<T>(), dh_next.data_ptr<T>());
      step.drec = gru ? drec.data_ptr<T>() + s * B * G * u : nullptr;
      act.collect(step.mask, B, Tn, step.t);
      Grads later{nullptr, 0, nullptr, 0};
      if (s + 1 < Tn) later = gather_grads(act_later, s + 1);
      scheduler.run([&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t j0 = blocks.start[k], w = blocks.width(k);
          if (later.D) {
            add_recurrent_grad<T>(act_later, B, u, G, later.D, later.ld, compact_p, R, RT_p, mkl_p[k], panels_p,
                                  bf16 ? &bf[k] : nullptr, later.low, later.ldl, j0, w, tmp_p[k], step.dh);
          }
          backward_block<T>(step, j0, w, scratch_p[k]);
          if (bf16 || sums_p) finish_block(s, j0, w);
        }
        if (bf16) cpu::bf16_release();
      });
      std::swap(dh, dh_next);
      std::swap(act, act_later);
    }
    const auto first = gather_grads(act_later, 0);
    T* dh0 = dh.data_ptr<T>();
    at::parallel_for(0, blocks.n, 1, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        add_recurrent_grad<T>(act_later, B, u, G, first.D, first.ld, compact_p, R, RT_p, mkl_p[k], panels_p,
                              bf16 ? &bf[k] : nullptr, first.low, first.ldl, blocks.start[k], blocks.width(k),
                              tmp_p[k], dh0);
      }
      if (bf16) cpu::bf16_release();
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

  // float32 weight gradients on the packed kernel's AVX-512 build where it serves the shape.
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

  // The packed kernel for the input projection and the input gradient (float32, AVX2): W packed
  // once (its panels split across threads), then the rows in blocks of 6-row tiles across
  // threads, listed rows read and written in place (no gather, no scatter).
  template <typename T>
  static bool row_gemm(const RnnConfig& cfg, const Tensor& in2, const Tensor& rows, const Tensor& W, bool trans_w,
                       const Tensor& bias, bool accumulate, const Tensor& out2, const Tensor& in2_low = Tensor()) {
    if (bf16_gemms<T>(cfg)) return bf16_row_gemm(in2, rows, W, trans_w, bias, accumulate, out2, in2_low);
    const int64_t K = in2.size(1), N = out2.size(1);
    if (gemm_engine<T>(K, N) != cpu::GemmEngine::Packed || !in2.is_contiguous() || !out2.is_contiguous() || !W.is_contiguous() ||
        (bias.defined() && !bias.is_contiguous())) {
      return false;
    }
    const int64_t M = rows.defined() ? rows.numel() : in2.size(0);
    if (M == 0) return true;
    const int64_t np = cpu::panel_count(N), panel = cpu::packed_size(K, cpu::kPanel);
    Tensor panels = workspace({np * panel}, in2.options());
    const T* w = W.data_ptr<T>();
    T* pp = panels.data_ptr<T>();
    at::parallel_for(0, np, std::max<int64_t>(1, 4096 / K), [&](int64_t q0, int64_t q1) {
      const int64_t n0 = q0 * cpu::kPanel, n1 = std::min(N, q1 * cpu::kPanel);
      pack_panels<T>(trans_w ? w + n0 * K : w + n0, trans_w ? K : N, trans_w, K, n1 - n0, pp + q0 * panel);
    });
    const int64_t* r = rows.defined() ? rows.data_ptr<int64_t>() : nullptr;
    const T* a = in2.data_ptr<T>();
    T* c = out2.data_ptr<T>();
    const T* b = bias.defined() ? bias.data_ptr<T>() : nullptr;
    constexpr int64_t tile = 6;
    const int64_t tiles = (M + tile - 1) / tile;
    at::parallel_for(0, tiles, std::max<int64_t>(1, (int64_t(1) << 18) / (tile * K * N)), [&](int64_t t0, int64_t t1) {
      const int64_t m0 = t0 * tile, m = std::min(M, t1 * tile) - m0;
      if (r) {
        packed_product<T>(m, N, K, a, {r + m0, K}, pp, b, accumulate, c, {r + m0, N});
      } else {
        packed_product<T>(m, N, K, a + m0 * K, {nullptr, K}, pp, b, accumulate, c + m0 * N, {nullptr, N});
      }
    });
    return true;
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
