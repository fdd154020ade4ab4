// A small cache of large CPU buffers, reused across calls.
//
// A training step allocates a few hundred MB (input projections, the reserve, gradients) and
// frees them again; with the default allocator every call then pays the kernel's page faults
// and page zeroing on first touch, which at these sizes costs 5-10 % of the step. Buffers of
// at least kMinPooledBytes made here go back to this pool when their last tensor dies and are
// handed out again to a request of the same size class. At most cache_limit_bytes() sit idle in
// the pool (least recently freed first out); CUDNN_RNN_CPU_CACHE_MB sets it (0 disables).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace cudnn_rnn {
namespace cpu {

// 128 KiB: the bfloat16 backward's panels and gate gradients at H=256, B=8 (256-800 KiB each)
// come from the pool too (AMD EPYC Zen 5: 2-3 % of that training step in page faults).
constexpr int64_t kMinPooledBytes = 1 << 17;

// at::empty on the CPU, served from the pool when large enough.
at::Tensor pooled_empty(at::IntArrayRef sizes, at::ScalarType dtype);

// Bytes currently idle in the pool, and its limit.
int64_t cached_bytes();
int64_t cache_limit_bytes();
// Frees every idle buffer.
void empty_cache();

}  // namespace cpu
}  // namespace cudnn_rnn
