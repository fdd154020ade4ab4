#include "cpu/int8_gemm.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "cpu/vec_loops.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
// GCC 12's AVX-512 headers build unmasked intrinsics (_mm512_max_ps, _mm512_cvtps_epi32, ...) on
// _mm512_undefined_*(), which -Wmaybe-uninitialized reports at every inlined use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// AVX_VNNI code needs GCC 11 or clang 16 (-mavxvnni, __builtin_cpu_supports("avxvnni")); older
// compilers build the other int8 builds only.
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 16) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define CUDNN_RNN_AVX_VNNI 1
#endif

namespace cudnn_rnn {
namespace cpu {

namespace {
std::atomic<int>& int8_isa_override() {
  static std::atomic<int> v{-1};
  return v;
}
}  // namespace

bool int8_gemm_avx512_available() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool ok = cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
  return ok;
#else
  return false;
#endif
}

bool int8_gemm_avx_vnni_available() {
#if defined(CUDNN_RNN_AVX_VNNI)
  static const bool ok = packed_gemm_available() && __builtin_cpu_supports("avxvnni");
  return ok;
#else
  return false;
#endif
}

bool int8_gemm_available() { return packed_gemm_available(); }

Int8Isa int8_gemm_isa() {
  const int forced = int8_isa_override().load();
  if (forced >= 0) return static_cast<Int8Isa>(forced);
  // AVX512_VNNI where the cell loops run AVX-512 (ATEN_CPU_CAPABILITY=avx2 lowers both), else
  // AVX_VNNI's 256-bit vpdpbusd where the CPU has it, else AVX2. CUDNN_RNN_CPU_INT8=avx2 (or
  // avx_vnni) picks a lower build, for measurement.
  static const Int8Isa machine = [] {
    const Int8Isa best = int8_gemm_avx512_available() && std::string(float_loops().isa) == "avx512"
                             ? Int8Isa::Avx512Vnni
                         : int8_gemm_avx_vnni_available() ? Int8Isa::AvxVnni
                                                          : Int8Isa::Avx2;
    const char* v = std::getenv("CUDNN_RNN_CPU_INT8");
    const std::string asked = v != nullptr ? v : "";
    if (asked == "avx2") return Int8Isa::Avx2;
    if (asked == "avx_vnni" && int8_gemm_avx_vnni_available()) return Int8Isa::AvxVnni;
    return best;
  }();
  return machine;
}

void override_int8_gemm_isa(const std::string& name) {
  TORCH_CHECK_VALUE(name.empty() || name == "avx2" || name == "avx_vnni" || name == "avx512_vnni",
                    "int8 GEMM instruction set must be 'avx2', 'avx_vnni' or 'avx512_vnni'; got '", name, "'");
  TORCH_CHECK_VALUE(name != "avx512_vnni" || int8_gemm_avx512_available(), "this CPU has no AVX512_VNNI");
  TORCH_CHECK_VALUE(name != "avx_vnni" || int8_gemm_avx_vnni_available(), "this CPU has no AVX_VNNI");
  TORCH_CHECK_VALUE(name != "avx2" || int8_gemm_available(), "this CPU has no AVX2 / FMA");
  const Int8Isa isa = name == "avx2" ? Int8Isa::Avx2 : name == "avx_vnni" ? Int8Isa::AvxVnni : Int8Isa::Avx512Vnni;
  int8_isa_override().store(name.empty() ? -1 : int(isa));
}

namespace {

// The int8 panels, then the column scales and sums.
struct Layout {
  int64_t np, Kq, panel_bytes, scale_at, colsum_at, total;
  Layout(int64_t K, int64_t N) {
    np = panel_count(N);
    Kq = int8_depth(K);
    panel_bytes = Kq * kPanel;
    scale_at = (np * panel_bytes + 63) / 64 * 64;
    colsum_at = scale_at + np * kPanel * 4;
    total = colsum_at + np * kPanel * 4;
  }
};

}  // namespace

at::Tensor pack_int8(const float* src, int64_t sk, int64_t sn, int64_t K, int64_t N) {
  const Layout l(K, N);
  at::Tensor out = at::zeros({l.total}, at::kByte);
  uint8_t* base = out.data_ptr<uint8_t>();
  int8_t* panels = reinterpret_cast<int8_t*>(base);
  float* scale = reinterpret_cast<float*>(base + l.scale_at);
  int32_t* colsum = reinterpret_cast<int32_t*>(base + l.colsum_at);
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      float m = 0;
      bool nan = false;
      for (int64_t k = 0; k < K; ++k) {
        const float v = src[k * sk + n * sn];
        m = std::max(m, std::fabs(v));
        nan = nan || std::isnan(v);
      }
      int8_t* p = panels + (n / kPanel) * l.panel_bytes + (n % kPanel) * 4;
      if (nan || !std::isfinite(m)) {  // the column's products NaN (values 0, scale NaN)
        scale[n] = std::numeric_limits<float>::quiet_NaN();
        colsum[n] = 0;
        continue;
      }
      // A column too small for its scale to be a nonzero float counts as zeros.
      const float s = m / 127.0f > 0 ? m / 127.0f : 1.0f;
      scale[n] = s;
      int32_t sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        const float q = std::nearbyint(src[k * sk + n * sn] / s);
        const int8_t v = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, q)));
        p[(k / 4) * 64 + k % 4] = v;
        sum += v;
      }
      colsum[n] = sum;
    }
  });
  return out;
}

