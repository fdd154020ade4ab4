// The packed-panel float32 GEMM of packed_gemm.h. Register tile: up to 6 rows x 16 columns
// (12 ymm accumulators; per k two panel loads, one broadcast per row, two FMAs per row). Loop
// order: K in blocks of kKc, then the panels of B, then the rows of A in tiles, so one panel
// block (kKc x 16 floats, 32 KiB) stays in L1/L2 while every row tile streams past it, and
// the A rows of one K block (M x kKc) stay in L2.
#include "cpu/packed_gemm.h"

#include <algorithm>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace cudnn_rnn {
namespace cpu {

namespace {
constexpr int64_t kKc = 512;
constexpr int64_t kMc = 192;  // rows of A per pass over B: kMc x kKc floats (384 KiB) stay in L2

inline const float* row_of(const float* base, Rows r, int64_t i) { return base + (r.rows ? r.rows[i] : i) * r.ld; }
inline float* row_of(float* base, Rows r, int64_t i) { return base + (r.rows ? r.rows[i] : i) * r.ld; }
}  // namespace

void pack_panels(const float* src, int64_t ld, bool trans, int64_t K, int64_t N, float* dst) {
  for (int64_t q = 0; q < panel_count(N); ++q) {
    for (int64_t k = 0; k < K; ++k) {
      float* d = dst + (q * K + k) * kPanel;
      for (int64_t j = 0; j < kPanel; ++j) {
        const int64_t n = q * kPanel + j;
        d[j] = n < N ? (trans ? src[n * ld + k] : src[k * ld + n]) : 0.0f;
      }
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)

bool packed_gemm_available() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

// AVX2 + FMA code generation for these functions only; callers check packed_gemm_available().
#define CUDNN_RNN_AVX2 __attribute__((target("avx2,fma")))

namespace {

// Lanes [0, n) of a ymm mask (n in [0, 8]).
CUDNN_RNN_AVX2 inline __m256i lanes(int64_t n) {
  alignas(32) static const int32_t table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(table + 8 - n));
}

// One tile: MR rows x the 16 columns of one panel, cols (<= 16) of them stored.
template <int MR>
CUDNN_RNN_AVX2 void tile(int64_t kc, const float* const* a_rows, const float* b, float* const* c_rows, const float* bias,
          bool load_c, int64_t cols) {
  const float* a[MR];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) a[i] = a_rows[i];
  const bool full = cols == kPanel;
  const __m256i m0 = lanes(std::min<int64_t>(cols, 8)), m1 = lanes(std::max<int64_t>(cols - 8, 0));
  __m256 lo[MR], hi[MR];
  if (load_c) {
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      lo[i] = full ? _mm256_loadu_ps(c_rows[i]) : _mm256_maskload_ps(c_rows[i], m0);
      hi[i] = full ? _mm256_loadu_ps(c_rows[i] + 8) : _mm256_maskload_ps(c_rows[i] + 8, m1);
    }
  } else {
    const __m256 v0 = bias ? (full ? _mm256_loadu_ps(bias) : _mm256_maskload_ps(bias, m0)) : _mm256_setzero_ps();
    const __m256 v1 =
        bias ? (full ? _mm256_loadu_ps(bias + 8) : _mm256_maskload_ps(bias + 8, m1)) : _mm256_setzero_ps();
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      lo[i] = v0;
      hi[i] = v1;
    }
  }
  // Few rows leave too few independent FMA chains to cover the FMA latency: those tiles also
  // split k into S interleaved partial sums (at least 8 accumulators), added at the end.
  constexpr int S = MR >= 4 ? 1 : (MR == 1 ? 4 : 2);
  __m256 lo_s[S > 1 ? S - 1 : 1][MR], hi_s[S > 1 ? S - 1 : 1][MR];
  if constexpr (S > 1) {
#pragma GCC unroll 4
    for (int j = 0; j < S - 1; ++j) {
#pragma GCC unroll 6
      for (int i = 0; i < MR; ++i) lo_s[j][i] = hi_s[j][i] = _mm256_setzero_ps();
    }
  }
  int64_t k = 0;
  if constexpr (S > 1) {
    for (; k + S <= kc; k += S) {
#pragma GCC unroll 4
      for (int j = 0; j < S; ++j) {
        const __m256 b0 = _mm256_loadu_ps(b + (k + j) * kPanel), b1 = _mm256_loadu_ps(b + (k + j) * kPanel + 8);
#pragma GCC unroll 6
        for (int i = 0; i < MR; ++i) {
          const __m256 ai = _mm256_broadcast_ss(a[i] + k + j);
          __m256& l = j == 0 ? lo[i] : lo_s[j - 1][i];
          __m256& h = j == 0 ? hi[i] : hi_s[j - 1][i];
          l = _mm256_fmadd_ps(ai, b0, l);
          h = _mm256_fmadd_ps(ai, b1, h);
        }
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < S - 1; ++j) {
#pragma GCC unroll 6
      for (int i = 0; i < MR; ++i) {
        lo[i] = _mm256_add_ps(lo[i], lo_s[j][i]);
        hi[i] = _mm256_add_ps(hi[i], hi_s[j][i]);
      }
    }
  }
  for (; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b + k * kPanel), b1 = _mm256_loadu_ps(b + k * kPanel + 8);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a[i] + k);
      lo[i] = _mm256_fmadd_ps(ai, b0, lo[i]);
      hi[i] = _mm256_fmadd_ps(ai, b1, hi[i]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    if (full) {
      _mm256_storeu_ps(c_rows[i], lo[i]);
      _mm256_storeu_ps(c_rows[i] + 8, hi[i]);
    } else {
      _mm256_maskstore_ps(c_rows[i], m0, lo[i]);
      _mm256_maskstore_ps(c_rows[i] + 8, m1, hi[i]);
    }
  }
}

