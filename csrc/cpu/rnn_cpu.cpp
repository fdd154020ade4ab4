// CPU backend of the recurrent stack ops: the device-generic driver (rnn_driver.h) with row
// loops for the pointwise step, in parallel over batch rows (at::parallel_for, the user's
// thread count), each row's gates activated as arrays (cell_rows.h, vectorised). float16 and
// bfloat16 compute in float32.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "../rnn_driver.h"
#include "cell_rows.h"

namespace cudnn_rnn {
namespace {

using at::Tensor;

int64_t grain(int64_t units, int64_t gates) { return std::max<int64_t>(1, 16384 / (units * gates)); }

struct CpuPolicy {
  template <typename T>
  static void gru_before_gates(const ForwardStep<T>& p) {
    const int64_t u = p.units, G = p.gates, S = p.saved_width;
    at::parallel_for(0, p.batch, grain(u, G), [&](int64_t b0, int64_t b1) {
      std::vector<T> scratch(cpu::row_scratch_size(u));
      std::vector<T> hd(u);
      for (int64_t b = b0; b < b1; ++b) {
        const T* hp = p.h_prev + b * u;
        for (int64_t j = 0; j < u; ++j) hd[j] = p.mask_h ? hp[j] * p.mask_h[b * u + j] : hp[j];
        cpu::gru_before_row_gates<T>(p.ract, u, p.xw.row(p.t, b), p.rec + b * G * u, hd.data(), p.saved + b * S,
                                     p.rh + b * u, scratch.data());
      }
    });
  }

  template <typename T>
  static void forward_step(const ForwardStep<T>& p) {
    const int64_t u = p.units, G = p.gates, S = p.saved_width;
    at::parallel_for(0, p.batch, grain(u, G), [&](int64_t b0, int64_t b1) {
      std::vector<T> scratch(cpu::row_scratch_size(u));
      for (int64_t b = b0; b < b1; ++b) {
        const bool real = p.mask ? p.mask[b * p.time + p.t] : true;
        if (real) p.seen[b] = 1;
        const T* xwr = p.xw.row(p.t, b);
        const T* recr = p.rec + b * G * u;
        T* sv = p.saved + b * S;
        T* outr = p.out.row(p.out_index, b) + p.out_col;
        const T* hp = p.h_prev + b * u;
        T* hn = p.h_next + b * u;
        if (!real) {
          // Keras: the state is carried; the output is the previous output (zero before the
          // first real step) or zero with zero_output_for_mask.
          for (int64_t j = 0; j < u; ++j) {
            hn[j] = hp[j];
            outr[j] = (p.zero_out || !p.seen[b]) ? T(0) : hp[j];
          }
          if (p.c_next) {
            for (int64_t j = 0; j < u; ++j) p.c_next[b * u + j] = p.c_prev[b * u + j];
          }
          for (int64_t k = 0; k < S; ++k) sv[k] = T(0);
          continue;
        }
        switch (p.cell) {
          case CellKind::LSTM:
            cpu::lstm_row_forward<T>(p.act, p.ract, u, xwr, recr, p.c_prev + b * u, sv, hn, p.c_next + b * u,
                                     scratch.data());
            break;
          case CellKind::GRU:
            if (p.reset_after) {
              cpu::gru_after_row_forward<T>(p.act, p.ract, u, xwr, recr, hp, sv, hn, scratch.data());
            } else {
              cpu::gru_before_row_update<T>(p.act, p.ract, u, xwr, p.rec_h + b * u, hp, sv, hn, scratch.data());
            }
            break;
          case CellKind::SimpleRNN:
            cpu::simple_row_forward<T>(p.act, u, xwr, recr, sv, hn);
            break;
        }
        for (int64_t j = 0; j < u; ++j) outr[j] = hn[j];
      }
    });
  }