Int8Panels int8_view(const at::Tensor& packed, int64_t K, int64_t N) {
  const Layout l(K, N);
  TORCH_INTERNAL_ASSERT(packed.numel() == l.total, "int8_view: a pack_int8 tensor of this shape");
  const uint8_t* base = packed.data_ptr<uint8_t>();
  return {reinterpret_cast<const int8_t*>(base), reinterpret_cast<const float*>(base + l.scale_at),
          reinterpret_cast<const int32_t*>(base + l.colsum_at), K, l.Kq, N};
}

namespace {
// The rows every build quantizes here, alike: one holding a NaN or an infinity (scale NaN, every
// value the zero point: the row's products come out NaN), and one whose largest magnitude is so
// small (below about 3.7e-37) that 1 / scale overflows (quantized as x / top * 127; through
// 1 / scale every value would be infinite, and the vector conversions turn that into -127). Such
// a row's scale is subnormal: its products keep their signs but only a few bits, and below about
// 9e-44 the scale, and so every product, is 0.
// Returns whether the row was one of them.
bool quantize_special_row(const float* r, int64_t K, int64_t Kq, float top, bool nan, uint8_t* d, float* scale) {
  if (nan || !std::isfinite(top)) {
    *scale = std::numeric_limits<float>::quiet_NaN();
    std::fill(d, d + Kq, uint8_t(128));
    return true;
  }
  if (!(top > 0) || std::isfinite(1.0f / (top / 127.0f))) return false;
  *scale = top / 127.0f;
  for (int64_t k = 0; k < K; ++k) {
    const float q = std::nearbyint(r[k] / top * 127.0f);
    d[k] = static_cast<uint8_t>(static_cast<int>(std::min(127.0f, std::max(-127.0f, q))) + 128);
  }
  std::fill(d + K, d + Kq, uint8_t(128));
  return true;
}
}  // namespace

#if defined(__x86_64__) && defined(__GNUC__)
namespace {
// quantize_rows in AVX-512: the same values (vcvtps2dq rounds to nearest even, as nearbyint does
// under the default rounding mode).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void quantize_rows_avx512(
    const float* x, int64_t ld, const int64_t* rows, int64_t M, int64_t K, int64_t Kq, uint8_t* a, float* scale) {
  for (int64_t i = 0; i < M; ++i) {
    const float* r = x + (rows ? rows[i] : i) * ld;
    __m512 mx = _mm512_setzero_ps();
    __mmask16 nan = 0;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      const __m512 v = _mm512_loadu_ps(r + k);
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
    }
    if (k < K) {
      const __mmask16 m = static_cast<__mmask16>((1u << (K - k)) - 1);
      const __m512 v = _mm512_maskz_loadu_ps(m, r + k);
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
    }
    const float top = _mm512_reduce_max_ps(mx);
    uint8_t* d = a + i * Kq;
    if (quantize_special_row(r, K, Kq, top, nan != 0, d, scale + i)) continue;
    const float s = top > 0 ? top / 127.0f : 1.0f;
    scale[i] = s;
    const __m512 inv = _mm512_set1_ps(1.0f / s);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127), zero = _mm512_set1_epi32(128);
    for (k = 0; k < K; k += 16) {
      const int64_t n = std::min<int64_t>(16, K - k);
      const __mmask16 m = static_cast<__mmask16>(n == 16 ? 0xffff : (1u << n) - 1);
      __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, r + k), inv));
      q = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(q, lo), hi), zero);
      _mm_mask_storeu_epi8(d + k, m, _mm512_cvtepi32_epi8(q));
    }
    std::fill(d + K, d + Kq, uint8_t(128));
  }
}

