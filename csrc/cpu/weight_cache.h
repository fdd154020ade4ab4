// Packed forms of weight tensors (and the float32 copies of float16 / bfloat16 weights), kept
// across calls while the tensors are unchanged: inference, evaluation loops and streaming (one
// step a call) stop repacking the kernels on every call, and a training step's backward reuses
// its forward's float32 copies.
//
// An entry is keyed on the weight tensor and its storage (both held weakly, so a freed one is
// never mistaken for a new one at the same address), its offset, sizes, strides and dtype, the
// form ("what"), and the tensor's version counter: any in-place write through the tensor or a
// view of it (an optimizer step, load_state_dict, copy_ under no_grad) bumps the version and the
// next call packs again; another tensor on the same storage (a `.data`, a tied Parameter) has
// entries of its own. Writes that bypass the tensor's counter (through `.data` or another
// tensor sharing its storage, or another library's pointer) are not seen:
// cudnn_rnn.empty_cpu_cache() drops every entry. Inference-mode tensors have no version counter
// and are never cached. At most kWeightCacheEntries entries are kept, least recently used out;
// CUDNN_RNN_CPU_WEIGHT_CACHE=0 turns the cache off.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>

namespace cudnn_rnn {
namespace cpu {

constexpr int64_t kWeightCacheEntries = 256;

// The packed form `what` of `weight`: the cached one while `weight` is unchanged, else make()'s
// (then cached). make() runs on the calling thread.
at::Tensor cached_pack(const at::Tensor& weight, const char* what, const std::function<at::Tensor()>& make);

// Entries held now, packs made since the process started (tests: a hit makes none).
int64_t weight_cache_entries();
int64_t weight_cache_packs();
void clear_weight_cache();

}  // namespace cpu
}  // namespace cudnn_rnn
