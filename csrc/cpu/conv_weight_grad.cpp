// conv_weight_grad.h's kernel. Layout: the gradient is summed as [cols][O] (cols = the kernel
// positions x input channels, in the weight's channels-last order [*K][C]), so a tile's
// accumulators (one vector of output channels per column) add straight into memory. The columns
// of one outer kernel position (kd, kh) and all kw are one contiguous slab of the padded input
// where the last dimension's dilation is 1 (kw * C + c); with dilation each kw is its own slab.
//
// Work: the output rows (n, od, oh: Wo pixels each) in a fixed number of chunks, each summed into
// its own partial [cols][O], and those added in chunk order; threads take (chunk, group of output
// channel tiles) pairs, whose outputs never overlap. Inside a chunk, blocks of about 128 pixels
// (whole output rows, or pieces of a longer row): the block's gradient is packed once per output
// channel tile (16 KiB), which stays in L1 while every column tile passes over it, and the next
// block is prefetched meanwhile. On an AMD EPYC Zen 5 (2 cores), the gradients of ConvLSTM2D's
// 3x3 kernels over 81920 pixels (C = 16 / 32 inputs, 128 outputs) ran at 410-430 GFLOP/s with
// AVX-512 (oneDNN's weight-gradient convolutions: 200-370) and 220-235 at the AVX2 level
// (oneDNN: 125-185).
#include "cpu/conv_weight_grad.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cpu/packed_gemm.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace cudnn_rnn {
namespace cpu {

#if defined(__x86_64__) && defined(__GNUC__)

namespace {

constexpr int64_t kMaxChunks = 16;
constexpr int64_t kPartialBytes = int64_t(32) << 20;  // all chunks' partial sums together, at most
constexpr int64_t kBlockPixels = 128;

struct Geometry {
  int64_t C, O, ldo;                           // input channels, output channels, floats between grad rows
  int64_t in[3], out[3], k[3], s[3], dl[3];    // D, H, W (1 for missing dimensions); in: the padded input
  int64_t rows() const { return out[0] * out[1]; }  // per image
};

// A block of pixels: output rows [r0, r1), columns [w0, w1) of each.
struct Block {
  int64_t r0, r1, w0, w1;
  int64_t pixels() const { return (r1 - r0) * (w1 - w0); }
};

// One tile's pass over a block: out[j * O + o] += sum over the block's pixels i of
// g[i * ldg + o] * (the pixel's input slab at kernel position (kd, kh))[xoff + j], for the
// tile's MO vectors of output channels (the last storing `last` of them) and NJ columns. g is the
// block of the gradient packed for the tile (pack_block): its pixels ldg floats apart.
struct TilePass {
  const float* x;  // padded input [N, *in, C]
  const float* g;  // the packed block
  float* out;      // partial sums at the tile's first column and output channel
  Block b;
  int64_t ldg, kd, kh, xoff;
  int last;
};

// The input slab of row r (n, od, oh) at outer kernel position (kd, kh), and its grad row.
inline const float* slab_of(const Geometry& g, const TilePass& t, int64_t r) {
  const int64_t per_image = g.rows(), n = r / per_image, rem = r - n * per_image;
  const int64_t od = rem / g.out[1], oh = rem - od * g.out[1];
  const int64_t id = od * g.s[0] + t.kd * g.dl[0], ih = oh * g.s[1] + t.kh * g.dl[1];
  return t.x + ((n * g.in[0] + id) * g.in[1] + ih) * g.in[2] * g.C + t.xoff;
}

#define CUDNN_RNN_AVX2 __attribute__((target("avx2,fma")))
#define CUDNN_RNN_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))

template <int MO, int NJ>
CUDNN_RNN_AVX512 void tile512(const Geometry& g, const TilePass& t) {
  const __mmask16 tail = t.last >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << t.last) - 1);
  __m512 acc[MO][NJ];
#pragma GCC unroll 2
  for (int m = 0; m < MO; ++m) {
#pragma GCC unroll 12
    for (int j = 0; j < NJ; ++j) acc[m][j] = _mm512_setzero_ps();
  }
  const int64_t width = t.b.w1 - t.b.w0, step = g.s[2] * g.C;
  for (int64_t r = t.b.r0; r < t.b.r1; ++r) {
    const float* xs = slab_of(g, t, r) + t.b.w0 * step;
    const float* gr = t.g + (r - t.b.r0) * width * t.ldg;
    for (int64_t w = 0; w < width; ++w, xs += step, gr += t.ldg) {
      __m512 v[MO];
#pragma GCC unroll 2
      for (int m = 0; m < MO; ++m) v[m] = _mm512_loadu_ps(gr + 16 * m);
#pragma GCC unroll 12
      for (int j = 0; j < NJ; ++j) {
        const __m512 s = _mm512_set1_ps(xs[j]);
#pragma GCC unroll 2
        for (int m = 0; m < MO; ++m) acc[m][j] = _mm512_fmadd_ps(v[m], s, acc[m][j]);
      }
    }
  }
#pragma GCC unroll 2
  for (int m = 0; m < MO; ++m) {
    const __mmask16 k = m + 1 == MO ? tail : __mmask16(0xFFFF);
#pragma GCC unroll 12
    for (int j = 0; j < NJ; ++j) {
      float* dst = t.out + j * g.O + 16 * m;
      _mm512_mask_storeu_ps(dst, k, _mm512_add_ps(acc[m][j], _mm512_maskz_loadu_ps(k, dst)));
    }
  }
}

