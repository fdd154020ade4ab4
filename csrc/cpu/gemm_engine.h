// Which engine runs the CPU backend's own float32 GEMMs: the time loop's recurrent products,
// the input projection and the input gradient (float64 always runs BLAS).
//   packed  the hand-written AVX2/FMA kernel against a matrix packed once per call (packed_gemm.h):
//           masked rows read and written in place
//   brgemm  oneDNN's micro-kernel through at::native::cpublas::brgemm (JIT for the machine's
//           ISA; BLAS where torch built no oneDNN ukernels): the recurrent products gate by gate;
//           the input projection and gradient on ATen's GEMM
//   blas    the BLAS ATen calls (MKL in the x86-64 wheels), the rows of a masked step gathered
// CUDNN_RNN_CPU_GEMM=packed|brgemm|blas picks one (read once). The default follows the machine,
// as measured by benchmarks/run.py (README, "Performance"): BLAS on Intel CPUs at ATen's AVX-512
// level (ATEN_CPU_CAPABILITY=avx2 lowers it), where MKL runs its own AVX-512 kernels and the AVX2 kernel has half their width (fastrnns
// 1.2-1.55x faster); the packed kernel on the other AVX2 CPUs (it beat BLAS on AVX2 and on
// MKL's paths for other vendors); BLAS without AVX2. brgemm is opt-in: called on the recurrent
// products as they are (B unpacked: could_pack is false for float32) it ran between the two on
// the Intel AVX-512 host.
#pragma once

#include <string>

namespace cudnn_rnn {
namespace cpu {

enum class GemmEngine { Packed, Brgemm, Blas };

GemmEngine float_gemm_engine();
// Tests only: run `name` ('packed', 'brgemm', 'blas') from now on, or "" for the chosen engine again.
void override_gemm_engine(const std::string& name);
const char* gemm_engine_name(GemmEngine engine);
// Whether this torch exposes cpublas::brgemm for float32 (CPUBLAS_BRGEMM_F32F32F32).
bool brgemm_available();

}  // namespace cpu
}  // namespace cudnn_rnn
