// The weight and bias gradients of a float32 convolution on channels-last tensors, on the CPU's
// own register tiles (AVX-512 or AVX2 + FMA): no im2col and no packing. A tile holds, for 32 (16)
// output channels and up to 12 (6) columns of one kernel position's input slab, the sum over a
// block of output pixels of grad[pixel, o] * input[pixel's patch, column]: per pixel two vector
// loads of the gradient's row and one broadcast per column, straight from the padded input.
// ConvLSTM's backward runs its input and recurrent kernels' gradients here (core/conv_lstm.cpp,
// CellSteps::weight_gradient): oneDNN's weight-gradient convolutions ran those at 43-67 % of the
// FMA peak on an AMD EPYC Zen 5 (AVX-512) and at 53-67 % at its AVX2 level.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace cudnn_rnn {
namespace cpu {

// input [N, *S, C] and grad [N, *S', O] (1 to 3 spatial dimensions, channels last; grad's rows
// may lie further apart than O, as a narrowed tensor's do), with the convolution's kernel size,
// stride, padding before and after (zeros) and dilation per spatial dimension: {grad_weight
// [O, C, *K] (a view of memory laid out [O][*K][C]), grad_bias [O] (undefined unless want_bias)}.
// Both undefined where the tensors are not float32, the CPU has no AVX2 / FMA, or
// CUDNN_RNN_CPU_CONV_GRAD=aten is set (for measurement): ATen's then.
// The sum over pixels runs in chunks fixed by the shapes alone, so the result is the same bits on
// any number of threads.
std::tuple<at::Tensor, at::Tensor> conv_weight_grad(const at::Tensor& input, const at::Tensor& grad,
                                                    at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                                    at::IntArrayRef pad_before, at::IntArrayRef pad_after,
                                                    at::IntArrayRef dilation, bool want_bias);

}  // namespace cpu
}  // namespace cudnn_rnn
