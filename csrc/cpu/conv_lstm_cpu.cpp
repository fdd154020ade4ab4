// ConvLSTM on the CPU: the fused pointwise step (core/conv_lstm_cell.h) over batch rows in
// parallel; the convolutions are ATen's (core/conv_lstm.cpp).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "core/conv_lstm.h"
#include "core/conv_lstm_cell.h"

namespace cudnn_rnn {
namespace {

using at::Tensor;

// Rows per task: enough elements that a task outweighs the fork.
int64_t row_grain(int64_t per_row) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(per_row, 1)); }

void forward_step(const Tensor& z, const Tensor& h_prev, const Tensor& c_prev, const Tensor& real, const Tensor& seen,
                  const Tensor& h_new, const Tensor& c_new, const Tensor& out, Activation act, Activation ract) {
  const int64_t B = h_prev.size(0), n = h_prev.numel() / B;  // n = F * S'
  const bool* r = real.defined() ? real.data_ptr<bool>() : nullptr;
  const bool* sn = seen.defined() ? seen.data_ptr<bool>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "conv_lstm_forward_step", [&] {
    const scalar_t* zp = z.data_ptr<scalar_t>();
    const scalar_t* hp = h_prev.data_ptr<scalar_t>();
    const scalar_t* cp = c_prev.data_ptr<scalar_t>();
    scalar_t* hn = h_new.data_ptr<scalar_t>();
    scalar_t* cn = c_new.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const int64_t out_stride = out.stride(0);
    at::parallel_for(0, B, row_grain(n), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const bool is_real = r == nullptr || r[b];
        const bool was_seen = sn != nullptr && sn[b];
        const scalar_t* zb = zp + b * 4 * n;
        for (int64_t e = 0; e < n; ++e) {
          const int64_t i = b * n + e;
          conv::cell_forward<scalar_t>(act, ract, zb + e, n, hp[i], cp[i], is_real, was_seen, hn + i, cn + i,
                                       op + b * out_stride + e);
        }
      }
    });
  });
}

void backward_step(const Tensor& z, const Tensor& c_prev, const Tensor& c_new, const Tensor& real, const Tensor& seen,
                   const Tensor& dy, const Tensor& dh, const Tensor& dc, const Tensor& dz, const Tensor& dh_prev,
                   const Tensor& dc_prev, Activation act, Activation ract) {
  const int64_t B = c_prev.size(0), n = c_prev.numel() / B;
  const bool* r = real.defined() ? real.data_ptr<bool>() : nullptr;
  const bool* sn = seen.defined() ? seen.data_ptr<bool>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "conv_lstm_backward_step", [&] {
    const scalar_t* zp = z.data_ptr<scalar_t>();
    const scalar_t* cp = c_prev.data_ptr<scalar_t>();
    const scalar_t* cn = c_new.data_ptr<scalar_t>();
    const scalar_t* dyp = dy.data_ptr<scalar_t>();
    const scalar_t* dhp = dh.data_ptr<scalar_t>();
    const scalar_t* dcp = dc.data_ptr<scalar_t>();
    scalar_t* dzp = dz.data_ptr<scalar_t>();
    scalar_t* dhq = dh_prev.data_ptr<scalar_t>();
    scalar_t* dcq = dc_prev.data_ptr<scalar_t>();
    const int64_t dy_stride = dy.stride(0);
    at::parallel_for(0, B, row_grain(n), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const bool is_real = r == nullptr || r[b];
        const bool was_seen = sn != nullptr && sn[b];
        for (int64_t e = 0; e < n; ++e) {
          const int64_t i = b * n + e;
          conv::cell_backward<scalar_t>(act, ract, zp + b * 4 * n + e, n, cp[i], cn[i], is_real, was_seen,
                                        dyp[b * dy_stride + e], dhp[i], dcp[i], dzp + b * 4 * n + e, dhq + i,
                                        dcq + i);
        }
      }
    });
  });
}

struct CpuConvLstm {
  static const conv::CellSteps& steps() {
    static const conv::CellSteps s{&forward_step, &backward_step};
    return s;
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_rnn, CPU, m) { conv::ConvLstmKernels<CpuConvLstm>::register_kernels(m); }

}  // namespace cudnn_rnn
