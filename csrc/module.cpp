// The pybind11 module cudnn_rnn._C: build information and helpers that are not ops. Importing it
// also loads the library that registers the ops (csrc/ops.cpp and the per-backend files).
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <vector>

#include "backend_choice.h"
#include "build_info.h"
#include "cpu/activation_arrays.h"
#include "cpu/buffer_pool.h"
#include "cpu/packed_gemm.h"
#include "cpu/time_loop.h"
#include "kernel_emulation.h"
#include "keras_layout.h"
#include "rnn_config.h"

namespace {

// f(x) and f'(x) through the CPU backend's array kernels: lets the tests hold every activation
// (vectorised or scalar) to Keras's own definition.
std::pair<at::Tensor, at::Tensor> apply_activation(const std::string& name, const at::Tensor& x) {
  const auto a = cudnn_rnn::parse_activation(name, "name");
  TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor; got ", x.device());
  at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc);
  at::Tensor g = at::empty_like(xc);
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "apply_activation", [&] {
    cudnn_rnn::cpu::activate_array(a, xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), xc.numel());
    cudnn_rnn::cpu::activate_grad_array(a, xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(),
                                        xc.numel());
  });
  return {y, g};
}

// The cuDNN weight-space plan on the CPU, for tests: offsets is an [n, 2] int64 tensor of
// (matrix, bias) element offsets, one row per (pseudo-layer, linLayerID).
cudnn_rnn::RnnConfig layout_config(const std::string& cell, bool reset_after, bool use_bias, int64_t num_layers,
                                   bool bidirectional, int64_t input_size, int64_t units) {
  cudnn_rnn::RnnConfig cfg{};
  cfg.cell = cudnn_rnn::parse_cell(cell);
  cfg.use_bias = use_bias;
  cfg.reset_after = cfg.cell == cudnn_rnn::CellKind::GRU && reset_after;
  cfg.num_layers = num_layers;
  cfg.num_directions = bidirectional ? 2 : 1;
  cfg.input_size = input_size;
  cfg.units = units;
  return cfg;
}