template <int MO, int NJ>
CUDNN_RNN_AVX2 void tile256(const Geometry& g, const TilePass& t) {
  const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(t.last), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256 acc[MO][NJ];
#pragma GCC unroll 2
  for (int m = 0; m < MO; ++m) {
#pragma GCC unroll 6
    for (int j = 0; j < NJ; ++j) acc[m][j] = _mm256_setzero_ps();
  }
  const int64_t width = t.b.w1 - t.b.w0, step = g.s[2] * g.C;
  for (int64_t r = t.b.r0; r < t.b.r1; ++r) {
    const float* xs = slab_of(g, t, r) + t.b.w0 * step;
    const float* gr = t.g + (r - t.b.r0) * width * t.ldg;
    for (int64_t w = 0; w < width; ++w, xs += step, gr += t.ldg) {
      __m256 v[MO];
#pragma GCC unroll 2
      for (int m = 0; m < MO; ++m) v[m] = _mm256_loadu_ps(gr + 8 * m);
#pragma GCC unroll 6
      for (int j = 0; j < NJ; ++j) {
        const __m256 s = _mm256_broadcast_ss(xs + j);
#pragma GCC unroll 2
        for (int m = 0; m < MO; ++m) acc[m][j] = _mm256_fmadd_ps(v[m], s, acc[m][j]);
      }
    }
  }
  const __m256i all = _mm256_set1_epi32(-1);
#pragma GCC unroll 2
  for (int m = 0; m < MO; ++m) {
    const __m256i k = m + 1 == MO ? tail : all;
#pragma GCC unroll 6
    for (int j = 0; j < NJ; ++j) {
      float* dst = t.out + j * g.O + 8 * m;
      _mm256_maskstore_ps(dst, k, _mm256_add_ps(acc[m][j], _mm256_maskload_ps(dst, k)));
    }
  }
}

