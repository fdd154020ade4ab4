// The CPU backend's own time loop (cpu/rnn_cpu.cpp): what it splits across threads; and its
// weight-gradient GEMM.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace cudnn_rnn {
namespace cpu {

// The units of a direction split into blocks, one per task of the time loop: each task runs the
// recurrent GEMM of its block's gate columns and then the cell update of those units for every
// row, so one step costs one fork-join. Blocks start at multiples of 16 units (a panel of the
// packed GEMM, packed_gemm.h) and get at least 2^15 multiply-adds of the step GEMM each (below
// that a fork-join costs more than it saves: in-process A/B, the B=1, H=128 LSTM of the latency
// benchmark ran 5-7 % faster in two blocks of 2^15, the GRU's single block of 3 * 2^14 was
// already as fast as two; the Keras-typical B=32, H=64 LSTM splits in two on two threads).
// At most the user's thread count (at::get_num_threads()) of blocks.
struct UnitBlocks {
  int64_t n;
  std::vector<int64_t> start;  // n + 1 bounds

  UnitBlocks(int64_t batch, int64_t units, int64_t gates);
  int64_t width(int64_t k) const { return start[k + 1] - start[k]; }
};

// A^T · D in float32 (A: [R, k], D: [R, N]) on the packed kernel's AVX-512 build, or an undefined
// tensor where BLAS or another engine serves the shape (cpu/gemm_engine.h) or that build does not
// run.
at::Tensor packed_weight_grad(const at::Tensor& A, const at::Tensor& D);

}  // namespace cpu
}  // namespace cudnn_rnn
