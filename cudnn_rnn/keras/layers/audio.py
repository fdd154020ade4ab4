"""The audio front ends that sit before recurrent layers in speech models: MelSpectrogram (an
STFT, the HTK mel filterbank, decibels) and STFTSpectrogram (convolutions with the file's STFT
kernels); their modules and their builders. Both compute what Keras 3 computes, step for step:
MelSpectrogram's decibel floor (top_db) is taken from the largest value of the whole batch, as
Keras does."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...conv_lstm import same_padding
from .base import _Single, channels_last_format
from .registry import builder
from .values import Values, check_shapes

_MEL_BREAK_HZ, _MEL_Q = 700.0, 1127.0


def _hz_to_mel(f: torch.Tensor) -> torch.Tensor:
    return _MEL_Q * torch.log(1.0 + f / _MEL_BREAK_HZ)


def mel_matrix(mel_bins: int, spectrogram_bins: int, rate: float, lower: float, upper: float) -> torch.Tensor:
    """[spectrogram_bins, mel_bins] triangular filters with peak 1 on the HTK mel scale, the DC
    bin zero (Keras's linear_to_mel_weight_matrix, float32)."""
    dt = torch.float32
    freqs = torch.linspace(0.0, rate / 2.0, spectrogram_bins, dtype=dt)[1:]
    bins_mel = _hz_to_mel(freqs).unsqueeze(1)
    edges = torch.linspace(float(_hz_to_mel(torch.tensor(lower, dtype=dt))), float(_hz_to_mel(torch.tensor(upper, dtype=dt))),
                           mel_bins + 2, dtype=dt)
    lo, center, hi = edges[:-2].unsqueeze(0), edges[1:-1].unsqueeze(0), edges[2:].unsqueeze(0)
    weights = torch.clamp(torch.minimum((bins_mel - lo) / (center - lo), (hi - bins_mel) / (hi - center)), min=0.0)
    return F.pad(weights, (0, 0, 1, 0))


class MelSpectrogram(_Single):
    """[B, samples] -> [B, mel_bins, frames]."""

    keeps_mask = False

    def __init__(self, fft_length, stride, length, window, rate, mel_bins, min_freq, max_freq, power_to_db, top_db,
                 mag_exp, min_power, ref_power):
        super().__init__()
        self.fft_length, self.stride, self.length, self.window = fft_length, stride, length, window
        self.power_to_db, self.top_db, self.mag_exp = power_to_db, top_db, mag_exp
        self.min_power, self.ref_power = min_power, ref_power
        self.register_buffer("mel", mel_matrix(mel_bins, fft_length // 2 + 1, rate, min_freq, max_freq))

    def apply(self, x):
        x = x if x.dtype in (torch.float32, torch.float64) else x.float()
        if self.window is None:
            win = torch.ones(self.length, dtype=x.dtype, device=x.device)
        else:
            make = torch.hann_window if self.window == "hann" else torch.hamming_window
            win = make(self.length, periodic=True, dtype=x.dtype, device=x.device)
        lead, samples = x.shape[:-1], x.shape[-1]
        spec = torch.stft(x.reshape(-1, samples), n_fft=self.fft_length, hop_length=self.stride, win_length=self.length,
                          window=win, center=True, return_complex=True)
        spec = spec.reshape(*lead, *spec.shape[-2:]).transpose(-1, -2)  # [..., frames, bins]
        magnitude = torch.sqrt(spec.real ** 2 + spec.imag ** 2) ** self.mag_exp
        y = torch.tensordot(magnitude, self.mel.to(magnitude.dtype), dims=1)
        if self.power_to_db:
            y = 10.0 * torch.log10(torch.clamp(y, min=self.min_power))
            y = y - 10.0 * math.log10(max(abs(self.ref_power), self.min_power))
            y = torch.maximum(y, y.max() - self.top_db)
        return y.transpose(-1, -2)


class STFTSpectrogram(_Single):
    """[B, T, C] (or [B, C, T]) -> per channel, the convolutions of each frame with the real and
    imaginary STFT kernels, combined as `mode` says and laid out as Keras lays them out."""

    keeps_mask = False

    def __init__(self, real, imag, mode: str, step: int, padding: str, expand_dims: bool, channels_last: bool):
        super().__init__()
        self.real_kernel, self.imag_kernel = real, imag
        self.mode, self.step, self.padding = mode, step, padding
        self.expand_dims, self.channels_last = expand_dims, channels_last

    def keras_groups(self):
        return [("", [k for k in (self.real_kernel, self.imag_kernel) if k is not None])]

    def _conv(self, x, kernel):  # -> [B, C, bins, frames]
        h = x.transpose(1, 2) if self.channels_last else x
        b, c, t = h.shape
        h = h.reshape(b * c, 1, t)
        weight = kernel.permute(2, 1, 0).to(h.dtype)  # (length, 1, bins) -> (bins, 1, length)
        if self.padding == "same":
            h = F.pad(h, same_padding(t, weight.shape[-1], self.step, 1))
        y = F.conv1d(h, weight, stride=self.step)
        return y.reshape(b, c, y.shape[1], y.shape[2])

    def _layout(self, y):
        b, c, f, t = y.shape
        if self.channels_last:
            return y.permute(0, 3, 2, 1) if self.expand_dims else y.reshape(b, c * f, t).transpose(1, 2)
        return y.transpose(2, 3) if self.expand_dims else y.reshape(b, c * f, t)

    def apply(self, x):
        real = self._conv(x, self.real_kernel) if self.real_kernel is not None else None
        imag = self._conv(x, self.imag_kernel) if self.imag_kernel is not None else None
        if self.mode == "real":
            return self._layout(real)
        if self.mode == "imag":
            return self._layout(imag)
        if self.mode == "angle":
            return self._layout(torch.atan2(imag, real))
        if self.mode == "stft":
            return self._layout(torch.cat([real, imag], dim=2))
        power = real ** 2 + imag ** 2
        if self.mode == "psd":
            return self._layout(power + F.pad(power[:, :, 1:-1, :], (0, 0, 1, 1)))
        linear = self._layout(torch.sqrt(torch.clamp(power, min=1e-7)))
        return linear if self.mode == "magnitude" else torch.log(torch.clamp(linear, min=1e-7))


@builder("MelSpectrogram", weights=False)
def build_mel_spectrogram(cfg, ctx):
    v = Values(cfg, ctx)
    fft_length = v.int("fft_length", 2048, lo=2, hi=1 << 14)  # (the filterbank is made when the model is built)
    length = v.int("sequence_length", fft_length, lo=1, hi=fft_length)
    window = cfg.get("window", "hann")
    if window not in ("hann", "hamming", None):
        raise ctx.error(f"MelSpectrogram window={str(window)[:40]!r} is not supported (hann, hamming or none)")
    rate = v.float("sampling_rate", 16000, 1.0, 1e7)
    max_freq = v.float("max_freq", float(int(rate / 2)), 0.0, 1e7)
    return MelSpectrogram(fft_length, v.int("sequence_stride", 512, lo=1, hi=1 << 16), length, window, rate,
                          v.int("num_mel_bins", 128, lo=1, hi=1 << 10), v.float("min_freq", 20.0, 0.0, 1e7), max_freq,
                          v.bool("power_to_db", True), v.float("top_db", 80.0, 0.0), v.float("mag_exp", 2.0, 0.0, 16.0),
                          v.float("min_power", 1e-10, 1e-30, 1.0), v.float("ref_power", 1.0))


@builder("STFTSpectrogram")
def build_stft_spectrogram(cfg, ctx):
    v = Values(cfg, ctx)
    mode = v.str("mode", "log", ("real", "imag", "stft", "angle", "psd", "magnitude", "log"))
    length = v.int("frame_length", 256, lo=1, hi=1 << 16)
    step = v.int("frame_step", length // 2 or 1, lo=1, hi=1 << 16)
    fft_length = v.int("fft_length", 1 << max(0, (length - 1).bit_length()), lo=length, hi=1 << 17)
    n_real, n_imag = int(mode != "imag"), int(mode != "real")
    (w,) = ctx.weights.take([("", n_real + n_imag)])
    check_shapes(ctx, "STFTSpectrogram", w, [(length, 1, fft_length // 2 + 1)] * len(w))
    kernels = [ctx.tensor(a) for a in w]
    real = kernels[0] if n_real else None
    imag = kernels[-1] if n_imag else None
    return STFTSpectrogram(real, imag, mode, step, v.str("padding", "valid", ("valid", "same")),
                           v.bool("expand_dims", False), channels_last_format(cfg, ctx))
