#include "cpu/fma_peak.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace cudnn_rnn {
namespace cpu {
// GCC 12's AVX-512 headers build some intrinsics (_mm512_reduce_add_ps, ...) on
// _mm512_undefined_*(), which -Wuninitialized reports at every inlined use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace {

// 12 independent accumulator chains hide the FMA latency (4-5 cycles) on two pipes. Each
// function returns the sum so the work is not dropped; `n` iterations of 12 instructions.
__attribute__((target("avx512f"))) float fma_avx512(int64_t n) {
  __m512 acc[12];
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(float(i));
  for (int64_t k = 0; k < n; ++k) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) float fma_avx2(int64_t n) {
  __m256 acc[12];
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(float(i));
  for (int64_t k = 0; k < n; ++k) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  float v[8];
  _mm256_storeu_ps(v, s);
  return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}

__attribute__((target("avx512f,avx512bf16"))) float dpbf16_avx512(int64_t n) {
  __m512 acc[12];
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(float(i));
  for (int64_t k = 0; k < n; ++k) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

// GFLOP/s of float32 multiply-adds on the calling thread alone, in AVX-512 (`wide`) or AVX2
// registers: the best of 12 runs of about 50 us; 0 where the CPU lacks that build.
double core_fma_gflops(bool wide) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (wide ? !__builtin_cpu_supports("avx512f") : !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
    return 0.0;
  float (*loop)(int64_t) = wide ? fma_avx512 : fma_avx2;
  const double flops_per_iteration = wide ? 12 * 32 : 12 * 16;
  using Clock = std::chrono::steady_clock;
  const int64_t n = 1 << 15;  // 393k instructions: about 50 us at two a cycle
  volatile float sink = loop(n);  // wakes the vector units
  double best = 0;
  for (int r = 0; r < 12; ++r) {
    const auto t0 = Clock::now();
    sink = loop(n);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0) best = std::max(best, double(n) * flops_per_iteration / s / 1e9);
  }
  (void)sink;
  return best;
#else
  (void)wide;
  return 0.0;
#endif
}

}  // namespace

double fma_peak_gflops(const std::string& dtype, double seconds, int repeats) {
  TORCH_CHECK_VALUE(dtype == "float32" || dtype == "bfloat16", "dtype must be 'float32' or 'bfloat16'; got '",
                    dtype, "'");
  float (*loop)(int64_t) = nullptr;
  double flops_per_iteration = 0;  // 12 instructions
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (dtype == "bfloat16") {
    if (avx512 && __builtin_cpu_supports("avx512bf16")) loop = dpbf16_avx512, flops_per_iteration = 12 * 64;
  } else if (avx512) {
    loop = fma_avx512, flops_per_iteration = 12 * 32;
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    loop = fma_avx2, flops_per_iteration = 12 * 16;
  }
#endif
  if (loop == nullptr) return 0.0;
  const int64_t threads = std::max(1, at::get_num_threads());
  using Clock = std::chrono::steady_clock;
  // Calibrate on one thread, then run every thread together.
  int64_t n = 1 << 16;
  for (;;) {
    const auto t0 = Clock::now();
    volatile float sink = loop(n);
    (void)sink;
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0.02 || n > (int64_t(1) << 40)) {
      n = std::max<int64_t>(1, int64_t(double(n) * seconds / s));
      break;
    }
    n *= 4;
  }
  double best = 0;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const auto t0 = Clock::now();
    at::parallel_for(0, threads, 1, [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t) {
        volatile float sink = loop(n);
        (void)sink;
      }
    });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, double(threads) * double(n) * flops_per_iteration / s / 1e9);
  }
  return best;
}

bool full_width_avx512() {
  static const bool full = [] {
    const double wide = core_fma_gflops(true), narrow = core_fma_gflops(false);
    return wide > 0 && narrow > 0 && wide >= 1.5 * narrow;
  }();
  return full;
}

}  // namespace cpu
}  // namespace cudnn_rnn
