// Which engine runs the CPU backend's own float32 GEMMs: the time loop's recurrent products,
// the input projection and the input gradient (float64 always runs BLAS).
//   packed  the hand-written kernel against a matrix packed once per call (packed_gemm.h), in an
//           AVX-512 or an AVX2/FMA build (the cell loops' instruction set): masked rows read and
//           written in place
//   brgemm  oneDNN's micro-kernel through at::native::cpublas::brgemm (JIT for the machine's
//           ISA; BLAS where torch built no oneDNN ukernels): the recurrent products gate by gate;
//           the input projection and gradient on ATen's GEMM
//   blas    the BLAS ATen calls (MKL in the x86-64 wheels), the rows of a masked step gathered;
//           the recurrent products read the kernel packed once per call through MKL's packed
//           GEMM API where torch exports it (cpu/rnn_cpu.cpp)
// CUDNN_RNN_CPU_GEMM=packed|brgemm|blas picks one for every GEMM (read once). The default follows
// the machine and the GEMM, as measured by benchmarks/run.py and benchmarks/grid.py
// (docs/guides/performance.md): on Intel CPUs BLAS for the GEMMs whose operand B has at least
// 2^18 elements (K x N), where MKL's packed AVX-512 GEMM is level with the packed kernel's AVX-512
// build or ahead (fastrnns: level; PTB's B=20: 1.1x; it beat the AVX2 build by 1.2-1.55x), and
// where MKL's AVX2 kernels beat the packed kernel's AVX2 build at ATen's AVX2 level (Intel Xeon,
// family 6 model 106, LSTM T=50, B=32-128: H=512-1024 forward+backward 1.05-1.34x torch.nn
// against 0.89-1.08x, at H=256 1.19-1.44x against 1.08-1.28x), and the packed kernel below that, where
// it wins (the masked Keras-typical B=32, H=64 workload: BLAS 1.03-1.16x slower). GEMMs of fewer
// than kBlasMinRows rows (the forward recurrent products of a call with fewer batch rows, the
// input projection and gradient of fewer T x B rows) and the recurrent products of one-step calls
// run the packed kernel there too: MKL's packed GEMM packs the recurrent kernel again on every
// call, which a one-step call pays whole (the packed kernel's packs are kept across calls), and
// at 1-4 rows MKL's products trail the packed kernel's. Intel Xeon (family 6 model 207, AMX), 2
// threads, LSTM T=50, H=256-1024, torch.nn time / ours: B=1-4 forward 1.35-2.75x on the packed
// kernel against 0.87-2.10x on MKL's; one step at H=256-512 108-318 us against 247-832 us. From 8
// rows MKL's was level or ahead (H=1024, B=8: 1.19x against 1.08x). The packed kernel runs on the
// other AVX2 CPUs (it beat BLAS on AVX2 and on MKL's paths for other vendors; on AVX-512 CPUs of
// other vendors, AMD Zen 4 and later, its AVX-512 build); BLAS without AVX2. brgemm is opt-in:
// called on the recurrent products as they are (B unpacked: could_pack is false for float32) it
// ran between the two on the Intel host.
#pragma once

#include <cstdint>
#include <string>

namespace cudnn_rnn {
namespace cpu {

enum class GemmEngine { Packed, Brgemm, Blas };

// Rows (operand A's, where known) from which a GEMM may leave the packed kernel for BLAS.
constexpr int64_t kBlasMinRows = 8;
// The engine of a float32 GEMM whose operand B is K x N, of `rows` rows (-1: not known).
GemmEngine float_gemm_engine(int64_t k, int64_t n, int64_t rows = -1);
// The engine of the forward time loop's recurrent products (operand B K x N) for a call of
// `batch` rows a step and `time` steps.
GemmEngine float_recurrent_engine(int64_t k, int64_t n, int64_t batch, int64_t time);
// Tests only: choose from now on as on a machine whose default is `name` ('packed', 'blas' or
// 'blas_from_size': Intel; the packed kernel must run here), or "" for this
// machine's again. Not while a call runs: a call reads the choice more than once.
void override_machine_default(const std::string& name);
// The engine of a large float32 GEMM (what benchmarks report).
inline GemmEngine float_gemm_engine() { return float_gemm_engine(1 << 12, 1 << 12); }
// Tests only: run `name` ('packed', 'brgemm', 'blas') from now on, or "" for the chosen engine again.
void override_gemm_engine(const std::string& name);
const char* gemm_engine_name(GemmEngine engine);
// Whether this torch exposes cpublas::brgemm for float32 (CPUBLAS_BRGEMM_F32F32F32).
bool brgemm_available();

}  // namespace cpu
}  // namespace cudnn_rnn
