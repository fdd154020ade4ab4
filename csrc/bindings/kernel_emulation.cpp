// The generic CUDA backend's element functions (cuda/generic_kernels_body.h) run on the CPU, one
// "thread" at a time in a chosen order, under the same driver (core/rnn_driver.h). Built into every
// flavour of the extension so the tests hold the CUDA kernels to the CPU backend on machines
// without a GPU.
#include "bindings/kernel_emulation.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/generic_kernels_body.h"
#include "core/rnn_driver.h"

namespace cudnn_rnn {
namespace {

// 0: ascending, 1: descending, 2: shuffled (fixed seed); set_emulation_order.
thread_local int g_order = 0;

template <typename F>
void for_each_element(int64_t batch, int64_t units, F f) {
  std::vector<int64_t> ids(batch * units);
  std::iota(ids.begin(), ids.end(), 0);
  if (g_order == 1) std::reverse(ids.begin(), ids.end());
  if (g_order == 2) std::shuffle(ids.begin(), ids.end(), std::mt19937(123));
  for (int64_t idx : ids) f(idx / units, idx % units);
}

struct EmulatedCudaPolicy : driver::PolicyDefaults {
  template <typename T>
  static void forward_step(const ForwardStep<T>& p) {
    for_each_element(p.batch, p.units, [&](int64_t b, int64_t j) { cuda::forward_step_element<T>(p, b, j); });
  }
  template <typename T>
  static void gru_before_gates(const ForwardStep<T>& p) {
    for_each_element(p.batch, p.units, [&](int64_t b, int64_t j) { cuda::gru_before_gates_element<T>(p, b, j); });
  }
  template <typename T>
  static void backward_step(const BackwardStep<T>& p) {
    for_each_element(p.batch, p.units, [&](int64_t b, int64_t j) { cuda::backward_step_element<T>(p, b, j); });
  }
  template <typename T>
  static void gru_before_backward_b(const BackwardStep<T>& p) {
    for_each_element(p.batch, p.units,
                     [&](int64_t b, int64_t j) { cuda::gru_before_backward_b_element<T>(p, b, j); });
  }
};

}  // namespace

void set_emulation_order(int64_t order) {
  TORCH_CHECK_VALUE(order >= 0 && order <= 2, "order must be 0 (ascending), 1 (descending) or 2 (shuffled); got ",
                    order);
  g_order = static_cast<int>(order);
}

ForwardResult EmulatedCudaBackend::forward(const RnnConfig& cfg, const ForwardCall& call) {
  return driver::forward<EmulatedCudaPolicy>(cfg, call);
}

BackwardResult EmulatedCudaBackend::backward(const RnnConfig& cfg, const BackwardCall& call) {
  return driver::backward<EmulatedCudaPolicy>(cfg, call);
}

}  // namespace cudnn_rnn
