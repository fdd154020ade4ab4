// The packed-panel float32 GEMM of packed_gemm.h, in two builds picked at run time
// (packed_gemm_isa): AVX2 + FMA tiles of up to 6 rows x 1 panel (12 ymm accumulators; per k two
// panel loads, one broadcast per row, two FMAs per row) and AVX-512 tiles of up to 6 rows x 4
// panels (24 zmm accumulators; per k four panel loads, one broadcast per row). Loop order
// (run_tiles): K in blocks (k_block: 512 rows of one panel, 64 or 512 of a group of four), then the
// panels of B (one or a group of four), then the rows of A in tiles, so one block of panels stays
// in L1 (AMD's AVX-512 blocks: L2) while every row tile streams past it, and the A rows of one K
// block stay in L2. On the
// Intel Xeon (AVX-512) the AVX-512 build ran a fastrnns LSTM forward's recurrent loop in 54 ms
// against the AVX2 build's 84 (MKL's packed GEMM: 49).
#include "cpu/packed_gemm.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/vec_loops.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace cudnn_rnn {
namespace cpu {

namespace {
constexpr int64_t kKc = 512;  // the longest K block
constexpr int64_t kMc = 192;  // rows of A per pass over B: kMc x one K block of floats stay in L2
// The rows of a K block for panels taken `group` at a time. One panel: 512 rows (32 KiB, in L1
// while every row tile of the pass reads it). A group of four (the AVX-512 tiles), by what each
// vendor's cores ran faster:
// - Intel: 64 rows (16 KiB, in L1). One core of the Intel Xeon (Ice Lake, AVX-512) ran a step's
//   128 x 256 x 512 product at 85-93 GFLOP/s with blocks of 512 rows (128 KiB, read from L2) and
//   at 121-131 with 64; 64, 96 and 128 read alike there.
// - Other vendors (AMD): 512 rows, read from L2 (fewer passes loading and storing C). On the AMD
//   EPYC Zen 4, whose 512-bit FMAs run at the rate of two 256-bit ones, LSTM forwards at
//   H = 256-1024 (B = 8-128, 2 threads) ran 6-14 % faster with 512 than with 64 and training
//   5-12 %; at H = 64-128 the two were level. The Zen 5 figures in docs/guides/performance.md
//   are with 512.
int64_t group_k_block() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const int64_t rows = __builtin_cpu_is("intel") ? 64 : kKc;
  return rows;
#else
  return kKc;
#endif
}
inline int64_t k_block(int64_t group) { return group == 1 ? kKc : group_k_block(); }
constexpr int64_t kAhead = 8;  // packed_gemm_at: rows of A^T fetched ahead of the copy
// packed_gemm_at: the floats from one packed A^T tile (kc x kMR) to the next, an odd number of
// cache lines. Tiles a multiple of 4 KiB apart (kc = 512, the AVX2 build's: 12 KiB) all start in
// the same L1 set, and the copy writing a k's six values to each of 32 tiles evicts its own
// half-written lines (a 12-way L1); an odd line count spreads 32 tiles over 32 sets. At most
// kc x kMR + 16.
inline int64_t tile_stride(int64_t kc, int64_t mr) {
  const int64_t lines = (kc * mr + 15) / 16;
  return (lines % 2 ? lines : lines + 1) * 16;
}

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

bool packed_gemm_avx512_available() { return packed_gemm_available() && cpu_has_avx512(); }

namespace {
std::atomic<int>& isa_override() {
  static std::atomic<int> slot{-1};
  return slot;
}
}  // namespace

PackedIsa packed_gemm_isa() {
  const int forced = isa_override().load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<PackedIsa>(forced);
  // The cell loops' choice: the CPU's and ATen's level (ATEN_CPU_CAPABILITY=avx2 lowers both).
  static const PackedIsa machine = std::string(float_loops().isa) == "avx512" ? PackedIsa::Avx512 : PackedIsa::Avx2;
  return machine;
}

void override_packed_gemm_isa(const std::string& name) {
  TORCH_CHECK_VALUE(name.empty() || name == "avx2" || name == "avx512",
                    "packed GEMM instruction set must be 'avx2' or 'avx512'; got '", name, "'");
  TORCH_CHECK_VALUE(name != "avx512" || packed_gemm_avx512_available(),
                    "the AVX-512 packed GEMM needs a CPU with AVX-512 F/BW/DQ/VL; this one has not");
  isa_override().store(name.empty() ? -1 : name == "avx512" ? int(PackedIsa::Avx512) : int(PackedIsa::Avx2));
}

// AVX2 + FMA code generation for these functions only; callers check packed_gemm_available().
#define CUDNN_RNN_AVX2 __attribute__((target("avx2,fma")))

namespace {

// Lanes [0, n) of a ymm mask (n in [0, 8]).
CUDNN_RNN_AVX2 inline __m256i lanes(int64_t n) {
  alignas(32) static const int32_t table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(table + 8 - n));
}

// Brings row k of the next pass's panels (`next`, NP panels pstride floats apart: one cache line
// each) towards L2 while this tile computes, so the pass after this one finds its block there
// rather than in memory. On one core of the AMD Zen 4 at the AVX2 level a 32 x 1024 x 4096 product
// (a step of an LSTM with H = 1024, B = 32: weights beyond L2) runs at 93-98 GFLOP/s with them,
// 63-80 without.
template <int NP>
inline void prefetch_next(const float* next, int64_t pstride, int64_t k) {
#pragma GCC unroll 4
  for (int p = 0; p < NP; ++p) _mm_prefetch(reinterpret_cast<const char*>(next + p * pstride + k * kPanel), _MM_HINT_T1);
}

// One tile: MR rows x the 16 columns of one panel, cols (<= 16) of them stored. TA: A given
// transposed (row i's k-th value at a_rows[0] + k * lda + i), each K block's sum added to C.
template <int MR, bool TA = false>
CUDNN_RNN_AVX2 void tile(int64_t kc, const float* const* a_rows, int64_t lda, const float* b, int64_t pstride,
                         const float* next, float* const* c_rows, const float* bias, bool load_c, int64_t cols) {
  const float* a[MR];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) a[i] = a_rows[i];
  const bool full = cols == kPanel;
  const __m256i m0 = lanes(std::min<int64_t>(cols, 8)), m1 = lanes(std::max<int64_t>(cols - 8, 0));
  __m256 lo[MR], hi[MR];
  if (load_c && !TA) {
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
  int64_t k = 0;
  if constexpr (TA) {
    const float* ak = a[0];
    for (; k < kc; ++k, ak += lda) {
      prefetch_next<1>(next, pstride, k);
      const __m256 b0 = _mm256_loadu_ps(b + k * kPanel), b1 = _mm256_loadu_ps(b + k * kPanel + 8);
#pragma GCC unroll 6
      for (int i = 0; i < MR; ++i) {
        const __m256 ai = _mm256_broadcast_ss(ak + i);
        lo[i] = _mm256_fmadd_ps(ai, b0, lo[i]);
        hi[i] = _mm256_fmadd_ps(ai, b1, hi[i]);
      }
    }
  }
  // Few rows leave too few independent FMA chains to cover the FMA latency: those tiles also
  // split k into S interleaved partial sums (at least 8 accumulators), added at the end.
  constexpr int S = MR >= 4 || TA ? 1 : (MR == 1 ? 4 : 2);
  __m256 lo_s[S > 1 ? S - 1 : 1][MR], hi_s[S > 1 ? S - 1 : 1][MR];
  if constexpr (S > 1) {
#pragma GCC unroll 4
    for (int j = 0; j < S - 1; ++j) {
#pragma GCC unroll 6
      for (int i = 0; i < MR; ++i) lo_s[j][i] = hi_s[j][i] = _mm256_setzero_ps();
    }
  }
  if constexpr (S > 1) {
    for (; k + S <= kc; k += S) {
#pragma GCC unroll 4
      for (int j = 0; j < S; ++j) {
        prefetch_next<1>(next, pstride, k + j);
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
    prefetch_next<1>(next, pstride, k);
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
    if (TA && load_c) {
      lo[i] = _mm256_add_ps(lo[i], full ? _mm256_loadu_ps(c_rows[i]) : _mm256_maskload_ps(c_rows[i], m0));
      hi[i] = _mm256_add_ps(hi[i], full ? _mm256_loadu_ps(c_rows[i] + 8) : _mm256_maskload_ps(c_rows[i] + 8, m1));
    }
    if (full) {
      _mm256_storeu_ps(c_rows[i], lo[i]);
      _mm256_storeu_ps(c_rows[i] + 8, hi[i]);
    } else {
      _mm256_maskstore_ps(c_rows[i], m0, lo[i]);
      _mm256_maskstore_ps(c_rows[i] + 8, m1, hi[i]);
    }
  }
}

// A tile (either build): (kc, a_rows, lda, b, pstride, next, c_rows, bias, load_c, last): rows
// a_rows[i] + [0, kc) (transposed tiles: a_rows[i] + k * lda for k < kc) times the kc x 16 blocks
// of its panels (pstride floats apart) into c_rows[i], the last panel's first `last` columns
// stored; `next`: the block of as many panels the following pass reads (prefetch_next).
using TileFn = void (*)(int64_t, const float* const*, int64_t, const float*, int64_t, const float*, float* const*,
                        const float*, bool, int64_t);
constexpr int kMR = 6;
static_assert(kMc % kMR == 0, "packed_gemm_at's block holds kMc / kMR whole row tiles");
constexpr TileFn kTiles[kMR + 1][2] = {{nullptr, nullptr}, {nullptr, tile<1>}, {nullptr, tile<2>}, {nullptr, tile<3>},
                                       {nullptr, tile<4>},  {nullptr, tile<5>}, {nullptr, tile<6>}};
constexpr TileFn kTilesT[kMR + 1][2] = {{nullptr, nullptr},       {nullptr, tile<1, true>}, {nullptr, tile<2, true>},
                                        {nullptr, tile<3, true>}, {nullptr, tile<4, true>}, {nullptr, tile<5, true>},
                                        {nullptr, tile<6, true>}};  // A^T row tiles

// One K block [k0, k0 + kc) against every panel of B in groups of `group` (tiles[mr][g]
// multiplies mr rows by g panels), the rows [m_begin, m_end) in tiles of kMR, or (even) in as few
// tiles as kMR allows, their sizes within one of each other (32 rows: 6, 5, 5, 5, 5, 6, not five
// of 6 and one of 2, whose two rows ran at half the FMA rate: 9 % of a fastrnns LSTM forward's
// time at the AVX2 level); set_rows(m0, mr, q, ap, cp) points ap / cp at the tile's A rows (or
// its transposed block) and C rows at panel q.
template <typename Tiles, typename SetRows>
void panel_pass(int64_t N, int64_t K, int64_t k0, int64_t kc, const float* panels, const float* bias, bool load_c,
                int64_t lda, int64_t m_begin, int64_t m_end, int64_t group, const Tiles& tiles,
                const SetRows& set_rows, bool even = false) {
  const int64_t rows = m_end - m_begin, row_tiles = (rows + kMR - 1) / kMR;
  const int64_t np = panel_count(N);
  const float* ap[kMR];
  float* cp[kMR];
  for (int64_t q = 0; q < np; q += group) {
    const int64_t g = std::min(group, np - q);
    const int64_t last = std::min(kPanel, N - (q + g - 1) * kPanel);
    const float* bq = panels + (q * K + k0) * kPanel;
    const float* bias_q = !load_c && bias ? bias + q * kPanel : nullptr;
    // The next pass's panels: the next group of this K block, else the first of the next K block
    // (rows [0, kc) of either lie inside the panels); where that group is short or there is
    // none, this block again (already cached: the prefetches cost a slot each and fetch nothing).
    const int64_t k1 = k0 + kc;
    const float* next = q + g + group <= np ? bq + g * K * kPanel
                        : k1 < K && group <= np && kc <= K - k1 ? panels + k1 * kPanel
                                                                : bq;
    for (int64_t t = 0; t < row_tiles; ++t) {
      const int64_t m0 = even ? m_begin + rows * t / row_tiles : m_begin + t * kMR;
      const int64_t mr = even ? m_begin + rows * (t + 1) / row_tiles - m0 : std::min<int64_t>(kMR, m_end - m0);
      set_rows(m0, mr, q, ap, cp);
      tiles[mr][g](kc, ap, lda, bq, K * kPanel, next, cp, bias_q, load_c, last);
    }
  }
}

// The loop both builds run: rows in blocks of kMc, K in blocks of k_block(group), then panel_pass.
template <typename Tiles>
void run_tiles(int64_t M, int64_t N, int64_t K, const float* A, Rows a, const float* panels, const float* bias,
               bool accumulate, float* C, Rows c, int64_t group, const Tiles& tiles) {
  const int64_t kb_rows = k_block(group), k_blocks = K == 0 ? 1 : (K + kb_rows - 1) / kb_rows;
  for (int64_t mb = 0; mb < M; mb += kMc) {
    const int64_t m_end = std::min(M, mb + kMc);
    for (int64_t kb = 0; kb < k_blocks; ++kb) {
      const int64_t k0 = kb * kb_rows, kc = std::min(kb_rows, K - k0);
      panel_pass(N, K, k0, kc, panels, bias, kb > 0 || accumulate, a.ld, mb, m_end, group, tiles,
                 [&](int64_t m0, int64_t mr, int64_t q, const float** ap, float** cp) {
                   for (int64_t i = 0; i < mr; ++i) {
                     ap[i] = row_of(A, a, m0 + i) + k0;
                     cp[i] = row_of(C, c, m0 + i) + q * kPanel;
                   }
                 },
                 /*even=*/true);
    }
  }
}

// AVX-512 (F/VL/BW/DQ) code generation for these functions only; packed_gemm() runs them where
// packed_gemm_isa() says "avx512".
#define CUDNN_RNN_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))

// One AVX-512 tile: MR rows x NP panels (one zmm each per row, up to 6 x 4 = 24 accumulators;
// per k NP panel loads and one broadcast per row); the panels lie pstride floats apart and the
// last one has `last` (<= 16) columns stored. A single row also splits k in two interleaved
// partial sums (8 accumulators against the FMA latency). Only the transposed tiles prefetch the
// next pass's panels: the others' panel loads and broadcasts leave the load ports no room (one
// step of an LSTM at B = 1, H = 512, weights in L3, ran 92 us without the prefetches and 105 with
// them; one core of the Intel Xeon (Ice Lake) ran 32 x 1024 x 2048, weights in L3, at 67-77
// GFLOP/s without them and 54-66 with them, and products in L2 lost 10-25 % to them).
template <int MR, int NP, bool TA = false>
CUDNN_RNN_AVX512 void tile512(int64_t kc, const float* const* a_rows, int64_t lda, const float* b, int64_t pstride,
                              const float* next, float* const* c_rows, const float* bias, bool load_c, int64_t last) {
  const float* a[MR];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) a[i] = a_rows[i];
  __mmask16 mask[NP];
#pragma GCC unroll 4
  for (int p = 0; p < NP; ++p) mask[p] = p + 1 < NP || last >= kPanel ? __mmask16(0xFFFF) : __mmask16((1u << last) - 1);
  __m512 acc[MR][NP];
#pragma GCC unroll 4
  for (int p = 0; p < NP; ++p) {
    const __m512 v = !load_c && bias ? _mm512_maskz_loadu_ps(mask[p], bias + p * kPanel) : _mm512_setzero_ps();
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) acc[i][p] = load_c && !TA ? _mm512_maskz_loadu_ps(mask[p], c_rows[i] + p * kPanel) : v;
  }
  int64_t k = 0;
  if constexpr (TA) {  // row i's k-th value at a[0] + k * lda + i: one pointer per k
    const float* ak = a[0];
    for (; k < kc; ++k, ak += lda) {
      prefetch_next<NP>(next, pstride, k);
      __m512 bv[NP];
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) bv[p] = _mm512_loadu_ps(b + p * pstride + k * kPanel);
#pragma GCC unroll 6
      for (int i = 0; i < MR; ++i) {
        const __m512 ai = _mm512_set1_ps(ak[i]);
#pragma GCC unroll 4
        for (int p = 0; p < NP; ++p) acc[i][p] = _mm512_fmadd_ps(ai, bv[p], acc[i][p]);
      }
    }
  }
  if constexpr (MR == 1 && !TA) {
    __m512 odd[NP];
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) odd[p] = _mm512_setzero_ps();
    for (; k + 2 <= kc; k += 2) {
      const __m512 a0 = _mm512_set1_ps(a[0][k]), a1 = _mm512_set1_ps(a[0][k + 1]);
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) {
        acc[0][p] = _mm512_fmadd_ps(a0, _mm512_loadu_ps(b + p * pstride + k * kPanel), acc[0][p]);
        odd[p] = _mm512_fmadd_ps(a1, _mm512_loadu_ps(b + p * pstride + (k + 1) * kPanel), odd[p]);
      }
    }
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) acc[0][p] = _mm512_add_ps(acc[0][p], odd[p]);
  }
  for (; k < kc; ++k) {
    __m512 bv[NP];
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) bv[p] = _mm512_loadu_ps(b + p * pstride + k * kPanel);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(a[i][k]);
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) acc[i][p] = _mm512_fmadd_ps(ai, bv[p], acc[i][p]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) {
      // Transposed tiles (the weight gradients' long sums over rows) add each K block's own sum
      // to C rather than continuing C's: float32 error of 20000-row sums 10x lower, at
      // torch.mm's.
      if (TA && load_c) acc[i][p] = _mm512_add_ps(acc[i][p], _mm512_maskz_loadu_ps(mask[p], c_rows[i] + p * kPanel));
      _mm512_mask_storeu_ps(c_rows[i] + p * kPanel, mask[p], acc[i][p]);
    }
  }
}