  template <typename T>
  static void backward_step(const BackwardStep<T>& p) {
    const int64_t u = p.units, G = p.gates, S = p.saved_width;
    at::parallel_for(0, p.batch, grain(u, G), [&](int64_t b0, int64_t b1) {
      std::vector<T> scratch(cpu::row_scratch_size(u));
      for (int64_t b = b0; b < b1; ++b) {
        const bool real = p.mask ? p.mask[b * p.time + p.t] : true;
        // Which output positions read this step's state: the step itself when real, and with
        // carry-over also every masked step after the first real one.
        const bool reads = p.zero_out ? real : p.s >= p.first[b];
        T* dhr = p.dh + b * u;
        if (reads) {
          const T* dor = p.dout.row(p.out_index, b) + p.out_col;
          for (int64_t j = 0; j < u; ++j) dhr[j] += dor[j];
        }
        T* dxr = p.dxw.row(p.t, b);
        T* drr = p.drec + b * G * u;
        T* dnr = p.dh_next + b * u;
        if (!real) {
          for (int64_t k = 0; k < G * u; ++k) dxr[k] = drr[k] = T(0);
          for (int64_t j = 0; j < u; ++j) dnr[j] = dhr[j];
          continue;  // dc carries through unchanged
        }
        const T* sv = p.saved + b * S;
        const T* hp = p.h_prev + b * u;
        switch (p.cell) {
          case CellKind::LSTM:
            cpu::lstm_row_backward<T>(p.act, p.ract, u, sv, p.c_prev + b * u, p.c_new + b * u, dhr, p.dc + b * u, dxr,
                                      scratch.data());
            for (int64_t j = 0; j < u; ++j) dnr[j] = T(0);
            for (int64_t k = 0; k < G * u; ++k) drr[k] = dxr[k];
            break;
          case CellKind::GRU:
            if (p.reset_after) {
              cpu::gru_after_row_backward<T>(p.act, p.ract, u, sv, hp, dhr, dxr, drr, dnr, scratch.data());
            } else {
              cpu::gru_before_row_backward_a<T>(p.act, p.ract, u, sv, hp, dhr, dxr, dnr, scratch.data());
              for (int64_t j = 0; j < u; ++j) {
                drr[j] = dxr[j];
                drr[2 * u + j] = dxr[2 * u + j];
              }
            }
            break;
          case CellKind::SimpleRNN:
            cpu::simple_row_backward<T>(p.act, u, sv, p.h_new + b * u, dhr, dxr);
            for (int64_t j = 0; j < u; ++j) {
              drr[j] = dxr[j];
              dnr[j] = T(0);
            }
            break;
        }
      }
    });
  }

  template <typename T>
  static void gru_before_backward_b(const BackwardStep<T>& p) {
    const int64_t u = p.units, G = p.gates, S = p.saved_width;
    at::parallel_for(0, p.batch, grain(u, G), [&](int64_t b0, int64_t b1) {
      std::vector<T> scratch(cpu::row_scratch_size(u));
      for (int64_t b = b0; b < b1; ++b) {
        const bool real = p.mask ? p.mask[b * p.time + p.t] : true;
        if (!real) continue;
        T* dxr = p.dxw.row(p.t, b);
        cpu::gru_before_row_backward_b<T>(p.ract, u, p.saved + b * S, p.h_prev + b * u,
                                          p.mask_h ? p.mask_h + b * u : nullptr, p.d_rh + b * u, dxr,
                                          p.dh_next + b * u, scratch.data());
        T* drr = p.drec + b * G * u;
        for (int64_t j = 0; j < u; ++j) drr[u + j] = dxr[u + j];
      }
    });
  }
};

std::tuple<Tensor, Tensor, Tensor, Tensor> rnn_forward_cpu(
    const Tensor& x, at::TensorList weights, const c10::optional<Tensor>& mask, const c10::optional<Tensor>& h0,
    const c10::optional<Tensor>& c0, at::TensorList dropout_masks, at::TensorList recurrent_dropout_masks,
    c10::string_view cell, c10::string_view activation, c10::string_view recurrent_activation, bool use_bias,
    bool reset_after, int64_t num_layers, bool bidirectional, bool go_backwards, bool zero_output_for_mask,
    bool need_grad) {
  RnnConfig cfg = make_config(x, weights, mask, h0, c0, dropout_masks, recurrent_dropout_masks, cell,
                              activation, recurrent_activation, use_bias, reset_after,
                              num_layers, bidirectional, go_backwards, zero_output_for_mask);
  cfg.keep_saved = need_grad;  // inference: no per-step activations to keep (and no pages to fault in)
  return driver::forward_any_precision<CpuPolicy>(cfg, x, weights, mask, h0, c0, dropout_masks,
                                                  recurrent_dropout_masks);
}

std::tuple<Tensor, std::vector<Tensor>, Tensor, Tensor> rnn_backward_cpu(
    const Tensor& grad_y, const Tensor& grad_h_n, const Tensor& grad_c_n, const Tensor& x, at::TensorList weights,
    const c10::optional<Tensor>& mask, at::TensorList dropout_masks, at::TensorList recurrent_dropout_masks,
    const Tensor& reserve, c10::string_view cell, c10::string_view activation,
    c10::string_view recurrent_activation, bool use_bias, bool reset_after, int64_t num_layers, bool bidirectional,
    bool go_backwards, bool zero_output_for_mask) {
  const RnnConfig cfg = make_config(x, weights, mask, c10::nullopt, c10::nullopt, dropout_masks,
                                    recurrent_dropout_masks, cell, activation,
                                    recurrent_activation, use_bias, reset_after, num_layers,
                                    bidirectional, go_backwards, zero_output_for_mask);
  return driver::backward_any_precision<CpuPolicy>(cfg, grad_y, grad_h_n, grad_c_n, x, weights, mask,
                                                   dropout_masks, recurrent_dropout_masks, reserve);
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_rnn, CPU, m) {
  m.impl("rnn_forward", &rnn_forward_cpu);
  m.impl("rnn_backward", &rnn_backward_cpu);
}

}  // namespace cudnn_rnn
