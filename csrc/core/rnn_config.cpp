#include "core/rnn_config.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace cudnn_rnn {

const std::vector<std::string>& activation_names() {
  // Index = Activation enum value (cell_math.h).
  static const std::vector<std::string> names = {
      "tanh",     "sigmoid",     "relu",  "linear", "hard_sigmoid", "hard_sigmoid_keras2",
      "elu",      "selu",        "softsign", "softplus", "exponential", "relu6",
      "silu",     "gelu",        "mish",  "hard_silu", "log_sigmoid", "tanh_shrink",
      "celu",     "hard_shrink", "hard_tanh", "leaky_relu", "soft_shrink", "sparse_plus",
      "sparse_sigmoid", "squareplus"};
  TORCH_INTERNAL_ASSERT(names.size() == static_cast<size_t>(Activation::NumActivations));
  return names;
}

Activation parse_activation(const std::string& name, const char* argument) {
  const auto& names = activation_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<Activation>(i);
  }
  std::ostringstream known;
  for (size_t i = 0; i < names.size(); ++i) known << (i ? ", " : "") << names[i];
  TORCH_CHECK_VALUE(false, argument, " must be one of ", known.str(), "; got '", name, "'");
}

const std::vector<std::string>& cell_names() {
  static const std::vector<std::string> names = {"lstm", "gru", "simple_rnn"};  // index = CellKind
  return names;
}

CellKind parse_cell(const std::string& name) {
  const auto& names = cell_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<CellKind>(i);
  }
  TORCH_CHECK_VALUE(false, "cell must be 'lstm', 'gru' or 'simple_rnn'; got '", name, "'");
}

namespace {

// An argument's name in messages, written out only when a check fails (every call checks every
// weight): "h0", "dropout_masks[layer 1, direction 0]", "weights[layer 0, direction 1].kernel".
struct ArgName {
  const char* base;
  int64_t layer = -1, dir = -1;
  const char* member = nullptr;

  std::string str() const {
    std::ostringstream s;
    s << base;
    if (layer >= 0) s << "[layer " << layer << ", direction " << dir << "]";
    if (member != nullptr) s << "." << member;
    return s.str();
  }
};

void check_like(const at::Tensor& t, const at::Tensor& x, const ArgName& what) {
  TORCH_CHECK_TYPE(t.scalar_type() == x.scalar_type(), what.str(), " must have dtype ", x.scalar_type(),
                   " (the dtype of x); got ", t.scalar_type());
  TORCH_CHECK(t.device() == x.device(), what.str(), " must be on ", x.device(), " (the device of x); got ",
              t.device());
}

void check_shape(const at::Tensor& t, at::IntArrayRef expected, const ArgName& what) {
  TORCH_CHECK_VALUE(t.sizes() == expected, what.str(), " must have shape ", expected, "; got ", t.sizes());
}

RnnConfig config_of(const RnnInputs& in, const RnnOptions& o) {
  const at::Tensor& x = in.x;
  const auto& weights = in.weights;
  RnnConfig cfg;
  cfg.cell = parse_cell(o.cell);
  cfg.activation = parse_activation(o.activation, "activation");
  cfg.recurrent_activation = parse_activation(o.recurrent_activation, "recurrent_activation");
  cfg.use_bias = o.use_bias;
  cfg.reset_after = cfg.cell == CellKind::GRU && o.reset_after;
  TORCH_CHECK_VALUE(o.num_layers >= 1, "num_layers must be >= 1; got ", o.num_layers);
  cfg.num_layers = o.num_layers;
  cfg.num_directions = o.bidirectional ? 2 : 1;
  cfg.go_backwards = o.go_backwards;
  cfg.zero_output_for_mask = o.zero_output_for_mask;

  TORCH_CHECK_VALUE(x.dim() == 3, "x must have shape (batch, time, features); got ", x.sizes());
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble || x.scalar_type() == at::kHalf ||
                       x.scalar_type() == at::kBFloat16,
                   "x must be float32, float64, float16 or bfloat16; got ", x.scalar_type());
  cfg.batch = x.size(0);
  cfg.time = x.size(1);
  cfg.input_size = x.size(2);
  TORCH_CHECK_VALUE(cfg.time >= 1, "x must have at least one timestep; got shape ", x.sizes());