cudnn_rnn::WeightOffsetTable offset_table(const at::Tensor& offsets) {
  TORCH_CHECK(offsets.dim() == 2 && offsets.size(1) == 2 && offsets.scalar_type() == at::kLong,
              "offsets must be an int64 tensor of shape (n, 2)");
  cudnn_rnn::WeightOffsetTable table;
  auto acc = offsets.accessor<int64_t, 2>();
  for (int64_t i = 0; i < offsets.size(0); ++i) table.push_back({acc[i][0], acc[i][1]});
  return table;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "cudnn_rnn native extension";
  m.def("build_info", &cudnn_rnn::accelerator_build_info,
        "What the extension was compiled with: {'cuda': version or 'no', 'cudnn': version or 'no', ...}");
  m.def("cudnn_fallback_count", &cudnn_rnn::cudnn_fallback_count,
        "How many calls on CUDA tensors did not run on cuDNN since the process started");
  m.def("activation_names", &cudnn_rnn::activation_names,
        "Keras activation names the kernels implement, in the order of the C++ Activation enum");
  m.def("cell_gates", [] {
        std::vector<std::pair<std::string, int64_t>> out;
        for (size_t i = 0; i < cudnn_rnn::cell_names().size(); ++i)
          out.emplace_back(cudnn_rnn::cell_names()[i], cudnn_rnn::gates_of(static_cast<cudnn_rnn::CellKind>(i)));
        return out;
      }, "(cell name, gate blocks) for every cell the op has");
  m.def("standard_departures", [](const std::string& cell, const std::string& activation,
                                  const std::string& recurrent_activation, bool reset_after) {
        cudnn_rnn::RnnConfig cfg{};
        cfg.cell = cudnn_rnn::parse_cell(cell);
        cfg.activation = cudnn_rnn::parse_activation(activation, "activation");
        cfg.recurrent_activation = cudnn_rnn::parse_activation(recurrent_activation, "recurrent_activation");
        cfg.reset_after = reset_after;
        return cudnn_rnn::standard_departures(cfg);
      }, "(setting, what the standard cell has) for each way a cell departs from cuDNN's / torch.nn's");
  m.def("cudnn_lin_layer", [](const std::string& cell, int64_t id) {
        auto lin = cudnn_rnn::cudnn_lin_layer(cudnn_rnn::parse_cell(cell), id);
        return std::make_pair(lin.keras_gate, lin.recurrent);
      }, "(Keras gate block, is recurrent) of a cuDNN linLayerID");
  m.def("pack_keras_weights", [](const std::string& cell, bool reset_after, bool use_bias, int64_t num_layers,
                                 bool bidirectional, int64_t input_size, int64_t units,
                                 const std::vector<at::Tensor>& weights, const at::Tensor& offsets, int64_t space_size) {
        auto cfg = layout_config(cell, reset_after, use_bias, num_layers, bidirectional, input_size, units);
        at::Tensor space = at::full({space_size}, std::nan(""), weights[0].options());
        cudnn_rnn::pack_keras_weights(cfg, weights, offset_table(offsets), space);
        return space;
      }, "cuDNN weight-space packing on any device (for tests)");
  m.def("unpack_keras_gradients", [](const std::string& cell, bool reset_after, bool use_bias, int64_t num_layers,
                                     bool bidirectional, int64_t input_size, int64_t units,
                                     const std::vector<at::Tensor>& weights, const at::Tensor& offsets,
                                     const at::Tensor& grad_space) {
        auto cfg = layout_config(cell, reset_after, use_bias, num_layers, bidirectional, input_size, units);
        return cudnn_rnn::unpack_keras_gradients(cfg, weights, offset_table(offsets), grad_space);
      }, "the inverse of pack_keras_weights for gradients (for tests)");
  m.def("choose_backend", [](const std::string& cell, const std::string& activation,
                             const std::string& recurrent_activation, bool reset_after, int64_t num_layers,
                             bool bidirectional, bool go_backwards, int64_t batch, int64_t time,
                             const c10::optional<at::Tensor>& mask, int64_t dropout_gates, bool recurrent_dropout,
                             const std::string& dtype, int64_t cudnn_version) {
        cudnn_rnn::RnnConfig cfg{};
        cfg.cell = cudnn_rnn::parse_cell(cell);
        cfg.activation = cudnn_rnn::parse_activation(activation, "activation");
        cfg.recurrent_activation = cudnn_rnn::parse_activation(recurrent_activation, "recurrent_activation");
        cfg.reset_after = reset_after;
        cfg.num_layers = num_layers;
        cfg.num_directions = bidirectional ? 2 : 1;
        cfg.go_backwards = go_backwards;
        cfg.batch = batch;
        cfg.time = time;
        std::vector<at::Tensor> dm, rdm;
        if (dropout_gates > 0) dm.push_back(at::ones({dropout_gates, batch, 1}));
        if (recurrent_dropout) rdm.push_back(at::ones({1, batch, 1}));
        const at::ScalarType st = dtype == "float16" ? at::kHalf : dtype == "bfloat16" ? at::kBFloat16
                                : dtype == "float64" ? at::kDouble : at::kFloat;
        auto c = cudnn_rnn::choose_backend(cfg, mask, dm, rdm, st, cudnn_version);
        return std::make_tuple(c.cudnn, c.reason, c.lengths);
      }, "the CUDA backend choice for a configuration (for tests and explain)");
  m.def("set_cudnn_algorithm", &cudnn_rnn::set_algorithm_preference,
        "'standard' (default), 'auto', 'persist_static' or 'persist_static_small_h'");
  m.def("cudnn_algorithm", &cudnn_rnn::algorithm_preference, "the cuDNN algorithm preference");
  m.def("choose_algorithm", [](const std::string& cell, int64_t units, const std::string& dtype, bool uniform_lengths,
                               int device_major) {
        cudnn_rnn::RnnConfig cfg{};
        cfg.cell = cudnn_rnn::parse_cell(cell);
        cfg.units = units;
        const at::ScalarType st = dtype == "float16" ? at::kHalf : dtype == "bfloat16" ? at::kBFloat16
                                : dtype == "float64" ? at::kDouble : at::kFloat;
        static const char* kNames[] = {"STANDARD", "PERSIST_STATIC", "PERSIST_DYNAMIC", "PERSIST_STATIC_SMALL_H"};
        return std::string(kNames[static_cast<int>(cudnn_rnn::choose_algorithm(cfg, st, uniform_lengths, device_major))]);
      }, "the cuDNN algorithm a call would use (before any refusal by cuDNN)");
  m.def("emulated_generic_forward",
        [](int64_t order, const at::Tensor& x, const std::vector<at::Tensor>& weights,
           const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& h0,
           const c10::optional<at::Tensor>& c0, const std::vector<at::Tensor>& dropout_masks,
           const std::vector<at::Tensor>& recurrent_dropout_masks, const std::string& cell,
           const std::string& activation, const std::string& recurrent_activation, bool use_bias, bool reset_after,
           int64_t num_layers, bool bidirectional, bool go_backwards, bool zero_output_for_mask) {
          auto cfg = cudnn_rnn::make_config(x, weights, mask, h0, c0, dropout_masks, recurrent_dropout_masks, cell,
                                            activation, recurrent_activation, use_bias, reset_after, num_layers,
                                            bidirectional, go_backwards, zero_output_for_mask);
          return cudnn_rnn::emulated_generic_forward(order, cfg, x, weights, mask, h0, c0, dropout_masks,
                                                     recurrent_dropout_masks);
        },
        "rnn_forward through the generic CUDA kernels' element functions, run on the CPU (for tests)");
  m.def("emulated_generic_backward",
        [](int64_t order, const at::Tensor& grad_y, const at::Tensor& grad_h_n, const at::Tensor& grad_c_n,
           const at::Tensor& x, const std::vector<at::Tensor>& weights, const c10::optional<at::Tensor>& mask,
           const std::vector<at::Tensor>& dropout_masks, const std::vector<at::Tensor>& recurrent_dropout_masks,
           const at::Tensor& reserve, const std::string& cell, const std::string& activation,
           const std::string& recurrent_activation, bool use_bias, bool reset_after, int64_t num_layers,
           bool bidirectional, bool go_backwards, bool zero_output_for_mask) {
          auto cfg = cudnn_rnn::make_config(x, weights, mask, c10::nullopt, c10::nullopt, dropout_masks,
                                            recurrent_dropout_masks, cell, activation, recurrent_activation, use_bias,
                                            reset_after, num_layers, bidirectional, go_backwards, zero_output_for_mask);
          return cudnn_rnn::emulated_generic_backward(order, cfg, grad_y, grad_h_n, grad_c_n, x, weights, mask,
                                                      dropout_masks, recurrent_dropout_masks, reserve);
        },
        "rnn_backward through the generic CUDA kernels' element functions, run on the CPU (for tests)");
  m.def("cpu_unit_blocks", [](int64_t batch, int64_t units, int64_t gates) {
    return cudnn_rnn::cpu::UnitBlocks(batch, units, gates).start;
  }, "bounds of the unit blocks the CPU time loop gives its threads (for tests)");
  m.def("cpu_packed_gemm", &cudnn_rnn::cpu::packed_gemm_available,
        "whether this CPU runs the packed float32 GEMM kernel (AVX2 + FMA)");
  m.def("parallel_for_threads", [] {
    // How many distinct threads at::parallel_for runs 64 one-item tasks on (for tests: it is 1
    // when the extension was compiled without OpenMP, whatever torch's thread count).
    std::vector<int> seen(at::get_num_threads(), 0);
    at::parallel_for(0, 64, 1, [&](int64_t, int64_t) { seen[at::get_thread_num()] = 1; });
    return std::count(seen.begin(), seen.end(), 1);
  }, "distinct threads at::parallel_for uses (for tests)");
  m.def("cpu_cache_info", [] {
    return std::make_pair(cudnn_rnn::cpu::cached_bytes(), cudnn_rnn::cpu::cache_limit_bytes());
  }, "(bytes idle in the CPU buffer pool, its limit)");
  m.def("empty_cpu_cache", &cudnn_rnn::cpu::empty_cache, "frees the CPU buffer pool's idle buffers");
  m.def("apply_activation", &apply_activation, "(f(x), f'(x)) of a Keras activation by the CPU kernels (for tests)");
}
