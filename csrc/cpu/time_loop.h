// The CPU backend's own time loop (cpu/rnn_cpu.cpp): what it splits across threads.
#pragma once

#include <cstdint>
#include <vector>

namespace cudnn_rnn {
namespace cpu {

// The units of a direction split into blocks, one per task of the time loop: each task runs the
// recurrent GEMM of its block's gate columns and then the cell update of those units for every
// row, so one step costs one fork-join. Blocks start at multiples of 8 units (one AVX2 vector);
// small problems get one block (a fork-join would cost more than their GEMM). At most the
// user's thread count (at::get_num_threads()) of blocks.
struct UnitBlocks {
  int64_t n;
  std::vector<int64_t> start;  // n + 1 bounds

  UnitBlocks(int64_t batch, int64_t units, int64_t gates);
  int64_t width(int64_t k) const { return start[k + 1] - start[k]; }
};

}  // namespace cpu
}  // namespace cudnn_rnn
