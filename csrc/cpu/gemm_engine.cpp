#include "cpu/gemm_engine.h"

#include <ATen/native/CPUBlas.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "cpu/packed_gemm.h"

namespace cudnn_rnn {
namespace cpu {

bool brgemm_available() {
#if defined(CPUBLAS_BRGEMM_F32F32F32)
  return true;
#else
  return false;
#endif
}

namespace {

// What the machine runs best when nothing is forced: kBlasFromSize means BLAS from K x N = 2^18 on.
enum class Default { Packed, Blas, BlasFromSize };

Default machine_default() {
  if (!packed_gemm_available()) return Default::Blas;
#if defined(__x86_64__) && defined(__GNUC__)
  // MKL's own kernels run on Intel at both of its levels (AVX-512, and AVX2 where ATen's level or
  // MKL_ENABLE_INSTRUCTIONS lowers it); elsewhere MKL runs generic AVX2 code.
  if (__builtin_cpu_is("intel")) return Default::BlasFromSize;
#endif
  return Default::Packed;
}

std::atomic<int>& override_slot() {
  static std::atomic<int> slot{-1};
  return slot;
}

std::atomic<int>& machine_slot() {  // tests: another machine's default
  static std::atomic<int> slot{-1};
  return slot;
}

Default machine() {
  static const Default measured = machine_default();
  const int forced = machine_slot().load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<Default>(forced) : measured;
}

Default parse_machine(const std::string& name) {
  TORCH_CHECK_VALUE(name == "packed" || name == "blas" || name == "blas_from_size",
                    "machine must be 'packed', 'blas' or 'blas_from_size'; got '", name, "'");
  TORCH_CHECK_VALUE(name == "blas" || packed_gemm_available(), "machine '", name, "' needs the packed kernel (AVX2 + FMA)");
  return name == "packed" ? Default::Packed : name == "blas" ? Default::Blas : Default::BlasFromSize;
}

GemmEngine parse_engine(const std::string& name) {
  TORCH_CHECK_VALUE(name == "packed" || name == "brgemm" || name == "blas",
                    "CUDNN_RNN_CPU_GEMM must be 'packed', 'brgemm' or 'blas'; got '", name, "'");
  TORCH_CHECK_VALUE(name != "packed" || packed_gemm_available(),
                    "CUDNN_RNN_CPU_GEMM=packed needs a CPU with AVX2 and FMA; this one has not");
  TORCH_CHECK_VALUE(name != "brgemm" || brgemm_available(),
                    "CUDNN_RNN_CPU_GEMM=brgemm needs a torch with at::native::cpublas::brgemm (2.6 or newer)");
  return name == "packed" ? GemmEngine::Packed : name == "brgemm" ? GemmEngine::Brgemm : GemmEngine::Blas;
}

// The engine forced by set_cpu_plan or CUDNN_RNN_CPU_GEMM, or -1.
int forced_engine() {
  const int forced = override_slot().load(std::memory_order_relaxed);
  if (forced >= 0) return forced;
  static const int from_environment = [] {
    const char* v = std::getenv("CUDNN_RNN_CPU_GEMM");
    return v && *v ? static_cast<int>(parse_engine(v)) : -1;
  }();
  return from_environment;
}

// rows < 0: not known.
GemmEngine rule(Default machine, int64_t k, int64_t n, int64_t rows) {
  switch (machine) {
    case Default::Packed: return GemmEngine::Packed;
    case Default::Blas: return GemmEngine::Blas;
    case Default::BlasFromSize:
      if (rows >= 0 && rows < kBlasMinRows) return GemmEngine::Packed;
      return k * n >= (int64_t(1) << 18) ? GemmEngine::Blas : GemmEngine::Packed;
  }
  return GemmEngine::Blas;
}

}  // namespace

GemmEngine float_gemm_engine(int64_t k, int64_t n, int64_t rows) {
  const int forced = forced_engine();
  if (forced >= 0) return static_cast<GemmEngine>(forced);
  return rule(machine(), k, n, rows);
}

GemmEngine float_recurrent_engine(int64_t k, int64_t n, int64_t batch, int64_t time) {
  // One step: the operand is packed for one product (MKL's packed GEMM packs it on every call), as
  // few rows as there can be for what packing it costs.
  return float_gemm_engine(k, n, time == 1 ? 0 : batch);
}

void override_machine_default(const std::string& name) {
  machine_slot().store(name.empty() ? -1 : static_cast<int>(parse_machine(name)));
}

void override_gemm_engine(const std::string& name) {
  override_slot().store(name.empty() ? -1 : static_cast<int>(parse_engine(name)));
}

const char* gemm_engine_name(GemmEngine engine) {
  switch (engine) {
    case GemmEngine::Packed: return "packed";
    case GemmEngine::Brgemm: return "brgemm";
    case GemmEngine::Blas: return "blas";
  }
  return "?";
}

}  // namespace cpu
}  // namespace cudnn_rnn
