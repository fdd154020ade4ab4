// Activations over contiguous arrays, for the CPU cell updates.
//
// float32 tanh / sigmoid / exp use branch-free Cephes-style approximations (about 1-2 ulp) that
// GCC vectorises; the loops are compiled twice (vec_loops_avx2.cpp for AVX2+FMA,
// vec_loops_base.cpp for baseline x86-64) and activation_arrays.cpp picks one at load time from
// the CPU's features. Every other activation, and float64 throughout, uses the scalar
// definitions of cell_math.h, which are the reference the tests hold these to.
#pragma once

#include <cstdint>

#include "core/cell_math.h"

namespace cudnn_rnn {
namespace cpu {

// y[i] = f(x[i]); y may alias x.
void activate_array(Activation a, const float* x, float* y, int64_t n);
void activate_array(Activation a, const double* x, double* y, int64_t n);

// g[i] = f'(x[i]) given y[i] = f(x[i]).
void activate_grad_array(Activation a, const float* x, const float* y, float* g, int64_t n);
void activate_grad_array(Activation a, const double* x, const double* y, double* g, int64_t n);

}  // namespace cpu
}  // namespace cudnn_rnn