// quantize_rows in AVX2, the same values.
__attribute__((target("avx2,fma"))) void quantize_rows_avx2(const float* x, int64_t ld, const int64_t* rows,
                                                            int64_t M, int64_t K, int64_t Kq, uint8_t* a,
                                                            float* scale) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < M; ++i) {
    const float* r = x + (rows ? rows[i] : i) * ld;
    __m256 mx = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 8) {
      const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(K - k, 8))), lanes);
      const __m256 v = _mm256_maskload_ps(r + k, keep);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      mx = _mm256_max_ps(mx, _mm256_and_ps(v, magnitude));
    }
    alignas(32) float tops[8];
    _mm256_store_ps(tops, mx);
    const float top = *std::max_element(tops, tops + 8);
    uint8_t* d = a + i * Kq;
    if (quantize_special_row(r, K, Kq, top, _mm256_movemask_ps(nan) != 0, d, scale + i)) continue;
    const float s = top > 0 ? top / 127.0f : 1.0f;
    scale[i] = s;
    const __m256 inv = _mm256_set1_ps(1.0f / s);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127), zero = _mm256_set1_epi32(128);
    for (int64_t k = 0; k < K; k += 8) {
      const int64_t n = std::min<int64_t>(8, K - k);
      const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lanes);
      __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_maskload_ps(r + k, keep), inv));
      q = _mm256_add_epi32(_mm256_min_epi32(_mm256_max_epi32(q, lo), hi), zero);
      const __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
      alignas(16) uint8_t bytes[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(bytes), _mm_packus_epi16(w16, w16));
      std::memcpy(d + k, bytes, static_cast<size_t>(n));
    }
    std::fill(d + K, d + Kq, uint8_t(128));
  }
}
}  // namespace
#endif

void quantize_rows(const float* x, int64_t ld, const int64_t* rows, int64_t M, int64_t K, int64_t Kq, uint8_t* a,
                   float* scale) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (int8_gemm_isa() == Int8Isa::Avx512Vnni) return quantize_rows_avx512(x, ld, rows, M, K, Kq, a, scale);
  if (int8_gemm_available()) return quantize_rows_avx2(x, ld, rows, M, K, Kq, a, scale);
