// The recurrent layers' everyday call from Python in one step: the arguments checked, the op
// called through the dispatcher and the outputs shaped as the layer returns them, all in C++.
// Streaming (one step at a time, states passed in) spends most of its time outside the GEMMs:
// each tensor method called from Python costs about a microsecond, and the op's Python entry
// converts sixteen arguments per call. The layer takes this path for calls without a mask,
// dropout or stacked layers (stateful layers included), on exact torch.Tensor inputs, when
// nothing traces or overrides tensor functions (cudnn_rnn/layers.py); anything it does not take
// returns None, and the layer's Python path then runs the call, errors included.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <string>
#include <vector>

#include "core/rnn_call.h"

namespace cudnn_rnn {
namespace bindings {

namespace py = pybind11;

namespace {

// The tensor an object holds, where it is exactly a torch.Tensor or nn.Parameter (not a subclass
// with a __torch_function__ of its own); null for anything else, null included.
const at::Tensor* exact_tensor(PyObject* o) {
  return o != nullptr && THPVariable_CheckExact(o) ? &THPVariable_Unpack(o) : nullptr;
}

bool same_kind(const at::Tensor& t, const at::Tensor& ref) {
  return t.scalar_type() == ref.scalar_type() && t.device() == ref.device();
}

// A spec entry of the expected Python type (a layer attribute changed to anything else leaves the
// call to the Python path, whose checks name it).
bool is_str(py::handle o) { return PyUnicode_Check(o.ptr()); }
bool is_bool(py::handle o) { return PyBool_Check(o.ptr()); }
bool is_int(py::handle o) { return PyLong_CheckExact(o.ptr()); }

// A state the call may take: exactly a tensor like x, [B, units], or with `op_shaped` (a stateful
// layer's kept state) the op's [1, B, units]; returned in the op's shape, or nullopt.
c10::optional<at::Tensor> state_of(PyObject* o, const at::Tensor& x, int64_t units, bool op_shaped) {
  const at::Tensor* s = exact_tensor(o);
  const int64_t lead = op_shaped ? 1 : 0;
  if (s == nullptr || s->dim() != 2 + lead || (op_shaped && s->size(0) != 1) || s->size(lead) != x.size(0) ||
      s->size(lead + 1) != units || !same_kind(*s, x)) {
    return c10::nullopt;
  }
  return op_shaped ? *s : s->unsqueeze(0);
}

py::object wrap(at::Tensor t) {
  PyObject* o = THPVariable_Wrap(std::move(t));
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

}  // namespace

// x; the layer's parameter dict and its weights' names in op order; initial_state as the layer
// takes it (None, a tensor for one state, a list or tuple); spec: RnnSpec.args(); then the
// layer's sizes and what it returns; whether it is stateful, and the states it keeps (None or its
// list of [1, B, units] tensors, read where initial_state is None). Returns the layer's output (a
// tensor, or the list with the final states; for a stateful layer the pair (output, the states
// to keep)), or None.
py::object layer_call(py::handle x_obj, py::dict params, py::tuple names, py::handle states_obj, py::tuple spec,
                      int64_t input_size, int64_t units, int64_t state_count, bool return_sequences,
                      bool return_state, bool stateful, py::handle kept_obj) {
  const at::Tensor* xp = exact_tensor(x_obj.ptr());
  if (xp == nullptr || spec.size() != 9 || !is_str(spec[0]) || !is_str(spec[1]) || !is_str(spec[2]) ||
      !is_bool(spec[3]) || !is_bool(spec[4]) || !is_int(spec[5]) || !is_bool(spec[6]) || !is_bool(spec[7]) ||
      !is_bool(spec[8])) {
    return py::none();
  }
  const at::Tensor x = *xp;
  std::vector<at::Tensor> weights;
  weights.reserve(names.size());
  for (py::handle name : names) {
    // (borrowed, under the GIL; a parametrized weight is not in the dict)
    const at::Tensor* w = exact_tensor(PyDict_GetItem(params.ptr(), name.ptr()));
    if (w == nullptr) return py::none();
    weights.push_back(*w);
  }
  if (weights.empty() || x.dim() != 3 || x.size(2) != input_size || x.size(1) < 1 || !same_kind(x, weights[0])) {
    return py::none();
  }
  const int64_t num_layers = spec[5].cast<int64_t>();
  const bool bidirectional = spec[6].cast<bool>();
  if (num_layers != 1 || bidirectional || state_count < 1 || state_count > 2) return py::none();

  // One state tensor per state of the cell, each [B, units] like x (the op's [1, B, units] views
  // are passed), or a stateful layer's kept states where none are given (_RNNBase._states, a list
  // of [1, B, units]): the items of an exact list or tuple, which it owns while the call holds it.
  const bool kept = states_obj.is_none() && stateful && !kept_obj.is_none();
  c10::optional<at::Tensor> states[2];
  if (kept || !states_obj.is_none()) {
    PyObject* given[2] = {nullptr, nullptr};
    PyObject* o = kept ? kept_obj.ptr() : states_obj.ptr();
    int64_t n = 0;
    if (!kept && exact_tensor(o) != nullptr) {
      given[n++] = o;
    } else if (PyList_CheckExact(o) && PyList_GET_SIZE(o) == state_count) {
      for (; n < state_count; ++n) given[n] = PyList_GET_ITEM(o, n);
    } else if (!kept && PyTuple_CheckExact(o) && PyTuple_GET_SIZE(o) == state_count) {
      for (; n < state_count; ++n) given[n] = PyTuple_GET_ITEM(o, n);
    }
    if (n != state_count) return py::none();
    for (int64_t i = 0; i < n; ++i) {
      states[i] = state_of(given[i], x, units, kept);
      if (!states[i].has_value()) return py::none();
    }
  }

  bool need_grad = false;
  if (at::GradMode::is_enabled()) {
    need_grad = x.requires_grad();
    for (const at::Tensor& w : weights) need_grad = need_grad || w.requires_grad();
    for (const auto& s : states) need_grad = need_grad || (s.has_value() && s->requires_grad());
  }
  const std::string cell = spec[0].cast<std::string>(), activation = spec[1].cast<std::string>(),
                    recurrent_activation = spec[2].cast<std::string>();
  const RnnOptions options{cell, activation, recurrent_activation, spec[3].cast<bool>(), spec[4].cast<bool>(),
                           num_layers, bidirectional, spec[7].cast<bool>(), spec[8].cast<bool>()};
  const ForwardCall call{{x, std::move(weights), c10::nullopt, {}, {}}, states[0], states[1], options, need_grad};
  ForwardResult result;
  {
    py::gil_scoped_release no_gil;  // as torch's own Python entries release it while an op runs
    result = redispatch_forward(call);
  }
  const at::Tensor& y = std::get<0>(result);
  at::Tensor output = return_sequences ? y : y.select(1, -1);
  py::object out;
  if (!return_state) {
    out = wrap(std::move(output));
  } else {
    py::list all;
    all.append(wrap(std::move(output)));
    all.append(wrap(std::get<1>(result).select(0, -1)));
    if (state_count == 2) all.append(wrap(std::get<2>(result).select(0, -1)));
    out = std::move(all);
  }
  if (!stateful) return out;
  // (the output, the states to keep: the final ones, detached)
  py::list keep;
  keep.append(wrap(std::get<1>(result).detach()));
  if (state_count == 2) keep.append(wrap(std::get<2>(result).detach()));
  return py::make_tuple(out, keep);
}

}  // namespace bindings
}  // namespace cudnn_rnn
