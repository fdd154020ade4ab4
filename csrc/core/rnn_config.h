// The one description of a recurrent stack (cell, activations, sizes, layers, directions) and
// the layout of its reserve buffer. Every device backend gets an RnnConfig built from the op's
// arguments by make_config, which validates the call once (Validated below), so error messages
// are the same everywhere.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <string>
#include <vector>

#include "core/cell_math.h"
#include "core/rnn_call.h"

namespace cudnn_rnn {

// Keras activation names, indexed by Activation. "hard_sigmoid" is the Keras 3 definition;
// "hard_sigmoid_keras2" the Keras 2 / tf.keras one (0.2 x + 0.5).
const std::vector<std::string>& activation_names();
Activation parse_activation(const std::string& name, const char* argument);
CellKind parse_cell(const std::string& name);
// The op's cell names, indexed by CellKind, and the gate blocks of each (Keras column order:
// LSTM i, f, c, o; GRU z, r, h; SimpleRNN one).
const std::vector<std::string>& cell_names();
constexpr int64_t gates_of(CellKind cell) { return cell == CellKind::LSTM ? 4 : (cell == CellKind::GRU ? 3 : 1); }

struct RnnConfig {
  CellKind cell;
  Activation activation;
  Activation recurrent_activation;
  bool use_bias;
  bool reset_after;  // GRU only
  int64_t num_layers;
  int64_t num_directions;
  bool go_backwards;  // direction 0 runs reversed; direction 1 runs the other way
  bool zero_output_for_mask;
  // Keep every step's saved activations for backward (false: no backward will run, so one
  // step's worth of scratch is reused and the reserve holds only the states). A backend sets it
  // from ForwardCall::need_grad when its driver may skip them (the CPU backend does).
  bool keep_saved = true;
  int64_t batch;
  int64_t time;
  int64_t input_size;
  int64_t units;
  // The caller's dtype when float16 / bfloat16 tensors run through a float32 driver (float
  // otherwise, set by driver::*_any_precision): a backend may feed its GEMMs in it, accumulating
  // in float32, while the cell update stays float32 (the CPU backend does for bfloat16 where
  // oneDNN packs it: cpu/bf16_gemm.h).
  at::ScalarType gemm_dtype = at::kFloat;

  int64_t gates() const { return gates_of(cell); }
  int64_t tensors_per_direction() const { return use_bias ? 3 : 2; }
  int64_t layer_input_size(int64_t layer) const { return layer == 0 ? input_size : num_directions * units; }
  bool has_cell_state() const { return cell == CellKind::LSTM; }
  // Masked steps output zeros (instead of the previous output)? Inner layers of a bidirectional
  // stack always do: they are Keras Bidirectional layers with return_sequences=True, which
  // forces zero_output_for_mask (and with go_backwards their masked outputs are read).
  bool zero_output(int64_t layer) const {
    return zero_output_for_mask || (num_directions == 2 && layer < num_layers - 1);
  }
  // Does direction d of a layer walk the sequence from the end?
  bool reversed(int64_t d) const { return d == 0 ? go_backwards : !go_backwards; }

  // Reserve layout, per (layer, direction), in elements of the input dtype:
  //   saved  [T, B, S]      what the cell's backward needs, processing order (absent when
  //                         !keep_saved); each backend fills it its own way: the CPU keeps the
  //                         activated gates for float32 tanh/sigmoid cells and pre-activations
  //                         otherwise (cpu/cell_rows.h), the generic CUDA kernels keep
  //                         pre-activations (cuda/generic_kernels_body.h)
  //   h      [T + 1, B, u]  hidden state before step 0 .. after step T-1 (!keep_saved: [2, B, u],
  //                         step s reading slot s % 2 and writing the other: state_slot)
  //   c      [T + 1, B, u]  LSTM only (likewise)
  // then, for layers 0 .. L-2, that layer's output [T, B, D*u] (the next layer's input).
  int64_t saved_width() const { return cell == CellKind::SimpleRNN ? units : 4 * units; }
  int64_t stored_saved_steps() const { return keep_saved ? time : 0; }
  int64_t stored_states() const { return keep_saved ? time + 1 : 2; }
  // Where the state before step s (s = 0 .. T) lies in the reserve's h and c.
  int64_t state_slot(int64_t s) const { return keep_saved ? s : s % 2; }
  int64_t reserve_per_direction() const {
    return stored_saved_steps() * batch * saved_width() + stored_states() * batch * units * (has_cell_state() ? 2 : 1);
  }
  int64_t reserve_size() const {
    return num_layers * num_directions * reserve_per_direction() +
           (num_layers - 1) * time * batch * num_directions * units;
  }
};

// Builds the config from a call and checks every tensor against it. Errors name the argument
// and give the expected and the actual shape / dtype / device. The backward call's gradients
// are checked too; its reserve belongs to the backend, which checks it.
RnnConfig make_config(const ForwardCall& call);
RnnConfig make_config(const BackwardCall& call);

// The kernels of a device backend: the call checked once, then Backend::forward(cfg, call) /
// Backend::backward(cfg, call). Registered as OpAdapter<Validated<Backend>>.
template <class Backend>
struct Validated {
  static auto forward(ForwardCall&& call) { return Backend::forward(make_config(call), call); }
  static auto backward(BackwardCall&& call) { return Backend::backward(make_config(call), call); }
};

}  // namespace cudnn_rnn
