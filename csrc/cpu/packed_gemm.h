// float32 GEMM against a matrix packed once: the CPU time loop's recurrent products (every step
// multiplies by the same recurrent kernel, so it is packed once per call instead of once per
// step, as BLAS does) with AVX-512 or AVX2 + FMA register tiles. Rows of A and C may be picked
// through an index list, so the masked rows of a step never enter the product and never need
// gathering.
#pragma once

#include <cstdint>
#include <string>

namespace cudnn_rnn {
namespace cpu {

// B [K, N] is stored as panels of kPanel columns: panel q holds, for k = 0..K-1, the kPanel
// values B[k, q * kPanel ...] contiguously (zero past column N).
constexpr int64_t kPanel = 16;
inline int64_t panel_count(int64_t n) { return (n + kPanel - 1) / kPanel; }
inline int64_t packed_size(int64_t K, int64_t N) { return K * kPanel * panel_count(N); }

// Whether this CPU runs the packed kernel (AVX2 and FMA); without it callers use BLAS.
bool packed_gemm_available();

// Which build of the kernel runs: AVX-512 where the cell loops run theirs (the CPU has
// AVX-512 F/BW/DQ/VL and ATen's level is AVX512; cpu::float_loops), else AVX2.
enum class PackedIsa { Avx2, Avx512 };
PackedIsa packed_gemm_isa();
// Whether this CPU can run the AVX-512 build (AVX-512 F/BW/DQ/VL).
bool packed_gemm_avx512_available();
// Tests only: run `name` ('avx2', 'avx512') from now on, or "" for the machine's choice again.
void override_packed_gemm_isa(const std::string& name);

// Packs B [K, N] into dst (packed_size(K, N) floats): B[k, n] = src[k * ld + n], or with trans
// src[n * ld + k].
void pack_panels(const float* src, int64_t ld, bool trans, int64_t K, int64_t N, float* dst);

// One operand's rows: row i is base + (rows ? rows[i] : i) * ld.
struct Rows {
  const int64_t* rows;  // nullable
  int64_t ld;
};

// C[i, j] = init(i, j) + sum_k A[i, k] * B[k, j] for i < M, j < N on the calling thread, where B
// is given by its packed panels (`panels` points at the panel holding column 0 of this range)
// and init is C[i, j] itself (accumulate), else bias[j] (bias non-null), else 0. Columns of the
// last panel past N are not touched.
void packed_gemm(int64_t M, int64_t N, int64_t K, const float* A, Rows a, const float* panels,
                 const float* bias, bool accumulate, float* C, Rows c);

// The same with A given transposed and no row lists, for weight gradients (A^T: a gate-gradient
// array, copied block by block into row tiles): C[i, j] = (accumulate ? C[i, j] : 0) + sum_k At[k * lda + i] * B[k, j],
// C's rows ldc apart. Either build (packed_gemm_isa()).
void packed_gemm_at(int64_t M, int64_t N, int64_t K, const float* At, int64_t lda, const float* panels,
                    bool accumulate, float* C, int64_t ldc);

}  // namespace cpu
}  // namespace cudnn_rnn
