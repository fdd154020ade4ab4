// float32 loops that GCC vectorises (no libm calls, no branches): the activations (tanh,
// sigmoid, clipped ramps) and the rounding to bfloat16 over arrays, and the fused cell rows of LSTM and GRU reset_after=True
// whose activations are tanh or sigmoid (every gate activated, combined and saved in one call
// per row, gate by gate over chunks of the units). vec_loops_impl.h is compiled once per instruction set: namespace vec_base
// (baseline x86-64, or the target's baseline elsewhere), vec_avx2 (AVX2 + FMA) and vec_avx512
// (AVX-512 F/BW/DQ/VL, 512-bit vectors); float_loops() picks one at load time.
#pragma once

#include <cstdint>

namespace cudnn_rnn {
namespace cpu {

// Row arguments: a gate-blocked array p holds gate q's n values at p + q * stride (xs, rs, ss,
// dxs, drs); act_tanh / ract_tanh say whether act / ract is tanh (else sigmoid). `saved` holds the
// activated gates (LSTM i, f, c~, o; GRU z, r, n and the recurrent candidate hh); forward rows
// take a null saved where nothing will read them (inference).
#define CUDNN_RNN_DECLARE_LOOPS(ns)                                                                                  \
  namespace ns {                                                                                                     \
  void tanh_loop(const float* x, float* y, int64_t n);                                                               \
  void sigmoid_loop(const float* x, float* y, int64_t n);                                                            \
  void clip_ramp_loop(const float* x, float* y, int64_t n, float slope); /* clip(x * slope + 0.5, 0, 1) */           \
  void to_bf16_loop(const float* x, uint16_t* y, int64_t n); /* bfloat16 bits, to nearest (ties to even) */           \
  /* acc[j] += sum over r < rows of x[r * ld + j], j < n */                                                         \
  void add_rows_to_f64_loop(const float* x, int64_t ld, int64_t rows, int64_t n, double* acc);                     \
  void lstm_forward_row(bool act_tanh, bool ract_tanh, int64_t n, const float* xw, int64_t xs, const float* rec,     \
                        int64_t rs, const float* c_prev, float* saved, int64_t ss, float* h_new, float* c_new);      \
  /* dc: in the gradient w.r.t. c_new, out the one w.r.t. c_prev */                                                  \
  void lstm_backward_row(bool act_tanh, bool ract_tanh, int64_t n, const float* saved, int64_t ss,                   \
                         const float* c_prev, const float* c_new, const float* dh, float* dc, float* dx, int64_t dxs); \
  void gru_forward_row(bool act_tanh, bool ract_tanh, int64_t n, const float* xw, int64_t xs, const float* rec,      \
                       int64_t rs, const float* h_prev, float* saved, int64_t ss, float* h_new);                     \
  void gru_backward_row(bool act_tanh, bool ract_tanh, int64_t n, const float* saved, int64_t ss,                    \
                        const float* h_prev, const float* dh, float* dx, int64_t dxs, float* drec, int64_t drs,      \
                        float* dh_prev);                                                                             \
  }
CUDNN_RNN_DECLARE_LOOPS(vec_base)
CUDNN_RNN_DECLARE_LOOPS(vec_avx2)
CUDNN_RNN_DECLARE_LOOPS(vec_avx512)
#undef CUDNN_RNN_DECLARE_LOOPS

// One instruction set's loops.
struct FloatLoops {
  const char* isa;  // "avx512", "avx2" or "baseline"
  void (*tanh)(const float*, float*, int64_t);
  void (*sigmoid)(const float*, float*, int64_t);
  void (*clip_ramp)(const float*, float*, int64_t, float);
  void (*to_bf16)(const float*, uint16_t*, int64_t);
  void (*add_rows_to_f64)(const float*, int64_t, int64_t, int64_t, double*);
  decltype(&vec_base::lstm_forward_row) lstm_forward_row;
  decltype(&vec_base::lstm_backward_row) lstm_backward_row;
  decltype(&vec_base::gru_forward_row) gru_forward_row;
  decltype(&vec_base::gru_backward_row) gru_backward_row;
};

// Whether the CPU (and its OS) runs AVX-512 F/BW/DQ/VL code: what the avx512 loops and the packed
// GEMM's AVX-512 build are compiled for. False off x86-64.
bool cpu_has_avx512();

// The loops of the widest instruction set both the CPU and ATen's level allow (ATen's
// get_cpu_capability(): ATEN_CPU_CAPABILITY=avx2 lowers it), picked on first use.
const FloatLoops& float_loops();

}  // namespace cpu
}  // namespace cudnn_rnn
