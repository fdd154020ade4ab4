// cudnn_rnn._C._testing: hooks into the C++ internals for the tests (the CPU kernels' activation
// arrays and thread split, the cuDNN weight-space plan, the backend choice, the generic CUDA
// kernels emulated on the CPU). Nothing in the package calls them.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bindings/kernel_emulation.h"
#include "bindings/op_bindings.h"
#include "core/rnn_config.h"
#include "cpu/activation_arrays.h"
#include "cpu/gemm_engine.h"
#include "cpu/conv_weight_grad.h"
#include "cpu/int8_gemm.h"
#include "cpu/packed_gemm.h"
#include "cpu/time_loop.h"
#include "cpu/vec_loops.h"
#include "cpu/weight_cache.h"
#include "cudnn_host/backend_choice.h"
#include "cudnn_host/keras_layout.h"

namespace cudnn_rnn {
namespace bindings {
namespace {

// f(x) and f'(x) through the CPU backend's array kernels: lets the tests hold every activation
// (vectorised or scalar) to Keras's own definition.
std::pair<at::Tensor, at::Tensor> apply_activation(const std::string& name, const at::Tensor& x) {
  const auto a = parse_activation(name, "name");
  TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor; got ", x.device());
  at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc);
  at::Tensor g = at::empty_like(xc);
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "apply_activation", [&] {
    cpu::activate_array(a, xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), xc.numel());
    cpu::activate_grad_array(a, xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(), xc.numel());
  });
  return {y, g};
}

// The cuDNN weight-space plan on the CPU: offsets is an [n, 2] int64 tensor of (matrix, bias)
// element offsets, one row per (pseudo-layer, linLayerID).
RnnConfig layout_config(const std::string& cell, bool reset_after, bool use_bias, int64_t num_layers,
                        bool bidirectional, int64_t input_size, int64_t units) {
  RnnConfig cfg{};
  cfg.cell = parse_cell(cell);
  cfg.use_bias = use_bias;
  cfg.reset_after = cfg.cell == CellKind::GRU && reset_after;
  cfg.num_layers = num_layers;
  cfg.num_directions = bidirectional ? 2 : 1;
  cfg.input_size = input_size;
  cfg.units = units;
  return cfg;
}

WeightOffsetTable offset_table(const at::Tensor& offsets) {
  TORCH_CHECK(offsets.dim() == 2 && offsets.size(1) == 2 && offsets.scalar_type() == at::kLong,
              "offsets must be an int64 tensor of shape (n, 2)");
  WeightOffsetTable table;
  auto acc = offsets.accessor<int64_t, 2>();
  for (int64_t i = 0; i < offsets.size(0); ++i) table.push_back({acc[i][0], acc[i][1]});
  return table;
}

// A[rows] · B (+ C[rows] with C, + bias without) through the packed GEMM of the running build
// (cpu/packed_gemm.h), B packed here; C's other rows as they were. A [R, K], B [K, N] (with
// trans_b: [N, K]), C [R, N], all float32; rows: int64 row indices (every row without).
at::Tensor packed_product(const at::Tensor& A, const at::Tensor& B, bool trans_b, const c10::optional<at::Tensor>& bias,
                          const c10::optional<at::Tensor>& C, const c10::optional<at::Tensor>& rows) {
  TORCH_CHECK(cpu::packed_gemm_available(), "this CPU has no packed GEMM");
  const at::Tensor a = A.contiguous(), b = B.contiguous();
  TORCH_CHECK(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && a.dim() == 2 && b.dim() == 2,
              "A and B must be 2-D float32");
  const int64_t K = a.size(1), N = trans_b ? b.size(0) : b.size(1);
  TORCH_CHECK((trans_b ? b.size(1) : b.size(0)) == K, "B does not match A's depth");
  at::Tensor panels = at::empty({cpu::packed_size(K, N)}, a.options());
  cpu::pack_panels(b.data_ptr<float>(), b.size(1), trans_b, K, N, panels.data_ptr<float>());
  at::Tensor out = C ? C->contiguous().clone() : at::zeros({a.size(0), N}, a.options());
  TORCH_CHECK(out.size(0) == a.size(0) && out.size(1) == N, "C must be [rows of A, N]");
  const at::Tensor r = rows ? rows->contiguous() : at::Tensor();
  const at::Tensor bv = bias ? bias->contiguous() : at::Tensor();
  TORCH_CHECK(!bv.defined() || bv.numel() == N, "bias must have N values");
  const int64_t M = r.defined() ? r.numel() : a.size(0);
  const int64_t* rp = r.defined() ? r.data_ptr<int64_t>() : nullptr;
  cpu::packed_gemm(M, N, K, a.data_ptr<float>(), {rp, K}, panels.data_ptr<float>(),
                   bv.defined() ? bv.data_ptr<float>() : nullptr, C.has_value(), out.data_ptr<float>(), {rp, N});
  return out;
}

