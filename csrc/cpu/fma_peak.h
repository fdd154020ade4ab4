// The machine's measured multiply-add throughput: what the benchmarks state their rates against
// (torch.mm's rate is no peak where BLAS runs below the machine's, as MKL does on AMD CPUs).
#pragma once

#include <string>

namespace cudnn_rnn {
namespace cpu {

// GFLOP/s of independent fused multiply-adds on every thread of at::get_num_threads() at once,
// in the widest vectors this CPU runs: "float32" (vfmadd231ps on AVX-512 or AVX2 registers) or
// "bfloat16" (vdpbf16ps, bfloat16 pairs accumulated in float32; 0 where the CPU has no
// AVX512_BF16). Best of `repeats` runs of about `seconds` each.
double fma_peak_gflops(const std::string& dtype, double seconds, int repeats);

// Whether this core multiplies-adds 512-bit registers at twice the rate of 256-bit ones (AMD Zen 5,
// Intel Xeons with two 512-bit FMA units), rather than at the same rate (AMD Zen 4, which splits a
// 512-bit operation in two; Intel Xeons with one 512-bit unit): the calling thread's FMA rate in
// AVX-512 registers at least 1.3x its rate in AVX2 registers, the two measured in turn, once, and
// kept. The ratio is 1.0 or 2.0 at one clock, where a rate alone moves with the clock; a lower
// AVX-512 clock takes it to 0.8-1.0 or 1.6-2.0 (an Intel Xeon Ice Lake VM: 1.61-2.16 over 100
// processes), far from the line either way. False without AVX-512.
bool full_width_avx512();

}  // namespace cpu
}  // namespace cudnn_rnn
