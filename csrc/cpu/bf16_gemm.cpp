#include "cpu/bf16_gemm.h"

#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "cpu/buffer_pool.h"
#include "cpu/vec_loops.h"

namespace cudnn_rnn {
namespace cpu {

namespace {

// Which kernel multiplies: oneDNN's micro-kernel where cpublas packs bfloat16 for it (AMX), else
// the kernel below on AVX512_BF16 (AMD Zen 4 and 5, Intel Cooper Lake), else none.
enum class Bf16Kernel { None, OneDnn, Own };

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) && defined(__GNUC__)
  return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

Bf16Kernel bf16_kernel() {
  static const Bf16Kernel kernel = [] {
    const char* v = std::getenv("CUDNN_RNN_CPU_BF16");
    if (v && *v) {
      const std::string s(v);
      TORCH_CHECK_VALUE(s == "bfloat16" || s == "float32",
                        "CUDNN_RNN_CPU_BF16 must be 'bfloat16' or 'float32'; got '", s, "'");
      if (s == "float32") return Bf16Kernel::None;
    }
#if defined(CPUBLAS_BRGEMM_BF16BF16F32)
    if (at::native::cpublas::could_pack(at::kBFloat16)) return Bf16Kernel::OneDnn;
#endif
    // The cell loops' instruction set stands for what may run (ATEN_CPU_CAPABILITY=avx2 lowers it).
    if (cpu_has_avx512_bf16() && std::string(float_loops().isa) == "avx512") return Bf16Kernel::Own;
    return Bf16Kernel::None;
  }();
  return kernel;
}

#if defined(__x86_64__) && defined(__GNUC__)
// C[0:MR, 0:n] (+)= A[0:MR, 0:Kp] · panel, n <= 64: MR rows x 4 zmm of 16 columns, each k pair a
// vdpbf16ps of the row's broadcast pair against the panel's 64 column pairs. Tiles of more than
// one row also bring the same k pair of `next` (the panel the next tiles read, as deep) towards
// L2, as packed_gemm.cpp's tiles do. Every loop over rows
// and column groups is unrolled and the last columns are masked, not branched over, so that the
// accumulators stay in registers (a runtime index into acc puts the array on the stack, and every
// product then stores its accumulator: half the kernel's speed).
template <int MR>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void own_tile(const at::BFloat16* A, int64_t lda,
                                                                    const at::BFloat16* panel, int64_t Kp, float* C,
                                                                    int64_t ldc, int64_t n, bool add_C,
                                                                    const at::BFloat16* next) {
  __m512 acc[MR][4];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) acc[r][q] = _mm512_setzero_ps();
  }
  const int64_t pairs = Kp / 2;
  for (int64_t kk = 0; kk < pairs; ++kk) {
    const at::BFloat16* b = panel + kk * 2 * kBf16Panel;
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 32);
    const __m512bh b2 = (__m512bh)_mm512_loadu_si512(b + 64), b3 = (__m512bh)_mm512_loadu_si512(b + 96);
    if constexpr (MR > 1) {
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) _mm_prefetch(reinterpret_cast<const char*>(next + kk * 2 * kBf16Panel + 32 * q), _MM_HINT_T1);
    }
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, A + r * lda + 2 * kk, sizeof(pair));
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], a, b2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], a, b3);
    }
  }
  __mmask16 mask[4];
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    const int64_t cols = n - 16 * q;
    mask[q] = cols >= 16 ? __mmask16(0xFFFF) : cols <= 0 ? __mmask16(0) : static_cast<__mmask16>((1u << cols) - 1);
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      float* c = C + r * ldc + 16 * q;
      __m512 v = acc[r][q];
      if (add_C) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask[q], c));
      _mm512_mask_storeu_ps(c, mask[q], v);
    }
  }
}

