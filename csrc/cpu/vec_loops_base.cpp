#include "cpu/vec_loops.h"

#define CUDNN_RNN_VEC_NS vec_base
#include "cpu/vec_loops_impl.h"