// The gradient's pixels of block b, output channel tiles [t0, t1) of `width` channels,
// copied into pack in one pass along the gradient's memory: tile t's pixel i at
// pack + ((t - t0) * pixels + i) * width, zeros past O. Read once there (and sequentially), the
// tiles' loads stay in L1: the gradient's own rows, 512 bytes apart at 128 channels, fall into an
// eighth of L1's sets, and each tile would reread them. With bias, the sums are added to bias[o].
CUDNN_RNN_AVX2 void pack_block(const Geometry& g, const float* grad, const Block& b, int64_t t0, int64_t t1,
                               int64_t width, float* pack, float* bias) {
  // A block (whole rows, or a piece of one) is consecutive pixels of the gradient.
  const int64_t first = b.r0 * g.out[2] + b.w0, pixels = b.pixels(), o_end = std::min(g.O, t1 * width);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = 0; i < pixels; ++i) {
    const float* src = grad + (first + i) * g.ldo;
    for (int64_t t = t0; t < t1; ++t) {
      float* dst = pack + ((t - t0) * pixels + i) * width;
      for (int64_t o = t * width, e = o + width; o < e; o += 8, dst += 8) {  // width: a multiple of 8
        if (o + 8 <= o_end) {
          const __m256 v = _mm256_loadu_ps(src + o);
          _mm256_storeu_ps(dst, v);
          if (bias != nullptr) _mm256_storeu_ps(bias + o, _mm256_add_ps(_mm256_loadu_ps(bias + o), v));
          continue;
        }
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(o_end - o)), lanes);
        const __m256 v = _mm256_maskload_ps(src + o, keep);  // zeros past O
        _mm256_storeu_ps(dst, v);
        if (bias != nullptr) {
          _mm256_maskstore_ps(bias + o, keep, _mm256_add_ps(_mm256_maskload_ps(bias + o, keep), v));
        }
      }
    }
  }
}

using TileFn = void (*)(const Geometry&, const TilePass&);
constexpr int kMO = 2;
#define CUDNN_RNN_WG_ROW(tile, mo)                                                                              \
  {nullptr, tile<mo, 1>, tile<mo, 2>, tile<mo, 3>, tile<mo, 4>, tile<mo, 5>, tile<mo, 6>, tile<mo, 7>, tile<mo, 8>, \
   tile<mo, 9>, tile<mo, 10>, tile<mo, 11>, tile<mo, 12>}
constexpr TileFn kTiles512[kMO + 1][13] = {{}, CUDNN_RNN_WG_ROW(tile512, 1), CUDNN_RNN_WG_ROW(tile512, 2)};
#undef CUDNN_RNN_WG_ROW
constexpr TileFn kTiles256[kMO + 1][7] = {
    {},
    {nullptr, tile256<1, 1>, tile256<1, 2>, tile256<1, 3>, tile256<1, 4>, tile256<1, 5>, tile256<1, 6>},
    {nullptr, tile256<2, 1>, tile256<2, 2>, tile256<2, 3>, tile256<2, 4>, tile256<2, 5>, tile256<2, 6>}};

// CUDNN_RNN_CPU_CONV_GRAD=aten leaves these gradients to ATen's convolution backward (oneDNN), for
// measurement.
bool own_kernel_chosen() {
  static const bool own = [] {
    const char* v = std::getenv("CUDNN_RNN_CPU_CONV_GRAD");
    return !(v != nullptr && std::string(v) == "aten");
  }();
  return own;
}

// The input slabs of one outer kernel position: {offset in a pixel's slab, first column, width}.
struct Slab {
  int64_t xoff, col, width;
};

