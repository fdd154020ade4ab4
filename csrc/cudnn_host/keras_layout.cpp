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
  at::Tensor matrix;  // [n * u, in] view into the weight space
  at::Tensor bias;    // [n * u]
  at::Tensor keras_block;  // [in, n * u] Keras column blocks
  at::Tensor keras_bias;   // [n * u] or undefined (zeros)
};

// One (pseudo-layer, linLayerID): where its Keras block and bias come from and where cuDNN keeps
// them.
struct SlotSource {
  int64_t weight;       // index of the kernel or recurrent kernel in the op's weights
  int64_t in;           // its rows
  int64_t keras_gate;   // its column block
  int64_t bias_weight;  // index of the bias tensor, or -1 (zeros)
  int64_t bias_row;     // the row of a [2, G * u] bias (GRU reset_after), or -1
  WeightOffsets off;
};

// Calls fn(slot) over the stack's (pseudo-layer, linLayerID)s, a run of them at a time: slots
// next to each other in cuDNN's order that read consecutive Keras gates of the same tensors into
// consecutive matrices and biases (an LSTM's four input or four recurrent gates, in cuDNN's usual
// layout) are one copy each, not one per gate.
template <typename Fn>
void for_each_slot(const RnnConfig& cfg, at::TensorList weights, const WeightOffsetTable& offsets,
                   const at::Tensor& space, Fn fn) {
  const int64_t n = cudnn_lin_layer_count(cfg.cell);
  const int64_t u = cfg.units;
  TORCH_CHECK(static_cast<int64_t>(offsets.size()) == cfg.num_layers * cfg.num_directions * n,
              "weight offset table has ", offsets.size(), " entries; expected ",
              cfg.num_layers * cfg.num_directions * n);
  std::vector<SlotSource> slots;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    for (int64_t d = 0; d < cfg.num_directions; ++d) {
      const int64_t pseudo = l * cfg.num_directions + d;
      const int64_t base = pseudo * cfg.tensors_per_direction();
      for (int64_t id = 0; id < n; ++id) {
        const CudnnLinLayer lin = cudnn_lin_layer(cfg.cell, id);
        const WeightOffsets& off = offsets[pseudo * n + id];
        SlotSource src{base + (lin.recurrent ? 1 : 0), 0, lin.keras_gate, -1, -1, off};
        src.in = weights[src.weight].size(0);
        TORCH_CHECK(off.matrix >= 0 && off.matrix + u * src.in <= space.numel() && off.bias >= 0 &&
                        off.bias + u <= space.numel(),
                    "weight offsets of pseudo-layer ", pseudo, ", linLayerID ", id, " fall outside the weight space");
        if (cfg.use_bias && (cfg.reset_after || !lin.recurrent)) {
          src.bias_weight = base + 2;
          src.bias_row = cfg.reset_after ? (lin.recurrent ? 1 : 0) : -1;
        }
        slots.push_back(src);
      }
    }
  }
  auto continues = [u](const SlotSource& a, const SlotSource& b, int64_t k) {
    return b.weight == a.weight && b.bias_weight == a.bias_weight && b.bias_row == a.bias_row &&
           b.keras_gate == a.keras_gate + k && b.off.matrix == a.off.matrix + k * u * a.in &&
           b.off.bias == a.off.bias + k * u;
  };
  for (size_t i = 0; i < slots.size();) {
    const SlotSource& a = slots[i];
    int64_t k = 1;
    while (i + k < slots.size() && continues(a, slots[i + k], k)) ++k;
    Slot slot;
    slot.matrix = space.narrow(0, a.off.matrix, k * u * a.in).view({k * u, a.in});
    slot.bias = space.narrow(0, a.off.bias, k * u);
    slot.keras_block = weights[a.weight].narrow(1, a.keras_gate * u, k * u);
    if (a.bias_weight >= 0) {
      const at::Tensor& bias = weights[a.bias_weight];
      slot.keras_bias = (a.bias_row >= 0 ? bias[a.bias_row] : bias).narrow(0, a.keras_gate * u, k * u);
    }
    fn(slot);
    i += static_cast<size_t>(k);
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
