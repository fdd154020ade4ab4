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

// The calling thread's float32 multiply-add rate in AVX-512 registers over its rate in AVX2
// registers: runs of about 50 us each, the two widths taken in turn 16 times and the best of each
// kept; 0 where the CPU lacks either build. Taking them in turn gives both the same clock (an
// Intel core lowers it for AVX-512 work and raises it again about a millisecond after).
double wide_over_narrow_fma_rate() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    return 0.0;
  using Clock = std::chrono::steady_clock;
  const int64_t n = 1 << 15;  // 393k instructions: about 50 us at two a cycle
  float (*const loops[2])(int64_t) = {fma_avx2, fma_avx512};
  const double flops_per_iteration[2] = {12 * 16, 12 * 32};
  volatile float sink = fma_avx512(n);  // wakes the vector units
  double best[2] = {0, 0};
  for (int r = 0; r < 16; ++r) {
    for (int wide = 1; wide >= 0; --wide) {
      const auto t0 = Clock::now();
      sink = loops[wide](n);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (s > 0) best[wide] = std::max(best[wide], double(n) * flops_per_iteration[wide] / s / 1e9);
    }
  }
  (void)sink;
  return best[0] > 0 ? best[1] / best[0] : 0.0;
#else
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
    return wide_over_narrow_fma_rate() >= 1.3;
  }();
  return full;
}

}  // namespace cpu
}  // namespace cudnn_rnn