using TileFn = void (*)(int64_t, const float* const*, const float*, float* const*, const float*, bool, int64_t);
constexpr int kMR = 6;
constexpr TileFn kTiles[kMR + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

}  // namespace

CUDNN_RNN_AVX2 void packed_gemm(int64_t M, int64_t N, int64_t K, const float* A, Rows a, const float* panels,
                                const float* bias, bool accumulate, float* C, Rows c) {
  if (M <= 0 || N <= 0) return;
  const int64_t np = panel_count(N);
  const int64_t k_blocks = K == 0 ? 1 : (K + kKc - 1) / kKc;
  const float* ap[kMR];
  float* cp[kMR];
  for (int64_t mb = 0; mb < M; mb += kMc) {
    const int64_t m_end = std::min(M, mb + kMc);
    for (int64_t kb = 0; kb < k_blocks; ++kb) {
      const int64_t k0 = kb * kKc, kc = std::min(kKc, K - k0);
      const bool load_c = kb > 0 || accumulate;
      for (int64_t q = 0; q < np; ++q) {
        const float* bq = panels + (q * K + k0) * kPanel;
        const int64_t cols = std::min(kPanel, N - q * kPanel);
        const float* bias_q = !load_c && bias ? bias + q * kPanel : nullptr;
        for (int64_t m0 = mb; m0 < m_end; m0 += kMR) {
          const int64_t mr = std::min<int64_t>(kMR, m_end - m0);
          for (int64_t i = 0; i < mr; ++i) {
            ap[i] = row_of(A, a, m0 + i) + k0;
            cp[i] = row_of(C, c, m0 + i) + q * kPanel;
          }
          kTiles[mr](kc, ap, bq, cp, bias_q, load_c, cols);
        }
      }
    }
  }
}

#else  // not x86-64: a plain loop, so the function is defined (callers use BLAS here)

bool packed_gemm_available() { return false; }

void packed_gemm(int64_t M, int64_t N, int64_t K, const float* A, Rows a, const float* panels, const float* bias,
                 bool accumulate, float* C, Rows c) {
  for (int64_t i = 0; i < M; ++i) {
    const float* ar = row_of(A, a, i);
    float* cr = row_of(C, c, i);
    for (int64_t j = 0; j < N; ++j) {
      float s = accumulate ? cr[j] : (bias ? bias[j] : 0.0f);
      const float* b = panels + (j / kPanel) * K * kPanel + j % kPanel;
      for (int64_t k = 0; k < K; ++k) s += ar[k] * b[k * kPanel];
      cr[j] = s;
    }
  }
}

#endif

}  // namespace cpu
}  // namespace cudnn_rnn