constexpr int kNP = 4;
#define CUDNN_RNN_TILE_ROW(mr, ta) \
  {nullptr, tile512<mr, 1, ta>, tile512<mr, 2, ta>, tile512<mr, 3, ta>, tile512<mr, 4, ta>}
#define CUDNN_RNN_TILE_TABLE(ta)                                                                          \
  {{nullptr, nullptr, nullptr, nullptr, nullptr}, CUDNN_RNN_TILE_ROW(1, ta), CUDNN_RNN_TILE_ROW(2, ta), \
   CUDNN_RNN_TILE_ROW(3, ta), CUDNN_RNN_TILE_ROW(4, ta), CUDNN_RNN_TILE_ROW(5, ta), CUDNN_RNN_TILE_ROW(6, ta)}
constexpr TileFn kTiles512[kMR + 1][kNP + 1] = CUDNN_RNN_TILE_TABLE(false);
constexpr TileFn kTiles512T[kMR + 1][kNP + 1] = CUDNN_RNN_TILE_TABLE(true);  // A^T row tiles
#undef CUDNN_RNN_TILE_TABLE
#undef CUDNN_RNN_TILE_ROW

}  // namespace

void packed_gemm(int64_t M, int64_t N, int64_t K, const float* A, Rows a, const float* panels, const float* bias,
                 bool accumulate, float* C, Rows c) {
  if (M <= 0 || N <= 0) return;
  if (packed_gemm_isa() == PackedIsa::Avx512) {
    run_tiles(M, N, K, A, a, panels, bias, accumulate, C, c, kNP, kTiles512);
  } else {
    run_tiles(M, N, K, A, a, panels, bias, accumulate, C, c, 1, kTiles);
  }
}