#endif
  for (int64_t i = 0; i < M; ++i) {
    const float* r = x + (rows ? rows[i] : i) * ld;
    float m = 0;
    bool nan = false;
    for (int64_t k = 0; k < K; ++k) {
      m = std::max(m, std::fabs(r[k]));
      nan = nan || std::isnan(r[k]);
    }
    uint8_t* d = a + i * Kq;
    if (quantize_special_row(r, K, Kq, m, nan, d, scale + i)) continue;
    const float s = m > 0 ? m / 127.0f : 1.0f, inv = 1.0f / s;
    scale[i] = s;
    for (int64_t k = 0; k < K; ++k) {
      const float q = std::nearbyint(r[k] * inv);
      d[k] = static_cast<uint8_t>(static_cast<int>(std::min(127.0f, std::max(-127.0f, q))) + 128);
    }
    std::fill(d + K, d + Kq, uint8_t(128));
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
namespace {

// The int32 sums of a finished tile, on their way to the float32 epilogue.
constexpr int kMaxRows = 6, kMaxPanels = 4;
using TileSums = int32_t[kMaxRows][kMaxPanels * kPanel];

// MR rows x NP panels of 16 columns: NP * MR int32 accumulators, per group of 4 k one panel load
// per panel and one broadcast per row. The loops over rows and panels are unrolled, and the sums
// leave the registers through `sums` (the caller's per-thread buffer) before the epilogue: with
// the epilogue reading the 24 accumulators in place, or a local array GCC can see, GCC 12 keeps
// every accumulator on the stack and stores it after each product, at half the kernel's speed.
template <int MR, int NP>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void tile(const uint8_t* a, int64_t lda,
                                                                         const float* a_scale, const Int8Panels& B,
                                                                         int64_t q0, int64_t ncols, const float* bias,
                                                                         bool accumulate, float* C, Rows c,
                                                                         int64_t i0, TileSums& sums) {
  static_assert(MR <= kMaxRows && NP <= kMaxPanels, "tile: a TileSums holds the tile");
  __m512i acc[MR][NP];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_si512();
  }
  const int64_t groups = B.Kq / 4, panel_bytes = B.Kq * kPanel;
  const int8_t* base = B.panels + q0 * panel_bytes;
  for (int64_t g = 0; g < groups; ++g) {
    __m512i b[NP];
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) b[p] = _mm512_loadu_si512(base + p * panel_bytes + g * 64);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      int32_t quad;
      std::memcpy(&quad, a + r * lda + 4 * g, sizeof(quad));
      const __m512i av = _mm512_set1_epi32(quad);
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_dpbusd_epi32(acc[r][p], av, b[p]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) _mm512_storeu_si512(sums[r] + p * kPanel, acc[r][p]);
  }
#pragma GCC unroll 4
  for (int p = 0; p < NP; ++p) {
    const int64_t cols = ncols - p * kPanel;
    const __mmask16 m =
        cols >= kPanel ? __mmask16(0xFFFF) : cols <= 0 ? __mmask16(0) : static_cast<__mmask16>((1u << cols) - 1);
    const int64_t col = (q0 + p) * kPanel;
    const __m512i zero_point = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m, B.colsum + col), 7);  // 128 * colsum
    const __m512 sb = _mm512_maskz_loadu_ps(m, B.scale + col);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias + p * kPanel) : _mm512_setzero_ps();
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      float* out = C + (c.rows ? c.rows[i0 + r] : i0 + r) * c.ld + p * kPanel;
      const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(sums[r] + p * kPanel), zero_point));
      __m512 v = _mm512_fmadd_ps(sum, _mm512_mul_ps(sb, _mm512_set1_ps(a_scale[r])), bv);
      if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, out));
      _mm512_mask_storeu_ps(out, m, v);
    }
  }
}

template <int MR>
void row_tile(const uint8_t* a, int64_t lda, const float* a_scale, const Int8Panels& B, int64_t q, int64_t n,
              const float* bias, bool accumulate, float* C, Rows c, int64_t i0, TileSums& sums) {
  switch (panel_count(n)) {
    case 4: tile<MR, 4>(a, lda, a_scale, B, q, n, bias, accumulate, C, c, i0, sums); break;
    case 3: tile<MR, 3>(a, lda, a_scale, B, q, n, bias, accumulate, C, c, i0, sums); break;
    case 2: tile<MR, 2>(a, lda, a_scale, B, q, n, bias, accumulate, C, c, i0, sums); break;
    default: tile<MR, 1>(a, lda, a_scale, B, q, n, bias, accumulate, C, c, i0, sums); break;
  }
}

// Eight columns' int32 sums (columns j.., in order; `cols` of them kept) through the AVX-512
// build's float32 epilogue, the same operations: s_a * s_b * (sum - 128 * colsum) + bias (+ out).
// Centred sums (the AVX2 build's) are sum - 128 * colsum already: the same integers.
template <bool Centred>
__attribute__((target("avx2,fma"), always_inline)) inline void store_half(__m256i sum, const Int8Panels& B, int64_t j,
                                                                        int64_t cols, const float* bias, float a_scale,
                                                                        bool accumulate, float* out) {
  const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(cols, 8))),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  if (!Centred) sum = _mm256_sub_epi32(sum, _mm256_slli_epi32(_mm256_maskload_epi32(B.colsum + j, keep), 7));
  const __m256 sb = _mm256_maskload_ps(B.scale + j, keep);
  const __m256 bv = bias ? _mm256_maskload_ps(bias, keep) : _mm256_setzero_ps();
  __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(sb, _mm256_set1_ps(a_scale)), bv);
  if (accumulate) v = _mm256_add_ps(v, _mm256_maskload_ps(out, keep));
  _mm256_maskstore_ps(out, keep, v);
}