// The M rows in tiles as even as 6-row tiles allow (8 rows: 4 + 4, not 6 + 2: a 2-row tile
// issues 4 loads for 8 dot products).
void own_gemm(int64_t M, const at::BFloat16* A, int64_t lda, const at::BFloat16* panel, int64_t Kp, float* C,
              int64_t ldc, int64_t n, bool add_C, const at::BFloat16* next) {
  const int64_t tiles = (M + 5) / 6;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t m0 = M * t / tiles, m = M * (t + 1) / tiles - m0;
    const at::BFloat16* a = A + m0 * lda;
    float* c = C + m0 * ldc;
    switch (m) {
      case 6: own_tile<6>(a, lda, panel, Kp, c, ldc, n, add_C, next); break;
      case 5: own_tile<5>(a, lda, panel, Kp, c, ldc, n, add_C, next); break;
      case 4: own_tile<4>(a, lda, panel, Kp, c, ldc, n, add_C, next); break;
      case 3: own_tile<3>(a, lda, panel, Kp, c, ldc, n, add_C, next); break;
      case 2: own_tile<2>(a, lda, panel, Kp, c, ldc, n, add_C, next); break;
      default: own_tile<1>(a, lda, panel, Kp, c, ldc, n, add_C, next); break;
    }
  }
}
#else
void own_gemm(int64_t, const at::BFloat16*, int64_t, const at::BFloat16*, int64_t, float*, int64_t, int64_t, bool,
              const at::BFloat16*) {
  TORCH_INTERNAL_ASSERT(false, "bf16_gemm: an x86-64 build only");
}
#endif

}  // namespace

bool bf16_gemm_available() { return bf16_kernel() != Bf16Kernel::None; }

const char* bf16_gemm_kernel() {
  switch (bf16_kernel()) {
    case Bf16Kernel::OneDnn: return "onednn";
    case Bf16Kernel::Own: return "avx512_bf16";
    case Bf16Kernel::None: break;
  }
  return "none";
}

namespace {

// b's values in bfloat16 (rounded to nearest, ties to even), contiguous in the order b's memory
// runs: [K, N] row-major (*k_inner false) or, for the transposed view of a row-major matrix,
// [N, K] (*k_inner true).
at::Tensor bf16_rows_of(const at::Tensor& b, bool* k_inner) {
  *k_inner = b.stride(0) == 1 && b.size(1) > 1 && b.size(0) > 1;
  return (*k_inner ? b.t() : b).to(at::kBFloat16).contiguous();
}

// The own kernel's panels from bfloat16 rows: per k pair, the panel's 64 columns as 32-bit
// (k, k + 1) words, the pad (odd K, the columns past N) zero.
void pack_own(const at::BFloat16* src, bool k_inner, int64_t K, int64_t N, int64_t Kp, uint32_t* dst) {
  static_assert(sizeof(at::BFloat16) == sizeof(uint16_t), "at::BFloat16 is its bits");
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  const int64_t pairs = Kp / 2, panels = (N + kBf16Panel - 1) / kBf16Panel;
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      uint32_t* d = dst + p * pairs * kBf16Panel;
      const int64_t n0 = p * kBf16Panel, nc = std::min(kBf16Panel, N - n0);
      if (!k_inner) {  // rows 2kk and 2kk + 1 of [K, N], interleaved
        for (int64_t kk = 0; kk < pairs; ++kk) {
          const uint16_t* lo = s + 2 * kk * N + n0;
          const uint16_t* hi = 2 * kk + 1 < K ? lo + N : nullptr;
          uint32_t* dk = d + kk * kBf16Panel;
          for (int64_t c = 0; c < nc; ++c) dk[c] = uint32_t(lo[c]) | (hi ? uint32_t(hi[c]) << 16 : 0u);
          std::fill(dk + nc, dk + kBf16Panel, 0u);
        }
        continue;
      }
      // [N, K] rows: a pair is one 32-bit word of row n; 64 pairs at a time (16 KiB of the panel).
      const int64_t whole = K / 2;
      for (int64_t k0 = 0; k0 < pairs; k0 += 64) {
        const int64_t k1 = std::min(pairs, k0 + 64);
        for (int64_t c = 0; c < kBf16Panel; ++c) {
          if (c >= nc) {
            for (int64_t kk = k0; kk < k1; ++kk) d[kk * kBf16Panel + c] = 0u;
            continue;
          }
          const uint16_t* row = s + (n0 + c) * K;
          const int64_t kw = std::min(k1, whole);
          for (int64_t kk = k0; kk < kw; ++kk) {
            uint32_t word;
            std::memcpy(&word, row + 2 * kk, sizeof(word));
            d[kk * kBf16Panel + c] = word;
          }
          if (kw < k1) d[kw * kBf16Panel + c] = row[K - 1];  // odd K: the last k, its pair zero
        }
      }
    }
  });
}

}  // namespace

