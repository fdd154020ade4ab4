// int8 GEMMs of dynamically quantized inference (cudnn_rnn.quantize_dynamic): weights int8 with a
// scale per output column, activations quantized per row on the fly (symmetric, stored as
// unsigned bytes with zero point 128), int32 accumulation by vpdpbusd (AVX512_VNNI, or AVX_VNNI's
// 256-bit form) or, in the AVX2 build, vpmaddubsw on the values' magnitudes and the weights given
// their signs (the same int32 sums, the same results),
// float32 results: C[i, j] = s_a[i] * s_b[j] * (sum_k a_u8[i, k] * b[k, j] - 128 * colsum[j]) + bias[j].
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "cpu/packed_gemm.h"

namespace cudnn_rnn {
namespace cpu {

// Whether this CPU runs an int8 kernel (AVX2 + FMA); elsewhere quantized layers compute in float32.
bool int8_gemm_available();
// Which build runs: AVX512_VNNI (AVX-512 F/BW/VL with VNNI, where the cell loops run AVX-512),
// else AVX_VNNI (256-bit vpdpbusd) where the CPU has it, else AVX2. All give the same bits.
enum class Int8Isa { Avx2, AvxVnni, Avx512Vnni };
Int8Isa int8_gemm_isa();
// Whether this CPU can run the AVX512_VNNI / AVX_VNNI build.
bool int8_gemm_avx512_available();
bool int8_gemm_avx_vnni_available();
// Tests only: run 'avx2', 'avx_vnni' or 'avx512_vnni' from now on, or "" for the machine's choice.
void override_int8_gemm_isa(const std::string& name);

// The deepest product whose int32 sums cannot wrap: |sum (a - 128) b| <= 127 * 127 * K < 2^31.
constexpr int64_t kInt8MaxDepth = 131072;

// Depth padded to the kernel's groups of 4.
inline int64_t int8_depth(int64_t K) { return (K + 3) / 4 * 4; }

// B [K, N] quantized and packed (pack_int8): panels of 16 columns, each k group of 4 as 64 bytes
// (column c's 4 values at 4c), then the column scales (float) and column sums (int32), N padded to
// whole panels.
struct Int8Panels {
  const int8_t* panels;
  const float* scale;
  const int32_t* colsum;
  int64_t K, Kq, N;
};

// Packs B [K, N] (B[k, n] = src[k * sk + n * sn]) into one uint8 tensor, which every build reads;
// int8_view reads it back. A column holding a NaN or an infinity gets scale NaN (its products NaN).
at::Tensor pack_int8(const float* src, int64_t sk, int64_t sn, int64_t K, int64_t N);
Int8Panels int8_view(const at::Tensor& packed, int64_t K, int64_t N);

// Rows of x (row i is x + (rows ? rows[i] : i) * ld, K values) quantized: a[i * Kq + k] (the pad
// up to Kq is 128, the zero), scale[i] = max |x_i| / 127 (1 for a zero row; NaN for a row holding
// a NaN or an infinity, whose products then come out NaN). Every build gives the same values.
void quantize_rows(const float* x, int64_t ld, const int64_t* rows, int64_t M, int64_t K, int64_t Kq, uint8_t* a,
                   float* scale);

// C[i, j] (+)= the product above for columns n0 .. n0 + nw of B (n0 a multiple of 16), i < M; C's
// row i is C + (c.rows ? c.rows[i] : i) * c.ld; bias[j] is the bias of column n0 + j (nullable);
// accumulate adds to C instead of writing it. On the calling thread.
void int8_gemm(int64_t M, const uint8_t* a, const float* a_scale, const Int8Panels& B, int64_t n0, int64_t nw,
               const float* bias, bool accumulate, float* C, Rows c);

}  // namespace cpu
}  // namespace cudnn_rnn
