#include "cudnn_host/keras_layout.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace cudnn_rnn {

int64_t cudnn_lin_layer_count(CellKind cell) { return cell == CellKind::LSTM ? 8 : (cell == CellKind::GRU ? 6 : 2); }

CudnnLinLayer cudnn_lin_layer(CellKind cell, int64_t id) {
  const int64_t per_side = cudnn_lin_layer_count(cell) / 2;
  TORCH_CHECK(id >= 0 && id < 2 * per_side, "linLayerID ", id, " out of range for this cell");
  const bool recurrent = id >= per_side;
  const int64_t gate = id % per_side;
  // cuDNN's GRU gate order is r, z, h; Keras's is z, r, h.
  static constexpr int64_t kGruKerasGate[3] = {1, 0, 2};
  return {cell == CellKind::GRU ? kGruKerasGate[gate] : gate, recurrent};
}

namespace {

struct Slot {
  at::Tensor matrix;  // [u, in] view into the weight space
  at::Tensor bias;    // [u]
  at::Tensor keras_block;  // [in, u] Keras column block
  at::Tensor keras_bias;   // [u] or undefined (zeros)
};

// Calls fn(slot) for every (pseudo-layer, linLayerID) of the stack.
template <typename Fn>
void for_each_slot(const RnnConfig& cfg, at::TensorList weights, const WeightOffsetTable& offsets,
                   const at::Tensor& space, Fn fn) {
  const int64_t n = cudnn_lin_layer_count(cfg.cell);
  const int64_t u = cfg.units;
  TORCH_CHECK(static_cast<int64_t>(offsets.size()) == cfg.num_layers * cfg.num_directions * n,
              "weight offset table has ", offsets.size(), " entries; expected ",
              cfg.num_layers * cfg.num_directions * n);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    for (int64_t d = 0; d < cfg.num_directions; ++d) {
      const int64_t pseudo = l * cfg.num_directions + d;
      const int64_t base = pseudo * cfg.tensors_per_direction();
      for (int64_t id = 0; id < n; ++id) {
        const CudnnLinLayer lin = cudnn_lin_layer(cfg.cell, id);
        const WeightOffsets& off = offsets[pseudo * n + id];
        const at::Tensor& source = weights[base + (lin.recurrent ? 1 : 0)];
        const int64_t in = source.size(0);
        TORCH_CHECK(off.matrix >= 0 && off.matrix + u * in <= space.numel() && off.bias >= 0 &&
                        off.bias + u <= space.numel(),
                    "weight offsets of pseudo-layer ", pseudo, ", linLayerID ", id, " fall outside the weight space");
        Slot slot;
        slot.matrix = space.narrow(0, off.matrix, u * in).view({u, in});
        slot.bias = space.narrow(0, off.bias, u);
        slot.keras_block = source.narrow(1, lin.keras_gate * u, u);
        if (cfg.use_bias) {
          const at::Tensor& bias = weights[base + 2];
          if (cfg.reset_after) {
            slot.keras_bias = bias[lin.recurrent ? 1 : 0].narrow(0, lin.keras_gate * u, u);
          } else if (!lin.recurrent) {
            slot.keras_bias = bias.narrow(0, lin.keras_gate * u, u);
          }
        }
        fn(slot);
      }
    }
  }
}

}  // namespace

void pack_keras_weights(const RnnConfig& cfg, at::TensorList weights, const WeightOffsetTable& offsets,
                        at::Tensor& space) {
  for_each_slot(cfg, weights, offsets, space, [](Slot& s) {
    s.matrix.copy_(s.keras_block.t());
    if (s.keras_bias.defined()) {
      s.bias.copy_(s.keras_bias);
    } else {
      s.bias.zero_();
    }
  });
}

std::vector<at::Tensor> unpack_keras_gradients(const RnnConfig& cfg, at::TensorList weights,
                                               const WeightOffsetTable& offsets, const at::Tensor& grad_space) {
  std::vector<at::Tensor> grads;
  grads.reserve(weights.size());
  for (const auto& w : weights) grads.push_back(at::zeros_like(w, at::MemoryFormat::Contiguous));
  // Slots point into `grads` (as keras_block / keras_bias) and into grad_space (matrix / bias).
  for_each_slot(cfg, grads, offsets, grad_space, [](Slot& s) {
    s.keras_block.copy_(s.matrix.t());
    if (s.keras_bias.defined()) s.keras_bias.copy_(s.bias);
  });
  return grads;
}

}  // namespace cudnn_rnn