Bf16Panels pack_bf16(const at::Tensor& b) {
  TORCH_INTERNAL_ASSERT(b.dim() == 2, "pack_bf16: a matrix");
  Bf16Panels out;
  out.K = b.size(0);
  out.Kp = bf16_depth(out.K);
  out.N = b.size(1);
  const int64_t panels = (out.N + kBf16Panel - 1) / kBf16Panel;
  out.data = pooled_empty({panels * out.Kp * kBf16Panel + kBf16Panel}, at::kBFloat16);
  at::BFloat16* dst = out.data.data_ptr<at::BFloat16>();
  if (bf16_kernel() == Bf16Kernel::Own) {
    bool k_inner = false;
    const at::Tensor rows = bf16_rows_of(b, &k_inner);
    pack_own(rows.data_ptr<at::BFloat16>(), k_inner, out.K, out.N, out.Kp, reinterpret_cast<uint32_t*>(dst));
    return out;
  }
#if defined(CPUBLAS_BRGEMM_BF16BF16F32)
  at::Tensor padded = at::zeros({out.Kp, panels * kBf16Panel}, b.options().dtype(at::kBFloat16));
  if (b.scalar_type() == at::kFloat && b.stride(0) == 1 && out.N > 1) {  // the transpose of a row-major matrix
    transpose_to_bf16(b.data_ptr<float>(), out.N, out.K, b.stride(1), padded.data_ptr<at::BFloat16>(), padded.size(1));
  } else {
    padded.narrow(0, 0, out.K).narrow(1, 0, out.N).copy_(b);
  }
  const at::BFloat16* src = padded.data_ptr<at::BFloat16>();
  const int64_t ld = panels * kBf16Panel;
  for (int64_t p = 0; p < panels; ++p) {
    at::native::cpublas::pack(out.Kp, kBf16Panel, ld, kBf16Panel, at::kBFloat16, at::kBFloat16, src + p * kBf16Panel,
                              dst + p * out.Kp * kBf16Panel);
  }
#else
  TORCH_INTERNAL_ASSERT(false, "pack_bf16: this torch has no bfloat16 brgemm");
#endif
  return out;
}

void bf16_gemm(int64_t M, const at::BFloat16* A, int64_t lda, const Bf16Panels& B, int64_t n0, int64_t nw, float* C,
               int64_t ldc, bool add_C) {
  if (bf16_kernel() == Bf16Kernel::Own) {
    TORCH_INTERNAL_ASSERT(n0 % kBf16Panel == 0 && lda >= B.Kp, "bf16_gemm: n0 on a panel, A as deep as B's panels");
    for (int64_t c0 = 0; c0 < nw; c0 += kBf16Panel) {
      const at::BFloat16* panel = B.panel((n0 + c0) / kBf16Panel);
      const at::BFloat16* next = c0 + kBf16Panel < nw ? B.panel((n0 + c0) / kBf16Panel + 1) : panel;
      own_gemm(M, A, lda, panel, B.Kp, C + c0, ldc, std::min(kBf16Panel, nw - c0), add_C, next);
    }
    return;
  }
#if defined(CPUBLAS_BRGEMM_BF16BF16F32)
  TORCH_INTERNAL_ASSERT(n0 % kBf16Panel == 0 && lda >= B.Kp, "bf16_gemm: n0 on a panel, A as deep as B's panels");
  constexpr int64_t kRows = 64;
  for (int64_t m0 = 0; m0 < M; m0 += kRows) {
    const int64_t m = std::min(kRows, M - m0);
    for (int64_t c0 = 0; c0 < nw; c0 += kBf16Panel) {
      const int64_t n = std::min(kBf16Panel, nw - c0);
      at::native::cpublas::brgemm(m, n, B.Kp, lda, kBf16Panel, ldc, add_C, A + m0 * lda, B.panel((n0 + c0) / kBf16Panel),
                                  C + m0 * ldc + c0, /*is_vnni=*/true);
    }
  }
#else
  TORCH_INTERNAL_ASSERT(false, "bf16_gemm: this torch has no bfloat16 brgemm");
#endif
}

void bf16_release() {
#if defined(CPUBLAS_BRGEMM_BF16BF16F32)
  if (bf16_kernel() == Bf16Kernel::OneDnn) at::native::cpublas::brgemm_release(true);
#endif
}

