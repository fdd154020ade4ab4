#include "cpu/gemm_engine.h"

#include <ATen/native/CPUBlas.h>
#include <ATen/Version.h>
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
  // ATen's level (ATEN_CPU_CAPABILITY lowers it) stands for what the libraries may use.
  const std::string level = at::get_cpu_capability();  // "DEFAULT", "AVX2", "AVX512", ...
  const bool avx512 = level.rfind("AVX512", 0) == 0;
  if (__builtin_cpu_is("intel") && avx512) return Default::BlasFromSize;
#endif
  return Default::Packed;
}

std::atomic<int>& override_slot() {
  static std::atomic<int> slot{-1};
  return slot;
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

}  // namespace

GemmEngine float_gemm_engine(int64_t k, int64_t n) {
  const int forced = override_slot().load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<GemmEngine>(forced);
  static const int from_environment = [] {
    const char* v = std::getenv("CUDNN_RNN_CPU_GEMM");
    return v && *v ? static_cast<int>(parse_engine(v)) : -1;
  }();
  if (from_environment >= 0) return static_cast<GemmEngine>(from_environment);
  static const Default machine = machine_default();
  switch (machine) {
    case Default::Packed: return GemmEngine::Packed;
    case Default::Blas: return GemmEngine::Blas;
    case Default::BlasFromSize: return k * n >= (int64_t(1) << 18) ? GemmEngine::Blas : GemmEngine::Packed;
  }
  return GemmEngine::Blas;
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