// run_tiles' loop order with A^T's block of kMc columns x k_block rows first copied into row tiles
// ([kc][kMR] each, the rows past M zero): read in place, every k of a tile touched another cache
// line of A^T (rows a whole gate-gradient row apart) and the fastrnns weight gradient ran at 90 ms
// against MKL's 37; packed, A^T is read once, in order.
void packed_gemm_at(int64_t M, int64_t N, int64_t K, const float* At, int64_t lda, const float* panels,
                    bool accumulate, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  const bool avx512 = packed_gemm_isa() == PackedIsa::Avx512;
  const int64_t kb_rows = k_block(avx512 ? kNP : 1), k_blocks = K == 0 ? 1 : (K + kb_rows - 1) / kb_rows;
  // (sized for the deepest block this K has: kc <= min(kb_rows, K), and tile_stride grows with kc)
  std::vector<float> block(size_t((kMc / kMR) * tile_stride(std::min(kb_rows, std::max<int64_t>(K, 1)), kMR)));
  for (int64_t mb = 0; mb < M; mb += kMc) {
    const int64_t m_end = std::min(M, mb + kMc), tiles = (m_end - mb + kMR - 1) / kMR;
    for (int64_t kb = 0; kb < k_blocks; ++kb) {
      const int64_t k0 = kb * kb_rows, kc = std::min(kb_rows, K - k0);
      const int64_t full = (m_end - mb) / kMR;  // tiles of kMR rows; the last may be partial
      const int64_t stride = tile_stride(kc, kMR);
      for (int64_t k = 0; k < kc; ++k) {
        const float* src = At + (k0 + k) * lda + mb;
        // Each k reads another row of A^T (lda floats on: a new page for the hardware prefetcher,
        // which stays within one), so the row kAhead on is fetched now. With the tiles skewed
        // (tile_stride) the copy then stops waiting: the weight gradient of an LSTM at H=256, B=32,
        // T=50 on an AMD EPYC Zen 5 (2 threads) took 5.0 ms with neither, 4.8 with the skew
        // alone, 4.25 with both.
        if (k + kAhead < kc) {
          const float* ahead = src + kAhead * lda;
          for (int64_t j = 0; j < m_end - mb; j += 16) _mm_prefetch(reinterpret_cast<const char*>(ahead + j), _MM_HINT_T0);
        }
        float* dst = block.data() + k * kMR;
        for (int64_t t = 0; t < full; ++t) std::memcpy(dst + t * stride, src + t * kMR, kMR * sizeof(float));
        for (int64_t t = full; t < tiles; ++t) {
          for (int64_t i = 0; i < kMR; ++i) {
            const int64_t m = t * kMR + i;
            dst[t * stride + i] = mb + m < m_end ? src[m] : 0.0f;
          }
        }
      }
      auto set_rows = [&](int64_t m0, int64_t mr, int64_t q, const float** ap, float** cp) {
        ap[0] = block.data() + (m0 - mb) / kMR * stride;  // tile (m0 - mb) / kMR: kc x kMR floats
        for (int64_t i = 0; i < mr; ++i) cp[i] = C + (m0 + i) * ldc + q * kPanel;
      };
      if (avx512) {
        panel_pass(N, K, k0, kc, panels, nullptr, kb > 0 || accumulate, kMR, mb, m_end, kNP, kTiles512T, set_rows);
      } else {
        panel_pass(N, K, k0, kc, panels, nullptr, kb > 0 || accumulate, kMR, mb, m_end, 1, kTilesT, set_rows);
      }
    }
  }
}

#else  // not x86-64: a plain loop, so the function is defined (callers use BLAS here)

bool packed_gemm_available() { return false; }
bool packed_gemm_avx512_available() { return false; }
PackedIsa packed_gemm_isa() { return PackedIsa::Avx2; }
void override_packed_gemm_isa(const std::string& name) {
  TORCH_CHECK_VALUE(name.empty(), "the packed GEMM runs on x86-64 only");
}

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

void packed_gemm_at(int64_t, int64_t, int64_t, const float*, int64_t, const float*, bool, float*, int64_t) {
  TORCH_CHECK(false, "packed_gemm_at: an x86-64 build only");
}

#endif

}  // namespace cpu
}  // namespace cudnn_rnn
