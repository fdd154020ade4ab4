#include "cpu/vec_loops.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx2,fma")
#endif
#define CUDNN_RNN_VEC_NS vec_avx2
#include "cpu/vec_loops_impl.h"