// The fused float32 cell rows of the running instruction set (cpu/vec_loops.h) over every row
// of [R, G * n] pre-activations xw and rec (gate-blocked), with c_prev / h_prev [R, n]: LSTM
// returns (h, c, saved), GRU (h, saved). Units [n0, n0 + width) of each row in one call: a unit's
// result must not depend on where in the call it falls.
std::vector<at::Tensor> cell_rows(const std::string& cell, bool act_tanh, bool ract_tanh, const at::Tensor& xw,
                                  const at::Tensor& rec, const at::Tensor& prev, int64_t width) {
  const bool lstm = cell == "lstm";
  TORCH_CHECK(lstm || cell == "gru", "cell must be 'lstm' or 'gru'");
  const at::Tensor x = xw.contiguous(), r = rec.contiguous(), p = prev.contiguous();
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && r.sizes() == x.sizes() && p.dim() == 2 &&
                  p.size(0) == x.size(0) && x.size(1) == (lstm ? 4 : 3) * p.size(1) && width > 0,
              "xw, rec: [R, G * n] float32; prev: [R, n]; width > 0");
  const int64_t R = x.size(0), n = p.size(1), G = lstm ? 4 : 3;
  at::Tensor h = at::empty({R, n}, x.options()), c = at::empty({R, n}, x.options());
  at::Tensor saved = at::empty({R, 4 * n}, x.options());
  const auto& loops = cpu::float_loops();
  for (int64_t i = 0; i < R; ++i) {
    for (int64_t n0 = 0; n0 < n; n0 += width) {
      const int64_t w = std::min(width, n - n0);
      const float* xi = x.data_ptr<float>() + i * G * n + n0;
      const float* ri = r.data_ptr<float>() + i * G * n + n0;
      float* si = saved.data_ptr<float>() + i * 4 * n + n0;
      if (lstm) {
        loops.lstm_forward_row(act_tanh, ract_tanh, w, xi, n, ri, n, p.data_ptr<float>() + i * n + n0, si, n,
                               h.data_ptr<float>() + i * n + n0, c.data_ptr<float>() + i * n + n0);
      } else {
        loops.gru_forward_row(act_tanh, ract_tanh, w, xi, n, ri, n, p.data_ptr<float>() + i * n + n0, si, n,
                              h.data_ptr<float>() + i * n + n0);
      }
    }
  }
  return lstm ? std::vector<at::Tensor>{h, c, saved} : std::vector<at::Tensor>{h, saved};
}

}  // namespace