// A 256-bit tile's MR rows x two halves of 8 columns through store_half.
template <bool Centred, int MR>
__attribute__((target("avx2,fma"), always_inline)) inline void store_tile(const __m256i (&acc)[MR][2],
                                                                        const Int8Panels& B, int64_t q, int64_t ncols,
                                                                        const float* bias, const float* a_scale,
                                                                        bool accumulate, float* C, Rows c, int64_t i0) {
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    float* out = C + (c.rows ? c.rows[i0 + r] : i0 + r) * c.ld;
    for (int half = 0; half < 2 && ncols > 8 * half; ++half) {
      store_half<Centred>(acc[r][half], B, q * kPanel + 8 * half, ncols - 8 * half, bias ? bias + 8 * half : nullptr,
                          a_scale[r], accumulate, out + 8 * half);
    }
  }
}

// The AVX2 build (CPUs without AVX512_VNNI or AVX_VNNI, and ATen's AVX2 level): MR rows (1-4) x
// one panel as two halves of 8 columns, from the panels the other builds read. Per k group a
// row's 4 values go back to signed (a - 128, in [-127, 127]); their magnitudes multiply the
// weights given the values' signs (vpsignb, vpmaddubsw: two products of at most 127 * 127 in a
// 16-bit lane, never saturating), and vpmaddwd by ones adds the pairs into each column's int32.
// The sums are sum((a - 128) * b), the integers the other builds reach as sum(a * b) - 128 *
// colsum: the same results.
template <int MR>
__attribute__((target("avx2,fma"))) void tile_avx2(const uint8_t* a, int64_t lda, const float* a_scale,
                                                   const Int8Panels& B, int64_t q, int64_t ncols, const float* bias,
                                                   bool accumulate, float* C, Rows c, int64_t i0) {
  __m256i acc[MR][2];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  const int64_t groups = B.Kq / 4;
  const int8_t* base = B.panels + q * B.Kq * kPanel;
  for (int64_t g = 0; g < groups; ++g) {
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + g * 64));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + g * 64 + 32));
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      int32_t quad;
      std::memcpy(&quad, a + r * lda + 4 * g, sizeof(quad));
      const __m256i v = _mm256_xor_si256(_mm256_set1_epi32(quad), flip), mag = _mm256_abs_epi8(v);
      const __m256i p0 = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(b0, v));
      const __m256i p1 = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(b1, v));
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(p0, ones));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(p1, ones));
    }
  }
  store_tile<true, MR>(acc, B, q, ncols, bias, a_scale, accumulate, C, c, i0);
}

#if defined(CUDNN_RNN_AVX_VNNI)
// The AVX_VNNI build (vpdpbusd on 256-bit registers, AVX2 CPUs that have it): MR rows (1-4) x one
// panel as two halves of 8 columns, each k group's 32 bytes a half as the panel holds them; the
// sums come out in column order.
template <int MR>
__attribute__((target("avx2,fma,avxvnni"))) void tile_avx_vnni(const uint8_t* a, int64_t lda, const float* a_scale,
                                                              const Int8Panels& B, int64_t q, int64_t ncols,
                                                              const float* bias, bool accumulate, float* C, Rows c,
                                                              int64_t i0) {
  __m256i acc[MR][2];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  const int64_t groups = B.Kq / 4;
  const int8_t* base = B.panels + q * B.Kq * kPanel;
  for (int64_t g = 0; g < groups; ++g) {
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + g * 64));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + g * 64 + 32));
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      int32_t quad;
      std::memcpy(&quad, a + r * lda + 4 * g, sizeof(quad));
      const __m256i av = _mm256_set1_epi32(quad);
      acc[r][0] = _mm256_dpbusd_avx_epi32(acc[r][0], av, b0);
      acc[r][1] = _mm256_dpbusd_avx_epi32(acc[r][1], av, b1);
    }
  }
  store_tile<false, MR>(acc, B, q, ncols, bias, a_scale, accumulate, C, c, i0);
}

