// The generic CUDA backend's element functions (cuda/generic_kernels_body.h) run on the CPU, one
// "thread" at a time in a chosen order, under the same driver (rnn_driver.h). Built into every
// flavour of the extension so the tests hold the CUDA kernels to the CPU backend on machines
// without a GPU.
#include "kernel_emulation.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/generic_kernels_body.h"
#include "rnn_driver.h"

namespace cudnn_rnn {
namespace {

// 0: ascending, 1: descending, 2: shuffled (fixed seed). Set per call, single-threaded use.
thread_local int g_order = 0;

template <typename F>
void for_each_element(int64_t batch, int64_t units, F f) {
  std::vector<int64_t> ids(batch * units);
  std::iota(ids.begin(), ids.end(), 0);
  if (g_order == 1) std::reverse(ids.begin(), ids.end());
  if (g_order == 2) std::shuffle(ids.begin(), ids.end(), std::mt19937(123));
  for (int64_t idx : ids) f(idx / units, idx % units);
}

struct EmulatedCudaPolicy : driver::GenericTimeLoops {
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

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> emulated_generic_forward(
    int64_t order, const RnnConfig& cfg, const at::Tensor& x, at::TensorList weights,
    const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& h0, const c10::optional<at::Tensor>& c0,
    at::TensorList dropout_masks, at::TensorList recurrent_dropout_masks) {
  g_order = static_cast<int>(order);
  return driver::forward<EmulatedCudaPolicy>(cfg, x, weights, mask, h0, c0, dropout_masks, recurrent_dropout_masks);
}

std::tuple<at::Tensor, std::vector<at::Tensor>, at::Tensor, at::Tensor> emulated_generic_backward(
    int64_t order, const RnnConfig& cfg, const at::Tensor& grad_y, const at::Tensor& grad_h_n,
    const at::Tensor& grad_c_n, const at::Tensor& x, at::TensorList weights, const c10::optional<at::Tensor>& mask,
    at::TensorList dropout_masks, at::TensorList recurrent_dropout_masks, const at::Tensor& reserve) {
  g_order = static_cast<int>(order);
  return driver::backward<EmulatedCudaPolicy>(cfg, grad_y, grad_h_n, grad_c_n, x, weights, mask, dropout_masks,
                                              recurrent_dropout_masks, reserve);
}

}  // namespace cudnn_rnn
