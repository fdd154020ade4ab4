// Which backend runs a call on a CUDA tensor, and why not cuDNN. Pure logic on the config and
// the mask (host copy), so it is tested on the CPU; DESIGN.md's eligibility table.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/rnn_config.h"

namespace cudnn_rnn {

// Per-row lengths of a right-padded mask (each row: real steps, then only padding), or, when
// the mask is not right-padded, an empty vector. mask: [B, T] bool on the CPU.
std::vector<int32_t> right_padded_lengths(const at::Tensor& mask);

// How the cell departs from the one cuDNN (and torch.nn) implements -- tanh/sigmoid LSTM, GRU
// with the reset gate after the recurrent matmul, tanh/relu SimpleRNN: (setting, what the
// standard cell has) per departure, empty for a standard cell.
std::vector<std::pair<std::string, std::string>> standard_departures(const RnnConfig& cfg);

struct BackendChoice {
  bool cudnn;
  std::string reason;            // why not cuDNN ("" when cuDNN runs)
  std::vector<int32_t> lengths;  // per-row lengths for cuDNN (all T without a mask)
};

// cuDNN runs the call when the cell is one cuDNN has (tanh/sigmoid LSTM, GRU reset_after,
// tanh/relu SimpleRNN), the mask is absent or right-padded with no empty row, there is no
// recurrent dropout and no per-gate / inner-layer / per-direction input dropout, and
// go_backwards only on a single layer without a mask (cuDNN then reads the reversed input).
// cudnn_version: the runtime's (bfloat16 needs >= 91300).
BackendChoice choose_backend(const RnnConfig& cfg, const c10::optional<at::Tensor>& mask_cpu,
                             at::TensorList dropout_masks, at::TensorList recurrent_dropout_masks,
                             at::ScalarType dtype, int64_t cudnn_version);

// cuDNN RNN algorithms, as cudnnRNNAlgo_t numbers them.
enum class CudnnAlgo : int32_t { Standard = 0, PersistStatic = 1, PersistDynamic = 2, PersistStaticSmallH = 3 };

// The user's preference (cudnn_rnn.set_cudnn_algorithm): "auto" (the default: LSTM's persistent
// small-hidden kernel where its constraints hold), "standard", "persist_static" or
// "persist_static_small_h". A persistent algorithm cuDNN refuses for a configuration falls back
// to STANDARD, and that is remembered.
void set_algorithm_preference(const std::string& name);
std::string algorithm_preference();

// The algorithm a call uses, the same for its forward and its backward: STANDARD unless the
// preference allows a persistent one and its documented constraints hold (uniform lengths,
// no projection, not bfloat16; SMALL_H only for float16/float32 and hidden sizes <= 128 for
// LSTM/GRU, <= 256 for tanh/relu, which are PyTorch's backward thresholds; compute capability
// >= 6.0).
CudnnAlgo choose_algorithm(const RnnConfig& cfg, at::ScalarType dtype, bool uniform_lengths, int device_major);

}  // namespace cudnn_rnn