void register_testing(pybind11::module_& m) {
  m.def("apply_activation", &apply_activation, "(f(x), f'(x)) of a Keras activation by the CPU kernels");
  m.def("cell_rows", &cell_rows, py::arg("cell"), py::arg("act_tanh"), py::arg("ract_tanh"), py::arg("xw"),
        py::arg("rec"), py::arg("prev"), py::arg("width"),
        "the fused float32 LSTM / GRU cell rows of the running instruction set, `width` units a call");
  m.def("cudnn_lin_layer", [](const std::string& cell, int64_t id) {
        auto lin = cudnn_lin_layer(parse_cell(cell), id);
        return std::make_pair(lin.keras_gate, lin.recurrent);
      }, "(Keras gate block, is recurrent) of a cuDNN linLayerID");
  m.def("pack_keras_weights", [](const std::string& cell, bool reset_after, bool use_bias, int64_t num_layers,
                                 bool bidirectional, int64_t input_size, int64_t units,
                                 const std::vector<at::Tensor>& weights, const at::Tensor& offsets, int64_t space_size) {
        auto cfg = layout_config(cell, reset_after, use_bias, num_layers, bidirectional, input_size, units);
        at::Tensor space = at::full({space_size}, std::nan(""), weights[0].options());
        pack_keras_weights(cfg, weights, offset_table(offsets), space);
        return space;
      }, "cuDNN weight-space packing on any device");
  m.def("unpack_keras_gradients", [](const std::string& cell, bool reset_after, bool use_bias, int64_t num_layers,
                                     bool bidirectional, int64_t input_size, int64_t units,
                                     const std::vector<at::Tensor>& weights, const at::Tensor& offsets,
                                     const at::Tensor& grad_space) {
        auto cfg = layout_config(cell, reset_after, use_bias, num_layers, bidirectional, input_size, units);
        return unpack_keras_gradients(cfg, weights, offset_table(offsets), grad_space);
      }, "the inverse of pack_keras_weights for gradients");
  m.def("choose_backend", [](const std::string& cell, const std::string& activation,
                             const std::string& recurrent_activation, bool reset_after, int64_t num_layers,
                             bool bidirectional, bool go_backwards, int64_t batch, int64_t time,
                             const c10::optional<at::Tensor>& mask, int64_t dropout_gates, bool recurrent_dropout,
                             at::ScalarType dtype, int64_t cudnn_version) {
        RnnConfig cfg{};
        cfg.cell = parse_cell(cell);
        cfg.activation = parse_activation(activation, "activation");
        cfg.recurrent_activation = parse_activation(recurrent_activation, "recurrent_activation");
        cfg.reset_after = reset_after;
        cfg.num_layers = num_layers;
        cfg.num_directions = bidirectional ? 2 : 1;
        cfg.go_backwards = go_backwards;
        cfg.batch = batch;
        cfg.time = time;
        std::vector<at::Tensor> dm, rdm;
        if (dropout_gates > 0) dm.push_back(at::ones({dropout_gates, batch, 1}));
        if (recurrent_dropout) rdm.push_back(at::ones({1, batch, 1}));
        auto c = choose_backend(cfg, mask, dm, rdm, dtype, cudnn_version);
        return std::make_tuple(c.cudnn, c.reason, c.lengths);
      }, "the CUDA backend choice for a configuration, at a given cuDNN version");
  using Emulated = OpAdapter<Validated<EmulatedCudaBackend>>;
  m.def("set_emulation_order", &set_emulation_order,
        "element order of the emulated CUDA kernels: 0 ascending, 1 descending, 2 shuffled");
  m.def("emulated_generic_forward", &PyOp<&Emulated::forward>::call,
        "rnn_forward (same arguments) through the generic CUDA kernels' element functions, run on the CPU");
  m.def("emulated_generic_backward", &PyOp<&Emulated::backward>::call,
        "rnn_backward (same arguments) through the generic CUDA kernels' element functions, run on the CPU");
  m.def("override_cpu_split", &cpu::override_split,
        "run the CPU time loops split by 'units' or 'rows' from now on ('' for the choice again)");
  m.def("cpu_split", [](int64_t batch, int64_t units, int64_t gates, int64_t threads) {
        return std::string(cpu::split_name(cpu::choose_split(batch, units, gates, threads, true)));
      }, "the split the CPU time loop would choose for a shape (where its plan can run rows apart)");
  m.def("cpu_split_min_rows", &cpu::rows_to_cover_kernel,
        "the rows a thread needs for the row split where the recurrent kernel outgrows L2");
  m.def("cpu_unit_blocks", [](int64_t batch, int64_t units, int64_t gates) {
    return cpu::UnitBlocks(batch, units, gates).start;
  }, "bounds of the unit blocks the CPU time loop gives its threads");
  m.def("cpu_packed_gemm", &cpu::packed_gemm_available,
        "whether this CPU can run the packed float32 GEMM kernel (AVX2 + FMA)");
  m.def("packed_gemm", &packed_product, py::arg("A"), py::arg("B"), py::arg("trans_b") = false,
        py::arg("bias") = py::none(), py::arg("C") = py::none(), py::arg("rows") = py::none(),
        "A[rows] · B (+ C[rows] with C, else + bias) through the packed GEMM, B packed here");
  m.def("packed_weight_grad", [](const std::vector<std::pair<at::Tensor, std::optional<at::Tensor>>>& parts,
                                  const at::Tensor& D, bool ones) {
    std::vector<std::pair<at::Tensor, at::Tensor>> p;
    for (const auto& [A, rows] : parts) p.emplace_back(A, rows.value_or(at::Tensor()));
    return cpu::packed_weight_grad(p, D, ones);
  }, py::arg("parts"), py::arg("D"), py::arg("ones") = false,
        "[A_1 | A_2 ... (| 1)]^T D (float32; parts: (A, rows or None) pairs, A's rows `rows` or all of them) as the "
        "CPU backward's weight gradients run it on the packed kernel; None where BLAS or another engine serves the "
        "shape or the kernel does not run");
  m.def("conv_weight_grad", [](const at::Tensor& input, const at::Tensor& grad, std::vector<int64_t> kernel_size,
                                std::vector<int64_t> stride, std::vector<int64_t> pad_before,
                                std::vector<int64_t> pad_after, std::vector<int64_t> dilation,
                                bool want_bias) -> py::object {
    auto [gw, gb] = cpu::conv_weight_grad(input, grad, kernel_size, stride, pad_before, pad_after, dilation, want_bias);
    if (!gw.defined()) return py::none();
    return py::make_tuple(gw, gb.defined() ? py::cast(gb) : py::object(py::none()));
  }, py::arg("input"), py::arg("grad"), py::arg("kernel_size"), py::arg("stride"), py::arg("pad_before"),
        py::arg("pad_after"), py::arg("dilation"), py::arg("want_bias") = false,
        "a channels-last convolution's weight (and bias) gradient as ConvLSTM's CPU backward runs it "
        "(input [N, *S, C], grad [N, *S', O]): (grad_weight [O, C, *K], grad_bias or None), or None where "
        "ATen's serves the tensors");
  m.def("weight_cache_packs", &cpu::weight_cache_packs,
        "how many packed weight forms the CPU plans have made since the process started (a cache hit makes none)");
  m.def("weight_cache_entries", &cpu::weight_cache_entries, "packed weight forms held by the CPU weight cache");
  m.def("cpu_brgemm", &cpu::brgemm_available, "whether this torch has cpublas::brgemm for float32");
  m.def("override_machine_default", &cpu::override_machine_default,
        "choose the float32 GEMM engines from now on as a machine whose default is 'packed', 'blas' or "
        "'blas_from_size' (Intel) would; '' for this machine's default");
  m.def("override_cpu_gemm_engine", &cpu::override_gemm_engine,
        "run the CPU GEMMs on 'packed', 'brgemm' or 'blas' from now on ('' for the chosen engine)");
  m.def("cpu_packed_gemm_avx512", &cpu::packed_gemm_avx512_available,
        "whether this CPU can run the packed GEMM's AVX-512 build (AVX-512 F/BW/DQ/VL)");
  m.def("override_int8_gemm_isa", &cpu::override_int8_gemm_isa,
        "run the int8 GEMM's 'avx2', 'avx_vnni' or 'avx512_vnni' build from now on ('' for the machine's choice)");
  m.def("cpu_int8_gemm_avx512", &cpu::int8_gemm_avx512_available,
        "whether this CPU can run the int8 GEMM's AVX512_VNNI build");
  m.def("cpu_int8_gemm_avx_vnni", &cpu::int8_gemm_avx_vnni_available,
        "whether this CPU can run the int8 GEMM's AVX_VNNI build");
  m.def("override_packed_gemm_isa", &cpu::override_packed_gemm_isa,
        "run the packed GEMM's 'avx2' or 'avx512' build from now on ('' for the machine's choice)");
  m.def("force_serial_steps", &cpu::StepScheduler::force_serial,
        "run every time-loop step's unit blocks on the calling thread (True) or as the scheduler decides");
  m.def("step_scheduler_trace", [](int64_t steps, int64_t blocks, int64_t lag_us) {
    // Runs `steps` steps of `blocks` blocks through a StepScheduler; a block run by a thread other
    // than the caller sleeps lag_us first (a thread whose core is busy elsewhere). Returns how
    // many times each (step, block) ran and how many serial stretches the scheduler took.
    at::Tensor counts = at::zeros({steps, blocks}, at::kLong);
    auto* c = counts.data_ptr<int64_t>();
    const auto caller = std::this_thread::get_id();
    cpu::StepScheduler scheduler(blocks);
    for (int64_t s = 0; s < steps; ++s) {
      scheduler.run([&](int64_t k0, int64_t k1) {
        if (lag_us > 0 && std::this_thread::get_id() != caller) {
          std::this_thread::sleep_for(std::chrono::microseconds(lag_us));
        }
        for (int64_t k = k0; k < k1; ++k) ++c[s * blocks + k];
      });
    }
    return std::make_tuple(counts, scheduler.serial_stretches());
  }, "the time loop's step scheduler on an empty body, one thread made to lag");
  m.def("parallel_for_threads", [] {
    // How many distinct threads at::parallel_for runs 64 one-item tasks on (1 when the extension
    // was compiled without OpenMP, whatever torch's thread count).
    std::vector<int> seen(at::get_num_threads(), 0);
    at::parallel_for(0, 64, 1, [&](int64_t, int64_t) { seen[at::get_thread_num()] = 1; });
    return std::count(seen.begin(), seen.end(), 1);
  }, "distinct threads at::parallel_for uses");
}

}  // namespace bindings
}  // namespace cudnn_rnn
