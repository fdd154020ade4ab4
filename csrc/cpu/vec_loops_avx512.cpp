#include "cpu/vec_loops.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,prefer-vector-width=512")
#endif
#define CUDNN_RNN_VEC_NS vec_avx512
#include "cpu/vec_loops_impl.h"
