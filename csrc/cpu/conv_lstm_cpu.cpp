// ConvLSTM on the CPU: the pointwise step over pixels in parallel (each pixel of a batch row is
// one LSTM row of F units, its gates in blocks of F), float32 tanh / sigmoid cells through the
// per-ISA fused LSTM rows of vec_loops, the rest through core/conv_lstm_cell.h; the convolutions
// are ATen's (core/conv_lstm.cpp), except the kernels' float32 gradients (conv_weight_grad.h).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/conv_lstm.h"
#include "core/conv_lstm_cell.h"
#include "cpu/buffer_pool.h"
#include "cpu/conv_weight_grad.h"
#include "cpu/vec_loops.h"

namespace cudnn_rnn {
namespace {

using at::Tensor;

// Rows per task: enough elements that a task outweighs the fork.
int64_t row_grain(int64_t per_row) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(per_row, 1)); }


bool tanh_or_sigmoid(Activation a) { return a == Activation::Tanh || a == Activation::Sigmoid; }

// float32 tanh / sigmoid cells run the per-ISA fused LSTM rows (vec_loops.h), which keep the
// activated gates in z; everything else the scalar element functions, which keep pre-activations.
// Forward and backward decide alike (these two overloads), so backward reads what forward wrote.
bool fused_forward_row(Activation act, Activation ract, int64_t n, const float* zin, const float* r,
                       const float* c_prev, float* z, float* h_new, float* c_new) {
  if (!tanh_or_sigmoid(act) || !tanh_or_sigmoid(ract)) return false;
  cpu::float_loops().lstm_forward_row(act == Activation::Tanh, ract == Activation::Tanh, n, zin, n, r, n, c_prev, z,
                                      n, h_new, c_new);
  return true;
}
bool fused_forward_row(Activation, Activation, int64_t, const double*, const double*, const double*, double*, double*,
                       double*) {
  return false;
}

// dh_scratch: in dh + dy, clobbered; dc: in the gradient of c_new, out that of c_prev.
bool fused_backward_row(Activation act, Activation ract, int64_t n, const float* z, const float* c_prev,
                        const float* c_new, float* dh_scratch, float* dc, float* dz) {
  if (!tanh_or_sigmoid(act) || !tanh_or_sigmoid(ract)) return false;
  cpu::float_loops().lstm_backward_row(act == Activation::Tanh, ract == Activation::Tanh, n, z, n, c_prev, c_new,
                                       dh_scratch, dc, dz, n);
  return true;
}
bool fused_backward_row(Activation, Activation, int64_t, const double*, const double*, const double*, double*,
                        double*, double*) {
  return false;
}

// A masked row: states carried, the previous output (zero before the row's first real step).
template <typename T>
void masked_row(int64_t n, const T* h_prev, const T* c_prev, bool seen, T* h_new, T* c_new, T* out) {
  std::copy(h_prev, h_prev + n, h_new);
  std::copy(c_prev, c_prev + n, c_new);
  if (seen) std::copy(h_prev, h_prev + n, out); else std::fill(out, out + n, T(0));
}

// Whether the mask flags of a step are per pixel ([B, *S']: row q's flag) or per batch row ([B]).
bool flags_per_pixel(const Tensor& real, int64_t B, int64_t P) {
  return real.defined() && real.numel() == B * P && P > 1;
}

