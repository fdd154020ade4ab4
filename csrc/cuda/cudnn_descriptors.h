// RAII wrappers for the cuDNN descriptors the RNN path uses, and a status check that names the
// call. Every cudnn* call in csrc/cuda goes through CUDNN_RNN_CHECK.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cudnn.h>

#include <vector>

#define CUDNN_RNN_CHECK(call)                                                                          \
  do {                                                                                                 \
    const cudnnStatus_t cudnn_rnn_status_ = (call);                                                    \
    TORCH_CHECK(cudnn_rnn_status_ == CUDNN_STATUS_SUCCESS, "cudnn_rnn: ", #call, " failed: ",          \
                cudnnGetErrorString(cudnn_rnn_status_));                                               \
  } while (0)

namespace cudnn_rnn {
namespace cudnn {

template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class Descriptor {
 public:
  Descriptor() { CUDNN_RNN_CHECK(Create(&desc_)); }
  ~Descriptor() {
    if (desc_) Destroy(desc_);  // no throw from a destructor
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  T get() const { return desc_; }

 private:
  T desc_ = nullptr;
};

using RnnDescriptor = Descriptor<cudnnRNNDescriptor_t, cudnnCreateRNNDescriptor, cudnnDestroyRNNDescriptor>;
using RnnDataDescriptor =
    Descriptor<cudnnRNNDataDescriptor_t, cudnnCreateRNNDataDescriptor, cudnnDestroyRNNDataDescriptor>;
using TensorDescriptor = Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using DropoutDescriptor =
    Descriptor<cudnnDropoutDescriptor_t, cudnnCreateDropoutDescriptor, cudnnDestroyDropoutDescriptor>;

inline cudnnDataType_t data_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return CUDNN_DATA_FLOAT;
    case at::kDouble: return CUDNN_DATA_DOUBLE;
    case at::kHalf: return CUDNN_DATA_HALF;
    case at::kBFloat16: return CUDNN_DATA_BFLOAT16;
    default: TORCH_CHECK(false, "cudnn_rnn: dtype ", t, " has no cuDNN RNN data type");
  }
}

// A packed 3-D tensor descriptor [d0, d1, d2] (the h / c states: [L*D, B, u]).
inline void set_tensor_3d(const TensorDescriptor& desc, cudnnDataType_t type, int d0, int d1, int d2) {
  const int dims[3] = {d0, d1, d2};
  const int strides[3] = {d1 * d2, d2, 1};
  CUDNN_RNN_CHECK(cudnnSetTensorNdDescriptor(desc.get(), type, 3, dims, strides));
}

// A sequence in `layout` ([B, T, vector] batch-major, [T, B, vector] sequence-major) with per-row
// lengths (host array); padded output positions are filled with zero. cuDNN reads the fill as one value of `type` and copies it; the
// 8 zero bytes are zero in every RNN data type (half, bfloat16, float, double).
inline void set_rnn_data(const RnnDataDescriptor& desc, cudnnDataType_t type, cudnnRNNDataLayout_t layout,
                         int max_len, int batch, int vector, const std::vector<int32_t>& lengths) {
  double zero_fill = 0.0;
  CUDNN_RNN_CHECK(cudnnSetRNNDataDescriptor(desc.get(), type, layout, max_len, batch, vector, lengths.data(),
                                            &zero_fill));
}

// Elements described by a tensor descriptor (cudnnGetRNNWeightParams fills mDesc / bDesc).
inline int64_t tensor_elements(const TensorDescriptor& desc) {
  cudnnDataType_t type;
  int nb_dims = 0;
  int dims[8] = {0};
  int strides[8] = {0};
  CUDNN_RNN_CHECK(cudnnGetTensorNdDescriptor(desc.get(), 8, &type, &nb_dims, dims, strides));
  int64_t n = 1;
  for (int i = 0; i < nb_dims; ++i) n *= dims[i];
  return n;
}

}  // namespace cudnn
}  // namespace cudnn_rnn
