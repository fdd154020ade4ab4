// Python entry points with the op's own argument list: PyOp<F>::call takes what F (an
// OpAdapter kernel, core/rnn_call.h) takes, with lists as std::vector and strings as
// std::string (what pybind11 converts), so a binding never restates the op's arguments.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <string>
#include <type_traits>
#include <vector>

namespace cudnn_rnn {
namespace bindings {

template <class T>
struct PyArg {
  using type = T;
};
template <>
struct PyArg<at::TensorList> {
  using type = std::vector<at::Tensor>;
};
template <>
struct PyArg<c10::string_view> {
  using type = std::string;
};

template <auto F>
struct PyOp;
template <class R, class... A, R (*F)(A...)>
struct PyOp<F> {
  static R call(typename PyArg<std::decay_t<A>>::type... args) { return F(args...); }
};

}  // namespace bindings
}  // namespace cudnn_rnn
