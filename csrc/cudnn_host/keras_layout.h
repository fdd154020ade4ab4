// Keras tensors <-> cuDNN's weight space: the gate permutations, the bias mode, and the copy
// plan that packs a stack's Keras weights into cuDNN's opaque buffer (and unpacks gradients).
//
// cuDNN addresses every matrix and bias by (pseudo-layer, linLayerID); pseudo-layer 2l+d is
// direction d of layer l (bidirectional) or l (unidirectional). linLayerIDs (cudnn_adv.h):
//   RNN_TANH/RELU  0 = W (input), 1 = R (recurrent)
//   LSTM           0-3 = W_i, W_f, W_c, W_o; 4-7 = R_i, R_f, R_c, R_o   (Keras order i, f, c, o)
//   GRU            0-2 = W_r, W_z, W_h; 3-5 = R_r, R_z, R_h           (Keras order z, r, h)
// Each matrix is row-major [u, in] (in = I_l or u): the transpose of the Keras column block.
// Biases use CUDNN_RNN_DOUBLE_BIAS: b_W with the input matrix, b_R with the recurrent one. The
// Keras LSTM / SimpleRNN bias goes to b_W and b_R is zero; GRU reset_after=True's bias rows are
// b_W (row 0) and b_R (row 1); use_bias=False packs zeros.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "core/rnn_config.h"

namespace cudnn_rnn {

struct CudnnLinLayer {
  int64_t keras_gate;  // column block of the Keras kernel / recurrent kernel / bias
  bool recurrent;      // R (applied to h) rather than W (applied to x)
};

// linLayerIDs per pseudo-layer: 8 (LSTM), 6 (GRU), 2 (SimpleRNN).
int64_t cudnn_lin_layer_count(CellKind cell);
CudnnLinLayer cudnn_lin_layer(CellKind cell, int64_t lin_layer_id);

// Where cudnnGetRNNWeightParams put one (pseudo-layer, linLayerID)'s matrix and bias, in
// elements from the start of the weight space.
struct WeightOffsets {
  int64_t matrix;
  int64_t bias;
};

// offsets[pseudo_layer * cudnn_lin_layer_count(cell) + lin_layer_id].
using WeightOffsetTable = std::vector<WeightOffsets>;

// Packs the Keras weights (op order: per layer, per direction, kernel, recurrent_kernel[, bias])
// into `space` (1-D, the weight space as elements of the weights' dtype). Any device.
void pack_keras_weights(const RnnConfig& cfg, at::TensorList weights, const WeightOffsetTable& offsets,
                        at::Tensor& space);

// The inverse for gradients: Keras-layout gradients (same order and shapes as the weights) from
// the gradient of the weight space. The Keras LSTM / SimpleRNN bias gradient is b_W's.
std::vector<at::Tensor> unpack_keras_gradients(const RnnConfig& cfg, at::TensorList weights,
                                               const WeightOffsetTable& offsets, const at::Tensor& grad_space);

}  // namespace cudnn_rnn