std::vector<Slab> slabs_of(const Geometry& g) {
  std::vector<Slab> out;
  const int64_t kw = g.k[2], C = g.C;
  if (g.dl[2] == 1 || kw == 1) {
    out.push_back({0, 0, kw * C});
  } else {
    for (int64_t w = 0; w < kw; ++w) out.push_back({w * g.dl[2] * C, w * C, C});
  }
  return out;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> conv_weight_grad(const at::Tensor& input, const at::Tensor& grad,
                                                    at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                                    at::IntArrayRef pad_before, at::IntArrayRef pad_after,
                                                    at::IntArrayRef dilation, bool want_bias) {
  const int64_t nd = static_cast<int64_t>(kernel_size.size());
  if (!own_kernel_chosen() || !packed_gemm_available() || input.numel() == 0 || grad.numel() == 0 || input.scalar_type() != at::kFloat || grad.scalar_type() != at::kFloat ||
      !input.is_cpu() || !grad.is_cpu() || nd < 1 || nd > 3) {
    return {};
  }
  TORCH_INTERNAL_ASSERT(input.dim() == nd + 2 && grad.dim() == nd + 2 && stride.size() == kernel_size.size() &&
                        pad_before.size() == kernel_size.size() && pad_after.size() == kernel_size.size() &&
                        dilation.size() == kernel_size.size() && input.size(0) == grad.size(0));
  const int64_t N = input.size(0), C = input.size(-1), O = grad.size(-1);

  // The input with its zeros around it, contiguous.
  std::vector<int64_t> pads{0, 0};  // the channels first
  bool padded = false;
  for (int64_t d = nd; d-- > 0;) {
    pads.push_back(pad_before[d]);
    pads.push_back(pad_after[d]);
    padded = padded || pad_before[d] != 0 || pad_after[d] != 0;
  }
  const at::Tensor x = (padded ? at::constant_pad_nd(input, pads, 0) : input).contiguous();
  at::Tensor g_rows = grad.reshape({-1, O});
  if (g_rows.stride(1) != 1) g_rows = g_rows.contiguous();

  Geometry geo{C, O, g_rows.stride(0), {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}};
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t e = 3 - nd + d;
    geo.in[e] = x.size(1 + d);
    geo.out[e] = grad.size(1 + d);
    geo.k[e] = kernel_size[d];
    geo.s[e] = stride[d];
    geo.dl[e] = dilation[d];
    TORCH_INTERNAL_ASSERT(geo.out[e] == 0 || (geo.out[e] - 1) * geo.s[e] + (geo.k[e] - 1) * geo.dl[e] < geo.in[e]);
  }
  const int64_t cols = geo.k[0] * geo.k[1] * geo.k[2] * C, R = N * geo.rows();

  // Chunks: fixed by the shapes (never by the thread count), partial sums within budget.
  const int64_t per_chunk = std::max<int64_t>(cols * O * int64_t(sizeof(float)), 1);
  const int64_t chunks = std::max<int64_t>(1, std::min({kMaxChunks, R, kPartialBytes / per_chunk}));
  at::Tensor partial = at::zeros({chunks, cols, O}, input.options());
  at::Tensor bias_partial = want_bias ? at::zeros({chunks, O}, input.options()) : at::Tensor();

  const bool avx512 = packed_gemm_isa() == PackedIsa::Avx512;
  const int64_t vec = avx512 ? 16 : 8, max_cols = avx512 ? 12 : 6, tile_o = kMO * vec;
  const int64_t o_tiles = (O + tile_o - 1) / tile_o;
  const int64_t groups = std::min<int64_t>(o_tiles, (2 * at::get_num_threads() + chunks - 1) / chunks);
  // Blocks: whole output rows, about kBlockPixels pixels; a row longer than that in pieces.
  const int64_t Wo = geo.out[2], block_cols = std::min(Wo, kBlockPixels);
  const int64_t block_rows = Wo > kBlockPixels ? 1 : std::max<int64_t>(1, kBlockPixels / std::max<int64_t>(Wo, 1));
  const int64_t group_tiles = (o_tiles + groups - 1) / groups;
  const std::vector<Slab> slabs = slabs_of(geo);
  int64_t column_tiles = 0;  // per output channel tile and block
  for (const Slab& s : slabs) column_tiles += (s.width + max_cols - 1) / max_cols;
  column_tiles *= geo.k[0] * geo.k[1];
  const float* xp = x.data_ptr<float>();
  const float* gp = g_rows.data_ptr<float>();
  float* pp = partial.data_ptr<float>();
  float* bp = want_bias ? bias_partial.data_ptr<float>() : nullptr;

  at::parallel_for(0, chunks * groups, 1, [&](int64_t w0, int64_t w1) {
    std::unique_ptr<float[]> pack(new float[static_cast<size_t>(block_rows * block_cols * tile_o * group_tiles)]);
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t c = w / groups, grp = w - c * groups;
      const int64_t ra = R * c / chunks, rb = R * (c + 1) / chunks;
      const int64_t ta = o_tiles * grp / groups, tb = o_tiles * (grp + 1) / groups;
      float* part = pp + c * cols * O;
      const int64_t passes = std::max<int64_t>(1, (tb - ta) * column_tiles);
      for (Block blk{ra, std::min(rb, ra + block_rows), 0, block_cols}; blk.r0 < rb;) {
        const int64_t pixels = blk.pixels();
        pack_block(geo, gp, blk, ta, tb, tile_o, pack.get(), bp != nullptr ? bp + c * O : nullptr);
        // The next block's gradient rows, fetched into L2 a share at a time between the tiles'
        // passes over this one (read only by pack_block, they would otherwise come from memory
        // with nothing to overlap): the chunk's pixels after this block's last, up to a block.
        const int64_t p_next = (blk.r1 - 1) * Wo + blk.w1, p_stop = std::min(rb * Wo, p_next + block_rows * block_cols);
        const char* g_bytes = reinterpret_cast<const char*>(gp);
        int64_t next = 0, next_end = 0;  // byte offsets from gp: pointers only inside the gradient
        if (p_stop > p_next) {
          next = p_next * geo.ldo * int64_t(sizeof(float));
          next_end = ((p_stop - 1) * geo.ldo + O) * int64_t(sizeof(float));
        }
        const int64_t share = ((next_end - next) / 64 + passes - 1) / passes * 64;
        for (int64_t ot = ta; ot < tb; ++ot) {
          const int64_t o0 = ot * tile_o, on = std::min(tile_o, O - o0), mo = (on + vec - 1) / vec;
          TilePass t{xp, pack.get() + (ot - ta) * pixels * tile_o, nullptr, blk, tile_o, 0, 0, 0,
                     static_cast<int>(on - (mo - 1) * vec)};
          for (t.kd = 0; t.kd < geo.k[0]; ++t.kd) {
            for (t.kh = 0; t.kh < geo.k[1]; ++t.kh) {
              const int64_t col_base = (t.kd * geo.k[1] + t.kh) * geo.k[2] * C;
              for (const Slab& s : slabs) {
                for (int64_t j0 = 0; j0 < s.width; j0 += max_cols) {
                  const int64_t nj = std::min(max_cols, s.width - j0);
                  t.xoff = s.xoff + j0;
                  t.out = part + (col_base + s.col + j0) * O + o0;
                  (avx512 ? kTiles512[mo][nj] : kTiles256[mo][nj])(geo, t);
                  for (const int64_t end = std::min(next_end, next + share); next < end; next += 64) {
                    _mm_prefetch(g_bytes + next, _MM_HINT_T1);
                  }
                }
              }
            }
          }
        }
        // The next block: the rest of this row, or the next rows.
        if (blk.w1 < Wo) {
          blk.w0 = blk.w1;
          blk.w1 = std::min(Wo, blk.w1 + block_cols);
        } else {
          blk = Block{blk.r1, std::min(rb, blk.r1 + block_rows), 0, block_cols};
        }
      }
    }
  });

  // The chunks' sums in chunk order, then the [*K, C, O] sums seen as [O, C, *K].
  at::Tensor sum = chunks == 1 ? partial[0] : at::empty({cols, O}, input.options());
  if (chunks > 1) {
    float* sp = sum.data_ptr<float>();
    at::parallel_for(0, cols * O, 4096, [&](int64_t e0, int64_t e1) {
      std::copy(pp + e0, pp + e1, sp + e0);
      for (int64_t c = 1; c < chunks; ++c) {
        const float* src = pp + c * cols * O;
        for (int64_t e = e0; e < e1; ++e) sp[e] += src[e];
      }
    });
  }
  std::vector<int64_t> view_sizes(kernel_size.begin(), kernel_size.end()), order{nd + 1, nd};
  view_sizes.push_back(C);
  view_sizes.push_back(O);
  for (int64_t d = 0; d < nd; ++d) order.push_back(d);
  const at::Tensor grad_weight = sum.view(view_sizes).permute(order);
  at::Tensor grad_bias;
  if (want_bias) {
    grad_bias = at::empty({O}, input.options());
    float* gb = grad_bias.data_ptr<float>();
    std::copy(bp, bp + O, gb);
    for (int64_t c = 1; c < chunks; ++c) {
      for (int64_t o = 0; o < O; ++o) gb[o] += bp[c * O + o];
    }
  }
  return {grad_weight, grad_bias};
}

#else  // not x86-64 / GCC: ATen computes these gradients

std::tuple<at::Tensor, at::Tensor> conv_weight_grad(const at::Tensor&, const at::Tensor&, at::IntArrayRef,
                                                    at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                                                    at::IntArrayRef, bool) {
  return {};
}

#endif

}  // namespace cpu
}  // namespace cudnn_rnn
