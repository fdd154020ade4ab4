// The pybind11 module cudnn_rnn._C: build information and helpers that are not ops. Importing it
// also loads the library that registers the ops (csrc/ops.cpp and the per-backend files).
#include <torch/extension.h>

#include "build_info.h"
#include "rnn_config.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "cudnn_rnn native extension";
  m.def("build_info", &cudnn_rnn::accelerator_build_info,
        "What the extension was compiled with: {'cuda': version or 'no', 'cudnn': version or 'no', ...}");
  m.def("activation_names", &cudnn_rnn::activation_names,
        "Keras activation names the kernels implement, in the order of the C++ Activation enum");
}
