// The pybind11 module cudnn_rnn._C: build information and helpers that are not ops. Importing it
// also loads the library that registers the ops (csrc/ops.cpp and the per-backend files).
#include <torch/extension.h>

#include "build_info.h"
#include "cpu/activation_arrays.h"
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

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "cudnn_rnn native extension";
  m.def("build_info", &cudnn_rnn::accelerator_build_info,
        "What the extension was compiled with: {'cuda': version or 'no', 'cudnn': version or 'no', ...}");
  m.def("activation_names", &cudnn_rnn::activation_names,
        "Keras activation names the kernels implement, in the order of the C++ Activation enum");
  m.def("apply_activation", &apply_activation, "(f(x), f'(x)) of a Keras activation by the CPU kernels (for tests)");
}
