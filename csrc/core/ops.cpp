// Every schema of the cudnn_rnn namespace, and nothing else. rnn_*'s kernels register per dispatch
// key through one adapter (core/rnn_call.h): CPU in cpu/rnn_cpu.cpp, CUDA in cuda/register.cpp,
// Autograd in core/autograd.cpp; their fake (meta) kernels are Python's (cudnn_rnn/ops.py).
// conv_lstm_*'s through ConvLstmKernels (core/conv_lstm.h): cpu/conv_lstm_cpu.cpp,
// cuda/conv_lstm_cuda.cpp, core/conv_lstm_autograd.cpp; fakes in cudnn_rnn/conv_lstm.py.
//
// rnn_forward runs a whole stack (num_layers x 1 or 2 directions) in one call.
//   x        [B, T, I]  batch-major, as in Keras
//   weights  per (layer, direction), layer-major: kernel [I_l, G*u], recurrent_kernel [u, G*u],
//            bias (if use_bias) [G*u], or [2, G*u] for GRU reset_after (row 0 input, row 1 recurrent)
//   mask     [B, T] bool, True = real step (any pattern)
//   h0, c0   [L*D, B, u]
//   dropout_masks / recurrent_dropout_masks: empty, or one [1 or G, B, width] per (layer, direction)
//   need_grad: False when no backward will run (cuDNN then uses its INFERENCE mode and keeps no reserve)
//   zero_output_for_mask: masked steps output zeros instead of the previous output (Keras); the
//            inner layers of a bidirectional stack always do, as Keras's Bidirectional forces it
// returns y [B, T, D*u], h_n [L*D, B, u], c_n [L*D, B, u] (LSTM) or [0], and the reserve that
// rnn_backward reads: uint8 bytes whose size and layout belong to the backend that ran (the CPU's
// saved activations, cuDNN's reserve space), so the fake kernel gives it a data-dependent size.
//
// rnn_forward_int8 is rnn_forward's inference with dynamic int8 quantization (CPU only, no
// dropout, no autograd): the float32 weights are quantized per output column by the kernel (and
// kept while unchanged), each GEMM's input per row as it is computed; y, h_n, c_n as rnn_forward.
// linear_int8(x [..., K], kernel [K, N], bias [N]) is the same for a Dense layer.
//
// conv_lstm_forward runs one ConvLSTM layer (Keras ConvLSTM1D/2D/3D), channels last:
//   x        [B, T, *S, C]  (S: 1 to 3 spatial sizes)
//   kernel   [4F, C, *k]  recurrent_kernel [4F, F, *k]  bias [4F] or None  (gates i, f, c, o)
//   mask     [B, T] bool;  h0, c0 [B, *S', F]
//   dropout_mask [1 or 4, B or 1, *S, C] and recurrent_dropout_mask [1 or 4, B or 1, *S', F]
//            (per gate when 4)
//   stride, pad_before, pad_after, dilation: the input convolution's (Keras "same" padding is
//            asymmetric when the total is odd); the recurrent one is "same", stride 1
// returns y [B, T, *S', F] in processing order, h_n, c_n [B, *S', F], and what backward reads:
// z [T, B, *S', 4F] (every step's gates as the backend's backward reads them: pre-activations, or
// the activated gates of the CPU's fused float32 tanh / sigmoid cell), hs and cs [T + 1, B, *S', F].
#include <torch/library.h>

TORCH_LIBRARY(cudnn_rnn, m) {
  m.def(
      "rnn_forward(Tensor x, Tensor[] weights, Tensor? mask, Tensor? h0, Tensor? c0, Tensor[] dropout_masks, "
      "Tensor[] recurrent_dropout_masks, str cell, str activation, str recurrent_activation, bool use_bias, "
      "bool reset_after, int num_layers, bool bidirectional, bool go_backwards, bool zero_output_for_mask, "
      "bool need_grad=True) -> (Tensor y, Tensor h_n, Tensor c_n, Tensor reserve)");
  m.def(
      "rnn_backward(Tensor grad_y, Tensor grad_h_n, Tensor grad_c_n, Tensor x, Tensor[] weights, Tensor? mask, "
      "Tensor[] dropout_masks, Tensor[] recurrent_dropout_masks, Tensor reserve, str cell, str activation, "
      "str recurrent_activation, bool use_bias, bool reset_after, int num_layers, bool bidirectional, "
      "bool go_backwards, bool zero_output_for_mask) "
      "-> (Tensor grad_x, Tensor[] grad_weights, Tensor grad_h0, Tensor grad_c0)");
  m.def(
      "rnn_forward_int8(Tensor x, Tensor[] weights, Tensor? mask, Tensor? h0, Tensor? c0, str cell, "
      "str activation, str recurrent_activation, bool use_bias, bool reset_after, int num_layers, "
      "bool bidirectional, bool go_backwards, bool zero_output_for_mask) -> (Tensor y, Tensor h_n, Tensor c_n)");
  m.def("linear_int8(Tensor x, Tensor kernel, Tensor? bias) -> Tensor");
  m.def(
      "conv_lstm_forward(Tensor x, Tensor kernel, Tensor recurrent_kernel, Tensor? bias, Tensor? mask, Tensor? h0, "
      "Tensor? c0, Tensor? dropout_mask, Tensor? recurrent_dropout_mask, int[] stride, int[] pad_before, "
      "int[] pad_after, int[] dilation, str activation, str recurrent_activation, bool go_backwards) "
      "-> (Tensor y, Tensor h_n, Tensor c_n, Tensor z, Tensor hs, Tensor cs)");
  m.def(
      "conv_lstm_backward(Tensor grad_y, Tensor grad_h_n, Tensor grad_c_n, Tensor x, Tensor kernel, "
      "Tensor recurrent_kernel, Tensor? bias, Tensor? mask, Tensor? dropout_mask, Tensor? recurrent_dropout_mask, "
      "Tensor z, Tensor hs, Tensor cs, int[] stride, int[] pad_before, int[] pad_after, int[] dilation, "
      "str activation, str recurrent_activation, bool go_backwards) "
      "-> (Tensor grad_x, Tensor grad_kernel, Tensor grad_recurrent_kernel, Tensor grad_bias, Tensor grad_h0, "
      "Tensor grad_c0)");
}