void to_bf16(const float* src, at::BFloat16* dst, int64_t n) {
  static_assert(sizeof(at::BFloat16) == sizeof(uint16_t), "at::BFloat16 is its bits");
  float_loops().to_bf16(src, reinterpret_cast<uint16_t*>(dst), n);
}

namespace {

// dst[c * ldd + r] = t[r * ldt + c] for r < rt, c < ct: a tile of bfloat16 bits transposed, in
// 8 x 8 blocks of SSE2 unpacks (x86-64's baseline) where they fit, element by element elsewhere.
constexpr int64_t kTile = 64;

void transpose_tile(const at::BFloat16* t, int64_t ldt, int64_t rt, int64_t ct, at::BFloat16* dst, int64_t ldd) {
  int64_t r8 = 0, c8 = 0;
#if defined(__SSE2__)
  r8 = rt / 8 * 8;
  c8 = ct / 8 * 8;
  for (int64_t r = 0; r < r8; r += 8) {
    for (int64_t c = 0; c < c8; c += 8) {
      __m128i v[8];
      for (int i = 0; i < 8; ++i) v[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t + (r + i) * ldt + c));
      const __m128i a0 = _mm_unpacklo_epi16(v[0], v[1]), a1 = _mm_unpackhi_epi16(v[0], v[1]);
      const __m128i a2 = _mm_unpacklo_epi16(v[2], v[3]), a3 = _mm_unpackhi_epi16(v[2], v[3]);
      const __m128i a4 = _mm_unpacklo_epi16(v[4], v[5]), a5 = _mm_unpackhi_epi16(v[4], v[5]);
      const __m128i a6 = _mm_unpacklo_epi16(v[6], v[7]), a7 = _mm_unpackhi_epi16(v[6], v[7]);
      const __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2);
      const __m128i b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3);
      const __m128i b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6);
      const __m128i b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);
      const __m128i out[8] = {_mm_unpacklo_epi64(b0, b4), _mm_unpackhi_epi64(b0, b4), _mm_unpacklo_epi64(b1, b5),
                              _mm_unpackhi_epi64(b1, b5), _mm_unpacklo_epi64(b2, b6), _mm_unpackhi_epi64(b2, b6),
                              _mm_unpacklo_epi64(b3, b7), _mm_unpackhi_epi64(b3, b7)};
      for (int i = 0; i < 8; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (c + i) * ldd + r), out[i]);
    }
  }
#endif
  for (int64_t r = 0; r < rt; ++r) {
    for (int64_t c = (r < r8 ? c8 : 0); c < ct; ++c) dst[c * ldd + r] = t[r * ldt + c];
  }
}

}  // namespace

void transpose_to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, at::BFloat16* dst, int64_t ldd) {
  // Per tile of 64 x 64: each row rounded to bfloat16 (the vectorised loop), then the 16-bit tile
  // transposed (ATen's copy of a transposed view into a contiguous bfloat16 tensor ran 20x slower,
  // a float32 tile transposed element by element 4x).
  at::parallel_for(0, (rows + kTile - 1) / kTile, 1, [&](int64_t t0, int64_t t1) {
    std::vector<at::BFloat16> tile(kTile * kTile);
    for (int64_t r0 = t0 * kTile; r0 < std::min(rows, t1 * kTile); r0 += kTile) {
      const int64_t rt = std::min(kTile, rows - r0);
      for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
        const int64_t ct = std::min(kTile, cols - c0);
        for (int64_t r = 0; r < rt; ++r) to_bf16(src + (r0 + r) * ld + c0, tile.data() + r * kTile, ct);
        transpose_tile(tile.data(), kTile, rt, ct, dst + c0 * ldd + r0, ldd);
      }
    }
  });
}

void transpose_bf16(const at::BFloat16* src, int64_t rows, int64_t cols, int64_t ld, at::BFloat16* dst, int64_t ldd) {
  at::parallel_for(0, (rows + kTile - 1) / kTile, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t r0 = t0 * kTile; r0 < std::min(rows, t1 * kTile); r0 += kTile) {
      for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
        transpose_tile(src + r0 * ld + c0, ld, std::min(kTile, rows - r0), std::min(kTile, cols - c0), dst + c0 * ldd + r0,
                       ldd);
      }
    }
  });
}

}  // namespace cpu
}  // namespace cudnn_rnn