#endif

// int8_gemm on the AVX2 / AVX_VNNI builds: the same order (groups of 4 panels outer), rows in
// tiles of 4.
void int8_gemm_avx2(int64_t M, const uint8_t* a, const float* a_scale, const Int8Panels& B, int64_t n0, int64_t nw,
                    const float* bias, bool accumulate, float* C, Rows c) {
  using Tile = decltype(&tile_avx2<1>);
  static constexpr Tile avx2[] = {tile_avx2<1>, tile_avx2<2>, tile_avx2<3>, tile_avx2<4>};
  const Tile* tiles = avx2;
#if defined(CUDNN_RNN_AVX_VNNI)
  static constexpr Tile vnni[] = {tile_avx_vnni<1>, tile_avx_vnni<2>, tile_avx_vnni<3>, tile_avx_vnni<4>};
  if (int8_gemm_isa() == Int8Isa::AvxVnni) tiles = vnni;
#endif
  const int64_t lda = B.Kq;
  for (int64_t j = 0; j < nw; j += 4 * kPanel) {
    const int64_t n = std::min<int64_t>(4 * kPanel, nw - j);
    for (int64_t i = 0; i < M; i += 4) {
      const int64_t m = std::min<int64_t>(4, M - i);
      for (int64_t p = 0; p * kPanel < n; ++p) {
        const int64_t q = (n0 + j) / kPanel + p, cols = std::min<int64_t>(kPanel, n - p * kPanel);
        const float* bp = bias ? bias + j + p * kPanel : nullptr;
        tiles[m - 1](a + i * lda, lda, a_scale + i, B, q, cols, bp, accumulate, C + j + p * kPanel, c, i);
      }
    }
  }
}

}  // namespace

// Columns outer (groups of 4 panels: Kq x 64 bytes, kept in L2 while every row tile passes), row
// tiles inner, the M rows in tiles as even as 6-row tiles allow (8 rows: 4 + 4, not 6 + 2).
void int8_gemm(int64_t M, const uint8_t* a, const float* a_scale, const Int8Panels& B, int64_t n0, int64_t nw,
               const float* bias, bool accumulate, float* C, Rows c) {
  TORCH_INTERNAL_ASSERT(n0 % kPanel == 0 && int8_gemm_available(), "int8_gemm: n0 on a panel, an AVX2 CPU");
  if (M <= 0) return;
  if (int8_gemm_isa() != Int8Isa::Avx512Vnni) return int8_gemm_avx2(M, a, a_scale, B, n0, nw, bias, accumulate, C, c);
  const int64_t lda = B.Kq, tiles = (M + 5) / 6;
  static thread_local TileSums sums;
  for (int64_t j = 0; j < nw; j += 4 * kPanel) {
    const int64_t n = std::min<int64_t>(4 * kPanel, nw - j), q = (n0 + j) / kPanel;
    const float* bj = bias ? bias + j : nullptr;
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t i = M * t / tiles, m = M * (t + 1) / tiles - i;
      const uint8_t* ai = a + i * lda;
      switch (m) {
        case 6: row_tile<6>(ai, lda, a_scale + i, B, q, n, bj, accumulate, C + j, c, i, sums); break;
        case 5: row_tile<5>(ai, lda, a_scale + i, B, q, n, bj, accumulate, C + j, c, i, sums); break;
        case 4: row_tile<4>(ai, lda, a_scale + i, B, q, n, bj, accumulate, C + j, c, i, sums); break;
        case 3: row_tile<3>(ai, lda, a_scale + i, B, q, n, bj, accumulate, C + j, c, i, sums); break;
        case 2: row_tile<2>(ai, lda, a_scale + i, B, q, n, bj, accumulate, C + j, c, i, sums); break;
        default: row_tile<1>(ai, lda, a_scale + i, B, q, n, bj, accumulate, C + j, c, i, sums); break;
      }
    }
  }
}
#else
void int8_gemm(int64_t, const uint8_t*, const float*, const Int8Panels&, int64_t, int64_t, const float*, bool, float*,
               Rows) {
  TORCH_INTERNAL_ASSERT(false, "int8_gemm: an x86-64 build only");
}
#endif

}  // namespace cpu
}  // namespace cudnn_rnn
