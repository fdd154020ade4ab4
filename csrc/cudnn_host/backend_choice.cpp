#include "cudnn_host/backend_choice.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <mutex>
#include <sstream>

namespace cudnn_rnn {

std::vector<int32_t> right_padded_lengths(const at::Tensor& mask) {
  TORCH_CHECK(mask.device().is_cpu() && mask.scalar_type() == at::kBool && mask.dim() == 2,
              "right_padded_lengths needs a [B, T] bool CPU mask");
  const at::Tensor m = mask.contiguous();
  const bool* p = m.data_ptr<bool>();
  const int64_t B = m.size(0), T = m.size(1);
  std::vector<int32_t> lengths(B);
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = 0;
    while (n < T && p[b * T + n]) ++n;
    for (int64_t t = n; t < T; ++t) {
      if (p[b * T + t]) return {};  // a real step after padding
    }
    lengths[b] = static_cast<int32_t>(n);
  }
  return lengths;
}

std::vector<std::pair<std::string, std::string>> standard_departures(const RnnConfig& cfg) {
  const auto& names = activation_names();
  auto setting = [&](const char* what, Activation a) {
    return std::string(what) + "='" + names[static_cast<size_t>(a)] + "'";
  };
  std::vector<std::pair<std::string, std::string>> out;
  if (cfg.cell == CellKind::SimpleRNN) {
    if (cfg.activation != Activation::Tanh && cfg.activation != Activation::Relu)
      out.emplace_back(setting("activation", cfg.activation), "tanh or relu only");
    return out;
  }
  if (cfg.activation != Activation::Tanh) out.emplace_back(setting("activation", cfg.activation), "tanh only");
  if (cfg.recurrent_activation != Activation::Sigmoid)
    out.emplace_back(setting("recurrent_activation", cfg.recurrent_activation), "sigmoid only");
  if (cfg.cell == CellKind::GRU && !cfg.reset_after)
    out.emplace_back("GRU reset_after=False", "the reset gate applies after the recurrent matmul");
  return out;
}

BackendChoice choose_backend(const RnnConfig& cfg, const c10::optional<at::Tensor>& mask_cpu,
                             at::TensorList dropout_masks, at::TensorList recurrent_dropout_masks,
                             at::ScalarType dtype, int64_t cudnn_version) {
  auto no = [](std::string why) { return BackendChoice{false, std::move(why), {}}; };
  const auto departures = standard_departures(cfg);
  if (!departures.empty()) {
    const auto& d = departures.front();
    return no(d.first + " is not supported by cuDNN (" + d.second + ")");
  }
  if (!recurrent_dropout_masks.empty()) return no("recurrent_dropout masks h inside the step, which cuDNN cannot");
  if (!dropout_masks.empty()) {
    if (cfg.num_layers > 1) return no("Keras dropout on the inputs of inner layers of a stack");
    if (cfg.num_directions == 2) return no("each direction's own input dropout mask (cuDNN reads one x)");
    for (const auto& m : dropout_masks) {
      if (m.size(0) != 1) return no("per-gate input dropout masks (Keras implementation=1)");
    }
  }
  // go_backwards on one layer without a mask is cuDNN on the time-reversed input (outputs in
  // processing order, as Keras returns them); a mask or a stack is not.
  if (cfg.go_backwards && mask_cpu.has_value())
    return no("go_backwards with a mask (Keras reverses the whole input, padding included)");
  if (cfg.go_backwards && cfg.num_layers > 1)
    return no("go_backwards in a stack (each Keras layer reverses its own input)");
  if (cfg.batch == 0) return no("an empty batch");
  if (dtype == at::kBFloat16 && cudnn_version < 91300) return no("bfloat16 RNNs need cuDNN >= 9.13");
  if (dtype != at::kFloat && dtype != at::kDouble && dtype != at::kHalf && dtype != at::kBFloat16)
    return no("dtype not supported by cuDNN");
  BackendChoice choice{true, "", std::vector<int32_t>(cfg.batch, static_cast<int32_t>(cfg.time))};
  if (mask_cpu.has_value()) {
    choice.lengths = right_padded_lengths(*mask_cpu);
    if (choice.lengths.empty()) return no("the mask is not right-padded");
    for (int32_t n : choice.lengths) {
      if (n == 0) return no("a row of the mask has no real step");
    }
  }
  return choice;
}

namespace {
std::mutex& preference_mutex() {
  static std::mutex m;
  return m;
}
std::string& preference() {
  static std::string p = "auto";
  return p;
}
}  // namespace

void set_algorithm_preference(const std::string& name) {
  // PERSIST_DYNAMIC is left out: it needs cudnnBuildRNNDynamic (an NVRTC compile) per descriptor.
  static const char* kNames[] = {"standard", "auto", "persist_static", "persist_static_small_h"};
  bool known = false;
  for (const char* n : kNames) known = known || name == n;
  TORCH_CHECK_VALUE(known, "algorithm must be 'standard', 'auto', 'persist_static' or 'persist_static_small_h'; got '",
                    name, "'");
  std::lock_guard<std::mutex> lock(preference_mutex());
  preference() = name;
}

std::string algorithm_preference() {
  std::lock_guard<std::mutex> lock(preference_mutex());
  return preference();
}

CudnnAlgo choose_algorithm(const RnnConfig& cfg, at::ScalarType dtype, bool uniform_lengths, int device_major) {
  const std::string pref = algorithm_preference();
  if (pref == "standard" || !uniform_lengths || dtype == at::kBFloat16 || device_major < 6) return CudnnAlgo::Standard;
  const bool small_h_ok = (dtype == at::kFloat || dtype == at::kHalf) &&
                          cfg.units <= (cfg.cell == CellKind::SimpleRNN ? 256 : 128);
  if (pref == "persist_static_small_h") return small_h_ok ? CudnnAlgo::PersistStaticSmallH : CudnnAlgo::Standard;
  if (pref == "persist_static") return CudnnAlgo::PersistStatic;
  // "auto": LSTM only. On an H200 (cuDNN 9.19) the persistent GRU and tanh/relu kernels gave
  // float32 weight gradients up to 8e-5 away from the CPU's (STANDARD: within 2e-5).
  return small_h_ok && cfg.cell == CellKind::LSTM ? CudnnAlgo::PersistStaticSmallH : CudnnAlgo::Standard;
}

}  // namespace cudnn_rnn
