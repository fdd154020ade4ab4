#include "cpu/bf16_gemm.h"

#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "cpu/vec_loops.h"

namespace cudnn_rnn {
namespace cpu {

bool bf16_gemm_available() {
#if defined(CPUBLAS_BRGEMM_BF16BF16F32)
  static const bool available = [] {
    const char* v = std::getenv("CUDNN_RNN_CPU_BF16");
    if (v && *v) {
      const std::string s(v);
      TORCH_CHECK_VALUE(s == "bfloat16" || s == "float32",
                        "CUDNN_RNN_CPU_BF16 must be 'bfloat16' or 'float32'; got '", s, "'");
      if (s == "float32") return false;
    }
    return at::native::cpublas::could_pack(at::kBFloat16);
  }();
  return available;
#else
  return false;
#endif
}

Bf16Panels pack_bf16(const at::Tensor& b) {
  TORCH_INTERNAL_ASSERT(b.dim() == 2, "pack_bf16: a matrix");
  Bf16Panels out;
  out.K = b.size(0);
  out.Kp = bf16_depth(out.K);
  out.N = b.size(1);
  const int64_t panels = (out.N + kBf16Panel - 1) / kBf16Panel;
  at::Tensor padded = at::zeros({out.Kp, panels * kBf16Panel}, b.options().dtype(at::kBFloat16));
  if (b.scalar_type() == at::kFloat && b.stride(0) == 1 && out.N > 1) {  // the transpose of a row-major matrix
    transpose_to_bf16(b.data_ptr<float>(), out.N, out.K, b.stride(1), padded.data_ptr<at::BFloat16>(), padded.size(1));
  } else {
    padded.narrow(0, 0, out.K).narrow(1, 0, out.N).copy_(b);
  }
  out.data = at::empty({panels * out.Kp * kBf16Panel + kBf16Panel}, padded.options());
#if defined(CPUBLAS_BRGEMM_BF16BF16F32)
  const at::BFloat16* src = padded.data_ptr<at::BFloat16>();
  at::BFloat16* dst = out.data.data_ptr<at::BFloat16>();
  for (int64_t p = 0; p < panels; ++p) {
    at::native::cpublas::pack(out.Kp, kBf16Panel, panels * kBf16Panel, kBf16Panel, at::kBFloat16, at::kBFloat16,
                              src + p * kBf16Panel, dst + p * out.Kp * kBf16Panel);
  }
#else
  TORCH_INTERNAL_ASSERT(false, "pack_bf16: this torch has no bfloat16 brgemm");
#endif
  return out;
}

void bf16_gemm(int64_t M, const at::BFloat16* A, int64_t lda, const Bf16Panels& B, int64_t n0, int64_t nw, float* C,
               int64_t ldc, bool add_C) {
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
  at::native::cpublas::brgemm_release(true);
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