// Rows are pixels: row q = (batch row b, pixel p) holds F state values; its gates are the 4F
// values z[q * 4F ...] in gate blocks of F (the input convolution's row is zin's pixel p of b).
void forward_step(const Tensor& zin, const Tensor& r, const Tensor& h_prev, const Tensor& c_prev, const Tensor& real,
                  const Tensor& seen, const Tensor& z, const Tensor& h_new, const Tensor& c_new, const Tensor& out,
                  Activation act, Activation ract) {
  const int64_t B = h_prev.size(0), F = h_prev.size(-1), P = h_prev.numel() / (B * F);
  const bool* rl = real.defined() ? real.data_ptr<bool>() : nullptr;
  const bool* sn = seen.defined() ? seen.data_ptr<bool>() : nullptr;
  const bool per_position = flags_per_pixel(real, B, P);
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "conv_lstm_forward_step", [&] {
    const scalar_t* zi = zin.data_ptr<scalar_t>();
    // r undefined: zin holds both convolutions; the cell adds a row of zeros.
    const std::vector<scalar_t> zeros(r.defined() ? 0 : static_cast<size_t>(4 * F), scalar_t(0));
    const scalar_t* rp = r.defined() ? r.data_ptr<scalar_t>() : nullptr;
    const scalar_t* hp = h_prev.data_ptr<scalar_t>();
    const scalar_t* cp = c_prev.data_ptr<scalar_t>();
    scalar_t* zp = z.data_ptr<scalar_t>();
    scalar_t* hn = h_new.data_ptr<scalar_t>();
    scalar_t* cn = c_new.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const int64_t zin_stride = zin.stride(0), out_stride = out.stride(0);
    at::parallel_for(0, B * P, row_grain(F), [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t b = q / P, p = q - b * P, s = q * F;
        const scalar_t* zr = zi + b * zin_stride + p * 4 * F;
        const scalar_t* rr = rp != nullptr ? rp + 4 * s : zeros.data();
        scalar_t* o = op + b * out_stride + p * F;
        const int64_t m = per_position ? q : b;
        if (rl != nullptr && !rl[m]) {
          std::fill(zp + 4 * s, zp + 4 * s + 4 * F, scalar_t(0));  // as conv_lstm_cell.h
          masked_row(F, hp + s, cp + s, sn != nullptr && sn[m], hn + s, cn + s, o);
          continue;
        }
        if (fused_forward_row(act, ract, F, zr, rr, cp + s, zp + 4 * s, hn + s, cn + s)) {
          std::copy(hn + s, hn + s + F, o);
          continue;
        }
        for (int64_t f = 0; f < F; ++f) {
          conv::cell_forward<scalar_t>(act, ract, zr + f, rr + f, zp + 4 * s + f, F, hp[s + f], cp[s + f],
                                       true, false, hn + s + f, cn + s + f, o + f);
        }
      }
    });
  });
}

void backward_step(const Tensor& z, const Tensor& c_prev, const Tensor& c_new, const Tensor& real, const Tensor& seen,
                   const Tensor& dy, const Tensor& dh, const Tensor& dc, const Tensor& dz, const Tensor& dh_prev,
                   const Tensor& dc_prev, Activation act, Activation ract) {
  const int64_t B = c_prev.size(0), F = c_prev.size(-1), P = c_prev.numel() / (B * F);
  const bool* rl = real.defined() ? real.data_ptr<bool>() : nullptr;
  const bool* sn = seen.defined() ? seen.data_ptr<bool>() : nullptr;
  const bool per_position = flags_per_pixel(real, B, P);
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
    const bool fast = tanh_or_sigmoid(act) && tanh_or_sigmoid(ract) && std::is_same_v<scalar_t, float>;
    at::parallel_for(0, B * P, row_grain(F), [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t b = q / P, p = q - b * P, s = q * F;
        const scalar_t* dyr = dyp + b * dy_stride + p * F;
        const int64_t m = per_position ? q : b;
        if (rl != nullptr && !rl[m]) {  // states carried: dh and dc pass through, dy too when it was h_prev
          std::fill(dzp + 4 * s, dzp + 4 * s + 4 * F, scalar_t(0));
          const bool was_seen = sn != nullptr && sn[m];
          for (int64_t f = 0; f < F; ++f) dhq[s + f] = dhp[s + f] + (was_seen ? dyr[f] : scalar_t(0));
          std::copy(dcp + s, dcp + s + F, dcq + s);
          continue;
        }
        if (fast) {  // dh_prev's row first holds dh + dy (the row's scratch), then the direct part, 0
          for (int64_t f = 0; f < F; ++f) dhq[s + f] = dhp[s + f] + dyr[f];
          std::copy(dcp + s, dcp + s + F, dcq + s);
          fused_backward_row(act, ract, F, zp + 4 * s, cp + s, cn + s, dhq + s, dcq + s, dzp + 4 * s);
          std::fill(dhq + s, dhq + s + F, scalar_t(0));
          continue;
        }
        for (int64_t f = 0; f < F; ++f) {
          conv::cell_backward<scalar_t>(act, ract, zp + 4 * s + f, F, cp[s + f], cn[s + f], true, false, dyr[f],
                                        dhp[s + f], dcp[s + f], dzp + 4 * s + f, dhq + s + f, dcq + s + f);
        }
      }
    });
  });
}

Tensor pooled(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return cpu::pooled_empty(sizes, options.dtype().toScalarType());
}

struct CpuConvLstm {
  static const conv::CellSteps& steps() {
    static const conv::CellSteps s{&forward_step, &backward_step, &pooled, /*concatenated_inputs=*/true,
                                   &cpu::conv_weight_grad};
    return s;
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_rnn, CPU, m) { conv::ConvLstmKernels<CpuConvLstm>::register_kernels(m); }

}  // namespace cudnn_rnn
