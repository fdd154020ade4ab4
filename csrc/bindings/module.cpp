// The pybind11 module cudnn_rnn._C: build information and the helpers the package uses that are
// not ops; the test hooks live in its submodule _C._testing (testing.cpp). Importing it also
// loads the library that registers the ops (core/ops.cpp and the per-backend files).
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/extension.h>

#include <string>
#include <utility>
#include <vector>

#include "bindings/op_bindings.h"
#include "core/build_info.h"
#include "core/rnn_config.h"
#include "cpu/bf16_gemm.h"
#include "cpu/buffer_pool.h"
#include "cpu/fma_peak.h"
#include "cpu/int8_gemm.h"
#include "cpu/gemm_engine.h"
#include "cpu/packed_gemm.h"
#include "cpu/step_plan.h"
#include "cpu/time_loop.h"
#include "cpu/vec_loops.h"
#include "cpu/weight_cache.h"
#include "cudnn_host/backend_choice.h"

namespace cudnn_rnn {
namespace bindings {

void register_testing(pybind11::module_& m);  // testing.cpp
pybind11::object layer_call(pybind11::handle x, pybind11::dict params, pybind11::tuple names, pybind11::handle states,
                            pybind11::tuple spec, int64_t input_size, int64_t units, int64_t state_count,
                            bool return_sequences, bool return_state, bool stateful,
                            pybind11::handle kept);  // layer_call.cpp

namespace {

// Which CUDA backend a call would run on and why not cuDNN, from the op's own arguments (meta
// tensors will do: only shapes, dtypes and a mask's values are read), checked as the op checks
// them. cuDNN's version is the runtime's, as torch.backends.cudnn.version() reports it.
struct CudaChoiceProbe {
  static std::pair<bool, std::string> forward(const RnnConfig& cfg, const ForwardCall& call) {
    const auto& hooks = at::detail::getCUDAHooks();
    const int64_t version = hooks.hasCuDNN() ? hooks.versionCuDNN() : 0;
    c10::optional<at::Tensor> mask_cpu;
    if (call.in.mask.has_value()) mask_cpu = call.in.mask->to(at::kCPU);
    const BackendChoice c = choose_backend(cfg, mask_cpu, call.in.dropout_masks, call.in.recurrent_dropout_masks,
                                           call.in.x.scalar_type(), version);
    return {c.cudnn, c.reason};
  }
};

}  // namespace
}  // namespace bindings
}  // namespace cudnn_rnn

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace cr = cudnn_rnn;
  m.doc() = "cudnn_rnn native extension";
  m.def("layer_call", &cr::bindings::layer_call,
        "a recurrent layer's call without mask, dropout or stacked layers, in C++ (layer_call.cpp); "
        "None where the layer's Python path must run it");
  m.def("build_info", &cr::accelerator_build_info,
        "What the extension was compiled with: {'cuda': version or 'no', 'cudnn': version or 'no', ...}");
  m.def("cudnn_fallback_count", &cr::cudnn_fallback_count,
        "How many calls on CUDA tensors did not run on cuDNN since the process started");
  m.def("activation_names", &cr::activation_names,
        "Keras activation names the kernels implement, in the order of the C++ Activation enum");
  m.def("cell_gates", [] {
        std::vector<std::pair<std::string, int64_t>> out;
        for (size_t i = 0; i < cr::cell_names().size(); ++i)
          out.emplace_back(cr::cell_names()[i], cr::gates_of(static_cast<cr::CellKind>(i)));
        return out;
      }, "(cell name, gate blocks) for every cell the op has");
  m.def("standard_departures", [](const std::string& cell, const std::string& activation,
                                  const std::string& recurrent_activation, bool reset_after) {
        cr::RnnConfig cfg{};
        cfg.cell = cr::parse_cell(cell);
        cfg.activation = cr::parse_activation(activation, "activation");
        cfg.recurrent_activation = cr::parse_activation(recurrent_activation, "recurrent_activation");
        cfg.reset_after = reset_after;
        return cr::standard_departures(cfg);
      }, "(setting, what the standard cell has) for each way a cell departs from cuDNN's / torch.nn's");
  using Probe = cr::OpAdapter<cr::Validated<cr::bindings::CudaChoiceProbe>>;
  m.def("cuda_backend_choice", &cr::bindings::PyOp<&Probe::forward>::call,
        "(runs on cuDNN, why not) for rnn_forward's arguments, were they on a CUDA device");
  m.def("set_cudnn_algorithm", &cr::set_algorithm_preference,
        "'auto' (default), 'standard', 'persist_static' or 'persist_static_small_h'");
  m.def("cudnn_algorithm", &cr::algorithm_preference, "the cuDNN algorithm preference");
  m.def("choose_algorithm", [](const std::string& cell, int64_t units, at::ScalarType dtype, bool uniform_lengths,
                               int device_major) {
        cr::RnnConfig cfg{};
        cfg.cell = cr::parse_cell(cell);
        cfg.units = units;
        static const char* kNames[] = {"STANDARD", "PERSIST_STATIC", "PERSIST_DYNAMIC", "PERSIST_STATIC_SMALL_H"};
        return std::string(kNames[static_cast<int>(cr::choose_algorithm(cfg, dtype, uniform_lengths, device_major))]);
      }, "the cuDNN algorithm a call would use (before any refusal by cuDNN)");
  m.def("cpu_cache_info", [] { return std::make_pair(cr::cpu::cached_bytes(), cr::cpu::cache_limit_bytes()); },
        "(bytes idle in the CPU buffer pool, its limit)");
  m.def("cpu_gemm_engine", [](int64_t k, int64_t n, int64_t rows) {
        return std::string(cr::cpu::gemm_engine_name(cr::cpu::float_gemm_engine(k, n, rows)));
      }, pybind11::arg("k") = 4096, pybind11::arg("n") = 4096, pybind11::arg("rows") = -1,
      "the engine of the CPU backend's float32 GEMMs with a K x N operand B (and `rows` rows; -1: many): "
      "'packed', 'brgemm' or 'blas' (CUDNN_RNN_CPU_GEMM forces one)");
  m.def("cpu_packed_gemm_isa", [] {
        if (!cr::cpu::packed_gemm_available()) return std::string("none");
        return std::string(cr::cpu::packed_gemm_isa() == cr::cpu::PackedIsa::Avx512 ? "avx512" : "avx2");
      }, "the build of the packed float32 GEMM kernel the 'packed' engine runs: 'avx512', 'avx2' (the cell "
         "loops' instruction set) or 'none' (no AVX2 + FMA)");
  m.def("cpu_loops_isa", [] { return std::string(cr::cpu::float_loops().isa); },
        "the instruction set of the CPU backend's float32 activation and fused cell loops: 'avx512', 'avx2' or "
        "'baseline' (the widest the CPU and ATen's level allow; ATEN_CPU_CAPABILITY lowers it)");
  m.def("cpu_bf16_gemms", &cr::cpu::bf16_gemm_available,
        "whether bfloat16 calls on the CPU run their GEMMs in bfloat16 (AMX through oneDNN's micro-kernel, or "
        "AVX512_BF16), accumulating in float32; otherwise they compute in float32 "
        "(CUDNN_RNN_CPU_BF16=float32 forces that)");
  m.def("fma_peak", &cr::cpu::fma_peak_gflops, pybind11::arg("dtype") = "float32", pybind11::arg("seconds") = 0.1,
        pybind11::arg("repeats") = 5,
        "GFLOP/s of independent multiply-adds on all of torch's threads at once, in the widest vectors the CPU "
        "runs ('float32': FMA; 'bfloat16': AVX512_BF16 dot products, 0 without): the benchmarks' peak");
  m.def("set_cpu_plan", [](const std::string& gemm, const std::string& split) {
        if (!gemm.empty()) cr::cpu::override_gemm_engine(gemm == "auto" ? std::string() : gemm);
        if (!split.empty()) cr::cpu::override_split(split == "auto" ? std::string() : split);
      }, pybind11::arg("gemm") = "", pybind11::arg("split") = "",
      "force the CPU time loops' float32 GEMM engine ('packed', 'brgemm', 'blas', 'auto') and thread split "
      "('units', 'rows', 'auto'); '' leaves one as it is");
  m.def("cpu_split", [](int64_t batch, int64_t units, int64_t gates) {
        return std::string(cr::cpu::split_name(cr::cpu::choose_split(batch, units, gates, at::get_num_threads(), true)));
      }, "how the CPU time loop splits a direction of this shape across torch's threads where its plan runs rows "
         "apart: 'units' or 'rows'");
  m.def("cpu_forward_plan", [](const std::string& cell, int64_t units, const std::string& precision, int64_t batch,
                               int64_t time) {
        cr::RnnConfig cfg{};
        cfg.cell = cr::parse_cell(cell);
        cfg.units = units;
        cfg.batch = batch;
        cfg.time = time;
        TORCH_CHECK_VALUE(precision == "float32" || precision == "bfloat16" || precision == "int8" ||
                              precision == "float64",
                          "precision must be 'float32', 'bfloat16', 'int8' or 'float64'; got '", precision, "'");
        cfg.gemm_dtype = precision == "bfloat16" ? at::kBFloat16 : precision == "int8" ? at::kQInt8 : at::kFloat;
        namespace cpu = cr::cpu;
        if (precision == "float64") {
          return std::make_pair(std::string(cpu::plan_kind_name(cpu::forward_plan_kind<double>(cfg))),
                                cpu::plan_rows_apart<double>(cfg, false));
        }
        return std::make_pair(std::string(cpu::plan_kind_name(cpu::forward_plan_kind<float>(cfg))),
                              cpu::plan_rows_apart<float>(cfg, false));
      }, pybind11::arg("cell"), pybind11::arg("units"), pybind11::arg("precision"), pybind11::arg("batch") = 64,
      pybind11::arg("time") = 50,
      "(the forward plan the CPU time loop runs for a direction of this cell, units and precision, for a call of "
      "`batch` rows and `time` steps: 'int8', "
         "'bfloat16', 'packed', 'brgemm' or 'blas'; whether it runs rows apart), as csrc/cpu/plan_choice.cpp "
         "decides it");
  m.def("cpu_int8_gemms", &cr::cpu::int8_gemm_available,
        "whether layers quantized by cudnn_rnn.quantize_dynamic multiply in int8 on this CPU (AVX2 or "
        "AVX512_VNNI); otherwise they compute in float32");
  m.def("cpu_int8_gemm_isa", [] {
        if (!cr::cpu::int8_gemm_available()) return std::string("none");
        const auto isa = cr::cpu::int8_gemm_isa();
        return std::string(isa == cr::cpu::Int8Isa::Avx512Vnni ? "avx512_vnni"
                           : isa == cr::cpu::Int8Isa::AvxVnni  ? "avx_vnni"
                                                               : "avx2");
      }, "which build multiplies the int8 products: 'avx512_vnni', 'avx_vnni', 'avx2' or 'none'");
  m.def("cpu_bf16_gemm_kernel", &cr::cpu::bf16_gemm_kernel,
        "what multiplies bfloat16 calls' GEMMs on the CPU: 'onednn' (oneDNN's micro-kernel, AMX), 'avx512_bf16' "
        "(the extension's AVX512_BF16 kernel) or 'none' (float32)");
  m.def("empty_cpu_cache", [] {
        cr::cpu::empty_cache();
        cr::cpu::clear_weight_cache();
      }, "frees the CPU buffer pool's idle buffers and the packed weights the CPU kernels keep across calls");
  m.def("empty_cuda_cache", &cr::empty_accelerator_caches,
        "drops the packed cuDNN weight spaces inference keeps across calls (nothing in a CPU-only build)");
  auto testing = m.def_submodule("_testing", "hooks into the C++ internals, for the tests");
  cr::bindings::register_testing(testing);
}