  const int64_t per_dir = cfg.tensors_per_direction();
  const int64_t stacks = cfg.num_layers * cfg.num_directions;
  TORCH_CHECK_VALUE(static_cast<int64_t>(weights.size()) == stacks * per_dir, "weights must hold ",
                    stacks * per_dir, " tensors (", cfg.num_layers, " layer(s) x ", cfg.num_directions,
                    " direction(s) x ", per_dir, " [kernel, recurrent_kernel", o.use_bias ? ", bias" : "",
                    "]); got ", weights.size());
  TORCH_CHECK_VALUE(weights[1].dim() == 2, "weights[layer 0, direction 0].recurrent_kernel must be 2-D; got ",
                    weights[1].sizes());
  cfg.units = weights[1].size(0);
  TORCH_CHECK_VALUE(cfg.units >= 1, "units must be >= 1; got recurrent_kernel of shape ", weights[1].sizes());
  const int64_t gu = cfg.gates() * cfg.units;

  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    for (int64_t d = 0; d < cfg.num_directions; ++d) {
      const int64_t base = (l * cfg.num_directions + d) * per_dir;
      const ArgName kname{"weights", l, d, "kernel"};
      check_like(weights[base], x, kname);
      check_shape(weights[base], {cfg.layer_input_size(l), gu}, kname);
      const ArgName rname{"weights", l, d, "recurrent_kernel"};
      check_like(weights[base + 1], x, rname);
      check_shape(weights[base + 1], {cfg.units, gu}, rname);
      if (o.use_bias) {
        const ArgName bname{"weights", l, d, "bias"};
        check_like(weights[base + 2], x, bname);
        if (cfg.reset_after) {
          check_shape(weights[base + 2], {2, gu}, bname);
        } else {
          check_shape(weights[base + 2], {gu}, bname);
        }
      }
    }
  }

  const auto& mask = in.mask;
  if (mask.has_value()) {
    TORCH_CHECK_TYPE(mask->scalar_type() == at::kBool, "mask must be a bool tensor; got ", mask->scalar_type());
    TORCH_CHECK(mask->device() == x.device(), "mask must be on ", x.device(), "; got ", mask->device());
    check_shape(*mask, {cfg.batch, cfg.time}, {"mask"});
  }
  struct DropoutList {
    at::TensorList masks;
    const char* name;
    bool recurrent;
  };
  for (const DropoutList& list : {DropoutList{in.dropout_masks, "dropout_masks", false},
                                  DropoutList{in.recurrent_dropout_masks, "recurrent_dropout_masks", true}}) {
    if (list.masks.empty()) continue;
    TORCH_CHECK_VALUE(static_cast<int64_t>(list.masks.size()) == stacks, list.name, " must be empty or hold ",
                      stacks, " tensors (one per layer and direction); got ", list.masks.size());
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
      for (int64_t d = 0; d < cfg.num_directions; ++d) {
        const auto& m = list.masks[l * cfg.num_directions + d];
        const ArgName what{list.name, l, d};
        check_like(m, x, what);
        const int64_t width = list.recurrent ? cfg.units : cfg.layer_input_size(l);
        TORCH_CHECK_VALUE(m.dim() == 3 && (m.size(0) == 1 || m.size(0) == cfg.gates()) && m.size(1) == cfg.batch &&
                              m.size(2) == width,
                          what.str(), " must have shape (1 or ", cfg.gates(), ", ", cfg.batch, ", ", width,
                          "); got ", m.sizes());
      }
    }
  }
  return cfg;
}

}  // namespace

RnnConfig make_config(const ForwardCall& call) {
  RnnConfig cfg = config_of(call.in, call.options);
  const at::Tensor& x = call.in.x;
  const int64_t stacks = cfg.num_layers * cfg.num_directions;
  if (call.h0.has_value()) {
    check_like(*call.h0, x, {"h0"});
    check_shape(*call.h0, {stacks, cfg.batch, cfg.units}, {"h0"});
  }
  if (call.c0.has_value()) {
    TORCH_CHECK_VALUE(cfg.has_cell_state(), "c0 is only accepted by the LSTM cell; got cell '", call.options.cell,
                      "'");
    check_like(*call.c0, x, {"c0"});
    check_shape(*call.c0, {stacks, cfg.batch, cfg.units}, {"c0"});
  }
  return cfg;
}

RnnConfig make_config(const BackwardCall& call) {
  RnnConfig cfg = config_of(call.in, call.options);
  const at::Tensor& x = call.in.x;
  const int64_t B = cfg.batch, LD = cfg.num_layers * cfg.num_directions, u = cfg.units;
  check_like(call.grad_y, x, {"grad_y"});
  check_shape(call.grad_y, {B, cfg.time, cfg.num_directions * u}, {"grad_y"});
  check_like(call.grad_h_n, x, {"grad_h_n"});
  check_shape(call.grad_h_n, {LD, B, u}, {"grad_h_n"});
  if (cfg.has_cell_state()) {
    check_like(call.grad_c_n, x, {"grad_c_n"});
    check_shape(call.grad_c_n, {LD, B, u}, {"grad_c_n"});
  }
  return cfg;
}

}  // namespace cudnn_rnn
