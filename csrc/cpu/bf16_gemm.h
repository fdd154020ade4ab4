// bfloat16 GEMMs with float32 accumulation, for calls whose tensors are bfloat16 (the driver
// runs them in float32, RnnConfig::gemm_dtype says what they were): oneDNN's micro-kernel
// through at::native::cpublas::brgemm, which runs on AMX tiles (or AVX512_BF16) where the CPU
// has them. B is packed into oneDNN's VNNI layout once per call (a forward from bfloat16
// weights keeps its panels in the weight cache, plan_bf16.cpp), in panels of kBf16Panel
// columns (pack needs a panel width oneDNN knows); A is converted to bfloat16 by the caller.
// Values that came in as bfloat16 (x, the weights) survive the float32 round trip exactly, so
// only the recurrent state and the gradients are rounded to feed the GEMMs, as torch.nn's
// oneDNN RNN rounds them; the cell update stays float32.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace cudnn_rnn {
namespace cpu {

constexpr int64_t kBf16Panel = 64;

// Whether bfloat16 calls multiply in bfloat16: oneDNN's micro-kernel where this torch packs
// bfloat16 for it (CPUBLAS_BRGEMM_BF16BF16F32 and cpublas::could_pack(kBFloat16): AMX), else
// this file's own AVX512_BF16 kernel (vdpbf16ps tiles of 6 rows x 64 columns: AMD Zen 4 and 5,
// Intel Cooper Lake; where the cell loops run AVX-512). CUDNN_RNN_CPU_BF16=float32 (read once)
// turns both off: bfloat16 calls then compute in float32 throughout.
bool bf16_gemm_available();
// Which: "onednn", "avx512_bf16" or "none".
const char* bf16_gemm_kernel();

// The depth the micro-kernel multiplies for a product of depth K: even (VNNI pairs rows of B).
// Operand A needs that many columns, the last one zero where K is odd.
inline int64_t bf16_depth(int64_t K) { return (K + 1) / 2 * 2; }

// op(B) [K, N] in panels: panel p holds columns p * kBf16Panel .. + kBf16Panel, zero-padded to
// Kp = bf16_depth(K) rows.
struct Bf16Panels {
  at::Tensor data;
  int64_t K = 0, Kp = 0, N = 0;
  const at::BFloat16* panel(int64_t p) const { return data.data_ptr<at::BFloat16>() + p * Kp * kBf16Panel; }
};

// Packs b ([K, N] float32 or bfloat16, any strides: pass a transposed view for op(B) = B^T;
// bfloat16 values are packed as they are, float32 rounded to nearest). ATen calls:
// the calling thread must be the caller's, not a worker's.
Bf16Panels pack_bf16(const at::Tensor& b);

// C[M, 0 : nw] (leading dimension ldc; + C with add_C) = A[M, Kp] (bfloat16, lda) · op(B)[:, n0 : n0 + nw],
// n0 a multiple of kBf16Panel, on the calling thread. Call bf16_release() when the thread's
// task is done.
void bf16_gemm(int64_t M, const at::BFloat16* A, int64_t lda, const Bf16Panels& B, int64_t n0, int64_t nw, float* C,
               int64_t ldc, bool add_C);
void bf16_release();

// dst[c * ldd + r] = src[r * ld + c] rounded to bfloat16 for r < rows, c < cols: A^T of a
// row-major float32 A as a row-major bfloat16 matrix, in tiles across threads.
void transpose_to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, at::BFloat16* dst, int64_t ldd);
// The same from a bfloat16 A.
void transpose_bf16(const at::BFloat16* src, int64_t rows, int64_t cols, int64_t ld, at::BFloat16* dst, int64_t ldd);

// dst[i] = src[i] rounded to the nearest bfloat16 (ties to even), on the calling thread.
void to_bf16(const float* src, at::BFloat16* dst, int64_t n);

}  // namespace cpu
}  // namespace cudnn_rnn
