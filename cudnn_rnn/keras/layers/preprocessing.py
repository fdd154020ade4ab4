"""Preprocessing saved inside models: Rescaling, Normalization (adapted or given mean and
variance, invert), CenterCrop, Resizing, Discretization, CategoryEncoding, IntegerLookup (its
vocabulary from the config or the .keras file's asset), Hashing, HashedCrossing, AutoContrast,
ContrastLimitedAdaptiveHistogramEqualization; Keras 3's FeatureSpace layers (TFDConcat, TFDIdentity);
and the image augmentation layers (RandomFlip, RandomRotation, RandomZoom, ...), which Keras runs
only in training: here they are exactly the identity at inference, and a model in training mode
refuses them with one error (their random transforms are Keras's own and are not reproduced);
their modules and their builders."""
from __future__ import annotations

import re
from typing import Optional

import numpy as np
import torch
from torch import nn

from .base import Identity, _Single, channels_last_format, from_channels_first, to_channels_first, without_mask_in_keras2
from .custom import short_name
from .farmhash import string_fingerprints, strings_of
from .shape import cubic_of, resize_image
from .registry import builder, dtype_name
from .values import MAX_SIZE, Values

# Keras's image augmentation layers: random in training, the identity at inference (Keras 3's
# BaseImagePreprocessingLayer returns its input unchanged when training is False; tf.keras 2's
# RandomCrop resizes instead: Keras2RandomCrop).
AUGMENTATION = (
    "AugMix", "CutMix", "Equalization", "MixUp", "RandAugment", "RandomBrightness", "RandomColorDegeneration", "RandomColorJitter",
    "RandomContrast", "RandomCrop", "RandomElasticTransform", "RandomErasing", "RandomFlip", "RandomGaussianBlur",
    "RandomGrayscale", "RandomHue", "RandomInvert", "RandomPerspective", "RandomPosterization", "RandomRotation",
    "RandomSaturation", "RandomSharpness", "RandomShear", "RandomTranslation", "RandomZoom", "Solarization",
    "MaxNumBoundingBoxes", "RandomHeight", "RandomWidth",  # (the last two: tf.keras 2)
)


def _refuse_training(module):
    if module.training:
        raise RuntimeError(f"{module.class_name} is a Keras augmentation layer: what it does at inference is "
                           "reproduced, its random training-time transform is not; call model.eval(), or augment "
                           "the data before the model")


class Augmentation(_Single):
    keeps_mask = False

    def __init__(self, class_name: str):
        super().__init__()
        self.class_name = class_name

    def apply(self, x):
        _refuse_training(self)
        return x

    def extra_repr(self):
        return self.class_name


class Rescaling(_Single):
    keeps_mask = True  # Keras 3 passes the mask on (tf.keras 2 drops it: without_mask_in_keras2)

    def __init__(self, scale: torch.Tensor, offset: torch.Tensor):
        super().__init__()
        self.register_buffer("scale", scale)
        self.register_buffer("offset", offset)

    def apply(self, x):
        return x.to(self.scale.dtype) * self.scale + self.offset


class Standardize(_Single):
    """keras.layers.Normalization: (x - mean) / max(sqrt(variance), 1e-7), or its inverse."""

    keeps_mask = True  # as Rescaling

    def __init__(self, mean: torch.Tensor, variance: torch.Tensor, axes, invert: bool, adapted: bool):
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("variance", variance)
        self.axes, self.invert, self.adapted = tuple(axes), invert, adapted

    def keras_groups(self):  # adapted: Keras keeps mean, variance and a count (unused) as weights
        return [("", [self.mean, self.variance, torch.zeros((), dtype=torch.int64)])] if self.adapted else []

    def _shaped(self, t, x):
        if t.dim() == 0:
            return t
        axes = sorted(a % x.dim() for a in self.axes)
        shape = [1] * x.dim()
        for a, n in zip(axes, t.shape):
            shape[a] = n
        return t.reshape(shape)

    def apply(self, x):
        mean, std = self._shaped(self.mean, x), torch.clamp(torch.sqrt(self._shaped(self.variance, x)), min=1e-7)
        x = x.to(self.mean.dtype)
        return mean + x * std if self.invert else (x - mean) / std


class Resizing(_Single):
    """keras.layers.Resizing: bilinear or bicubic (half-pixel; bicubic without antialiasing as
    TensorFlow, JAX or Keras's torch backend computes it, cubic: shape.py) or nearest (half-pixel),
    after a centred crop to the target's aspect ratio with crop_to_aspect_ratio, or with
    pad_to_aspect_ratio after padding to it with ``fill`` (the same whole number of rows or columns
    on both sides, as Keras's backends pad: one fewer than the aspect ratio asks where that is odd).
    ``antialias``: bilinear and bicubic weigh the source pixels with the filter stretched by the
    scale and cut at the borders, as TensorFlow's resize and torch's interpolate both do (equal
    within 6e-7 on downscales and upscales); nearest ignores it, as Keras does."""

    keeps_mask = False

    def __init__(self, height: int, width: int, interpolation: str, crop: bool, channels_last: bool,
                 pad: bool = False, fill: float = 0.0, antialias: bool = False, cubic: str = "torch"):
        super().__init__()
        self.size, self.interpolation, self.crop, self.channels_last = (height, width), interpolation, crop, channels_last
        self.pad, self.fill, self.antialias = pad, fill, antialias and interpolation in ("bilinear", "bicubic")
        self.cubic = cubic

    def apply(self, x):
        h = to_channels_first(x, self.channels_last)
        h = h if h.is_floating_point() else h.float()
        th, tw = self.size
        if self.crop:
            height, width = h.shape[-2], h.shape[-1]
            ch = max(min(height, int(float(width * th) / tw)), 1)
            cw = max(min(width, int(float(height * tw) / th)), 1)
            h = h[..., int(float(height - ch) / 2):int(float(height - ch) / 2) + ch,
                  int(float(width - cw) / 2):int(float(width - cw) / 2) + cw]
        elif self.pad:
            height, width = h.shape[-2], h.shape[-1]
            top = int(float(max(height, int(float(width * th) / tw)) - height) / 2)
            left = int(float(max(width, int(float(height * tw) / th)) - width) / 2)
            h = torch.nn.functional.pad(h, (left, left, top, top), value=self.fill)
        y = resize_image(h, self.size, self.interpolation, self.antialias, self.cubic)
        return from_channels_first(y, self.channels_last)


class CenterCrop(_Single):
    """The centred window; an image smaller than it on either side is Keras's smart_resize: cropped
    to the target's aspect ratio, then resized bilinearly."""

    keeps_mask = False

    def __init__(self, height: int, width: int, channels_last: bool):
        super().__init__()
        self.height, self.width, self.channels_last = height, width, channels_last
        self.smart_resize = Resizing(height, width, "bilinear", True, channels_last)

    def apply(self, x):
        h_axis = x.dim() - 3 if self.channels_last else x.dim() - 2
        h, w = x.shape[h_axis], x.shape[h_axis + 1]
        if h < self.height or w < self.width:
            return self.smart_resize.apply(x)
        return x.narrow(h_axis, (h - self.height) // 2, self.height).narrow(h_axis + 1, (w - self.width) // 2, self.width)


def _numbers(cfg, ctx, key: str, default: float) -> torch.Tensor:
    value = cfg.get(key, default)
    value = default if value is None else value
    array = np.asarray(value if isinstance(value, list) else [value], dtype=object)
    if array.ndim != 1 or not 1 <= array.size <= MAX_SIZE or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in array):
        raise ctx.error(f"config {key}={str(value)[:60]!r}; expected a number or a list of numbers")
    out = torch.tensor([float(v) for v in array], dtype=ctx.dtype)
    return out if isinstance(value, list) else out[0]


@builder(*AUGMENTATION, weights=False)
def build_augmentation(cfg, ctx):
    if ctx.spec.class_name == "RandomCrop" and ctx.keras_major < 3:
        v = Values(cfg, ctx)
        return Keras2RandomCrop(v.int("height", lo=1), v.int("width", lo=1), "bilinear", True, True)
    return Augmentation(ctx.spec.class_name)


@builder("Rescaling", weights=False)
def build_rescaling(cfg, ctx):
    return without_mask_in_keras2(Rescaling(_numbers(cfg, ctx, "scale", 1.0), _numbers(cfg, ctx, "offset", 0.0)), ctx)


def _normalization_has_weights(cfg) -> bool:
    return cfg.get("mean") is None  # adapted: mean, variance and count are weights; given: in the config


@builder("Normalization", weights=_normalization_has_weights)
def build_normalization(cfg, ctx):
    axes = [] if "axis" in cfg and cfg["axis"] is None else Values(cfg, ctx).axes()  # None: no axis kept
    invert = Values(cfg, ctx).bool("invert", False)
    adapted = cfg.get("mean") is None
    if not adapted:
        mean = np.asarray(cfg.get("mean"), dtype=np.float64)
        variance = np.asarray(cfg.get("variance"), dtype=np.float64)
        if mean.shape != variance.shape or mean.size > MAX_SIZE or not np.all(np.isfinite(mean)) or \
                not np.all(np.isfinite(variance)):
            raise ctx.error("config mean and variance must be finite numbers of one shape")
    else:
        (w,) = ctx.weights.take([("", 3)])
        mean, variance, count = (np.asarray(a) for a in w)
        if mean.shape != variance.shape or mean.ndim != len(axes) or count.size != 1:
            raise ctx.error(f"Normalization weights have shapes {[mean.shape, variance.shape, count.shape]}; "
                            f"expected mean and variance of {len(axes)} axes and a count")
    standardize = Standardize(torch.as_tensor(mean, dtype=ctx.dtype), torch.as_tensor(variance, dtype=ctx.dtype), axes,
                              invert, adapted)
    return without_mask_in_keras2(standardize, ctx)


@builder("CenterCrop", weights=False)
def build_center_crop(cfg, ctx):
    v = Values(cfg, ctx)
    return CenterCrop(v.int("height", lo=1), v.int("width", lo=1), channels_last_format(cfg, ctx))


def encode_categorical(indices: torch.Tensor, mode: str, depth: int, dtype: torch.dtype) -> torch.Tensor:
    """keras.src.utils.numerical_utils.encode_categorical_inputs: int, one_hot (a last axis of 1
    dropped), multi_hot and count (over axis 1, or 0 for a vector); negative indices encode as
    no class, indices of `depth` or more are an error."""
    if mode == "int":
        return indices.to(dtype)
    if indices.dim() == 0:
        indices = indices.unsqueeze(-1)
    if mode == "one_hot" and indices.dim() > 1 and indices.shape[-1] == 1:
        indices = indices.squeeze(-1)
    indices = indices.long()
    # (checked in eager calls; an exported program's one_hot refuses such an index itself)
    if not (torch.compiler.is_compiling() or torch.compiler.is_exporting()) and bool((indices >= depth).any()):
        raise ValueError(f"category indices must be below {depth}; got {int(indices.max())}")
    hot = torch.nn.functional.one_hot(indices.clamp(min=0), depth).to(dtype) * (indices >= 0).unsqueeze(-1).to(dtype)
    if mode == "one_hot":
        return hot
    axis = 1 if indices.dim() > 1 else 0
    return hot.amax(dim=axis) if mode == "multi_hot" else hot.sum(dim=axis)


class Discretization(_Single):
    keeps_mask = False

    def __init__(self, boundaries: torch.Tensor, mode: str, dtype: torch.dtype):
        super().__init__()
        self.register_buffer("boundaries", boundaries)
        self.mode, self.dtype = mode, dtype

    def apply(self, x):  # numpy.digitize: the bin i with boundaries[i - 1] <= x < boundaries[i]
        indices = torch.bucketize(x.to(self.boundaries.dtype), self.boundaries, right=True)
        return encode_categorical(indices, self.mode, self.boundaries.numel() + 1, self.dtype)


class CategoryEncoding(_Single):
    keeps_mask = False

    def __init__(self, num_tokens: int, mode: str, dtype: torch.dtype):
        super().__init__()
        self.num_tokens, self.mode, self.dtype = num_tokens, mode, dtype

    def apply(self, x):
        return encode_categorical(x, self.mode, self.num_tokens, self.dtype)


_MODES = ("int", "one_hot", "multi_hot", "count")


def _output_dtype(ctx, mode: str, integer: torch.dtype) -> torch.dtype:
    return integer if mode == "int" else ctx.dtype


# Where an adapted lookup layer's vocabulary is missing (the .keras archive's assets hold it).
NO_VOCABULARY = ("is neither in its config nor in the file (a legacy .h5 and a .weights.h5 keep no assets, and a "
                 "TensorFlow SavedModel keeps an adapted one only inside its graph: load the .keras file, or pass it "
                 "as architecture=)")


def lookup_counts_dtype(ctx, mode: str) -> torch.dtype:
    """The dtype of a lookup layer's encoded rows (IntegerLookup, StringLookup, TextVectorization):
    Keras 3 encodes one_hot / multi_hot / count in int64, index_lookup's value dtype; tf.keras,
    and tf_idf in both, in the layer's floating dtype."""
    return torch.int64 if ctx.keras_major >= 3 and mode in ("one_hot", "multi_hot", "count") else ctx.dtype


def _hash_int_dtype(cfg) -> torch.dtype:
    """The bins' dtype of Hashing / HashedCrossing in int mode: the config's "int32" or "int64"
    (Keras casts its output to the layer's dtype), int64 by default."""
    return torch.int32 if dtype_name(cfg.get("dtype")) == "int32" else torch.int64


def _not_sparse(cfg, ctx):
    if Values(cfg, ctx).bool("sparse", False):
        raise ctx.error(f"{ctx.spec.class_name} sparse=True is not supported (dense outputs only)")


@builder("Discretization", weights=False)
def build_discretization(cfg, ctx):
    _not_sparse(cfg, ctx)
    boundaries = cfg.get("bin_boundaries")
    if not isinstance(boundaries, list) or not 1 <= len(boundaries) <= MAX_SIZE or not all(
            isinstance(b, (int, float)) and not isinstance(b, bool) and np.isfinite(b) for b in boundaries) or \
            any(a > b for a, b in zip(boundaries, boundaries[1:])):
        raise ctx.error(f"config bin_boundaries={str(boundaries)[:60]!r}; expected a sorted list of numbers (an "
                        "adapted layer stores them)")
    mode = Values(cfg, ctx).str("output_mode", "int", _MODES)
    # (bins: int32 in Keras 3, int64 in tf.keras)
    return Discretization(torch.tensor([float(b) for b in boundaries], dtype=torch.float64), mode,
                          _output_dtype(ctx, mode, torch.int32 if ctx.keras_major >= 3 else torch.int64))


@builder("CategoryEncoding", weights=False)
def build_category_encoding(cfg, ctx):
    _not_sparse(cfg, ctx)
    v = Values(cfg, ctx)
    return CategoryEncoding(v.int("num_tokens", lo=1), v.str("output_mode", "multi_hot", _MODES[1:]), ctx.dtype)


@builder("Resizing", weights=False)
def build_resizing(cfg, ctx):
    v = Values(cfg, ctx)
    return resizing_of(cfg, ctx, v.int("height", lo=1), v.int("width", lo=1), "Resizing")


def resizing_of(cfg, ctx, height: int, width: int, what: str) -> Resizing:
    """The Resizing module of a Resizing layer's or a recorded image resize's config (they share
    Keras's interpolation, crop, padding and antialias options)."""
    v = Values(cfg, ctx)
    interpolation = v.str("interpolation", "bilinear")
    if interpolation not in ("bilinear", "nearest", "bicubic"):
        raise ctx.error(f"{what} interpolation={interpolation[:40]!r} is not supported (bilinear, bicubic, nearest; "
                        "Keras's torch backend refuses the Lanczos filters too)")
    return Resizing(height, width, interpolation, v.bool("crop_to_aspect_ratio", False), channels_last_format(cfg, ctx),
                    *aspect_padding(cfg, ctx), antialias=v.bool("antialias", False), cubic=cubic_of(ctx))


def aspect_padding(cfg, ctx):
    """(pad, fill) of Keras's resize: pad_to_aspect_ratio and its constant fill_value."""
    v = Values(cfg, ctx)
    pad = v.bool("pad_to_aspect_ratio", False)
    if pad and v.str("fill_mode", "constant") != "constant":
        raise ctx.error("pad_to_aspect_ratio with fill_mode other than 'constant' (Keras supports only that)")
    return pad, v.float("fill_value", 0.0) if pad else 0.0


class Keras2RandomCrop(Resizing):
    """tf.keras 2's RandomCrop at inference: the largest centred crop of the target's aspect
    ratio, resized bilinearly to (height, width) (its smart_resize). Keras 3's is the identity."""

    class_name = "RandomCrop"

    def apply(self, x):
        _refuse_training(self)
        return super().apply(x)


class IntegerLookup(_Single):
    """keras.layers.IntegerLookup: a value's index in the vocabulary after the special tokens (in
    output_mode "int" the mask token, if any, at 0; then num_oov_indices out-of-vocabulary indices,
    a value outside the vocabulary taking the one at its value modulo their count, or at its
    FarmHash with oov_method="farmhash", its SipHash keyed by a salt), then encoded as output_mode says (one_hot, multi_hot,
    count over the vocabulary size, or max_tokens with pad_to_max_tokens); with invert=True, an
    index's value (the OOV token for OOV and unknown indices). A value outside the vocabulary with
    num_oov_indices=0, where Keras asserts, gives TensorFlow's table default, -1."""

    keeps_mask = False

    def __init__(self, vocabulary: torch.Tensor, num_oov: int, mask_token, oov_token: int, invert: bool,
                 farmhash: bool = False, mode: str = "int", depth: Optional[int] = None,
                 counts_dtype: torch.dtype = torch.float32, salt: Optional[tuple] = None):
        super().__init__()
        order = torch.argsort(vocabulary)
        # (not in the state_dict: the vocabulary is the file's, like a config value, not a weight)
        self.register_buffer("vocabulary", vocabulary, persistent=False)
        self.register_buffer("sorted_values", vocabulary[order], persistent=False)
        self.register_buffer("sorted_index", order, persistent=False)
        self.num_oov, self.mask_token, self.oov_token, self.invert = num_oov, mask_token, oov_token, invert
        self.farmhash, self.mode, self.counts_dtype, self.salt = farmhash, mode, counts_dtype, salt
        self.masked = 1 if mask_token is not None and mode == "int" else 0
        self.first = self.masked + num_oov
        self.depth = depth if depth is not None else self.first + vocabulary.numel()

    def asset_lines(self):
        """The vocabulary asset Keras writes (the special tokens it indexes, then the values), for
        save_keras."""
        special = [self.mask_token] * self.masked + [self.oov_token] * self.num_oov
        return [str(v) for v in special + self.vocabulary.tolist()]

    def apply(self, x):
        x = x.long()
        if self.invert:
            i = x - self.first
            known = (i >= 0) & (i < self.vocabulary.numel())
            y = torch.full_like(x, self.oov_token)
            if self.vocabulary.numel():
                y = torch.where(known, self.vocabulary[i.clamp(0, self.vocabulary.numel() - 1)], y)
            return torch.where(x == 0, torch.full_like(x, self.mask_token), y) if self.masked else y
        n = self.sorted_values.numel()
        if n:
            pos = torch.searchsorted(self.sorted_values, x).clamp(max=n - 1)
            found, index = self.sorted_values[pos] == x, self.sorted_index[pos]
        else:  # an empty vocabulary: every value is out of it
            found, index = torch.zeros_like(x, dtype=torch.bool), torch.zeros_like(x)
        if self.num_oov == 0:  # TensorFlow's table default (where Keras asserts)
            oov = torch.full_like(x, -1 - self.masked)
        elif self.num_oov == 1:
            oov = torch.zeros_like(x)
        elif self.farmhash:
            oov = _unsigned_mod(fingerprint64(x) if self.salt is None else integer_siphash(x, self.salt), self.num_oov)
        else:
            oov = torch.remainder(x, self.num_oov)
        y = torch.where(found, index + self.first, oov + self.masked)
        if self.masked:
            y = torch.where(x == self.mask_token, torch.zeros_like(x), y)
        return y if self.mode == "int" else encode_categorical(y, self.mode, self.depth, self.counts_dtype)


@builder("IntegerLookup", weights=False)
def build_integer_lookup(cfg, ctx):
    _not_sparse(cfg, ctx)
    v = Values(cfg, ctx)
    num_oov = v.int("num_oov_indices", 1, lo=0, hi=1 << 16)
    big = 1 << 62
    mask_token = v.int("mask_token", None, lo=-big, hi=big)
    oov_token = v.int("oov_token", -1, lo=-big, hi=big)
    invert = v.bool("invert", False)
    mode = v.str("output_mode", "int")
    if mode not in _MODES:
        raise ctx.error(f"IntegerLookup output_mode={mode[:20]!r} is not supported ({', '.join(_MODES)}; not tf_idf)")
    if mode != "int" and (invert or mask_token is not None):
        raise ctx.error("IntegerLookup with invert or a mask_token is supported in output_mode 'int' only")
    oov_method = v.str("oov_method", "floormod", ("floormod", "farmhash"))
    salt = salt_key(cfg, ctx)
    if salt is not None and oov_method != "farmhash":
        raise ctx.error(f"IntegerLookup salt={cfg.get('salt')}; Keras takes a salt with oov_method='farmhash' only")
    depth = v.int("max_tokens", lo=1) if v.bool("pad_to_max_tokens", False) and mode != "int" else None
    vocabulary = cfg.get("vocabulary")
    if vocabulary is None:  # adapted: the .keras file's asset, the special tokens first
        lines = ctx.weights.vocabulary()
        if lines is None:
            raise ctx.error(f"IntegerLookup's vocabulary {NO_VOCABULARY}")
        lines = [t for t in lines if t.strip() != ""]
        special = (1 if mask_token is not None and mode == "int" else 0) + num_oov
        if len(lines) < special:
            raise ctx.error(f"IntegerLookup's vocabulary asset has {len(lines)} lines; its special tokens alone are "
                            f"{special}")
        try:
            vocabulary = [int(t) for t in lines[special:]]
        except ValueError:
            raise ctx.error("IntegerLookup's vocabulary asset holds a line that is not an integer") from None
    if isinstance(vocabulary, str):
        raise ctx.error("IntegerLookup's vocabulary is a file path in the config; the file is not part of the model")
    if isinstance(vocabulary, list):  # Keras drops leading special tokens given with the vocabulary
        special = ([mask_token] if mask_token is not None and mode == "int" else []) + [oov_token] * num_oov
        if special and vocabulary[:len(special)] == special:
            vocabulary = vocabulary[len(special):]
    values = vocabulary
    if not isinstance(values, list) or len(values) > MAX_SIZE or not all(
            isinstance(t, int) and not isinstance(t, bool) and -big <= t <= big for t in values):
        raise ctx.error(f"IntegerLookup vocabulary {str(vocabulary)[:60]!r} is not a list of integers")
    if len(set(values)) != len(values):
        raise ctx.error("IntegerLookup vocabulary holds a value twice")
    return IntegerLookup(torch.tensor(values, dtype=torch.int64), num_oov, mask_token, oov_token, invert,
                         farmhash=oov_method == "farmhash", mode=mode, depth=depth,
                         counts_dtype=lookup_counts_dtype(ctx, mode), salt=salt)


# ---------------------------------------------------------------------------------------------
# Hashing: TensorFlow's to_hash_bucket_fast of each value's decimal string, i.e. FarmHash's
# Fingerprint64 (farmhashna) modulo the bin count, computed on int64 tensors (wrapping arithmetic
# as the unsigned 64-bit arithmetic of the reference; right shifts made logical by masking).
# Decimal strings of int64 values are 1 to 20 bytes: the 0-16 and 17-32 byte cases.
# ---------------------------------------------------------------------------------------------
def _u64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


_K0, _K1, _K2 = _u64(0xc3a5c85c97cb3127), _u64(0xb492b66fbe98f273), _u64(0x9ae16a3b2f90404f)


def _shr(x, s: int):
    return (x >> s) & ((1 << (64 - s)) - 1)


def _rotr(x, s: int):
    return _shr(x, s) | (x << (64 - s))


def _hash16(u, v, mul):
    a = (u ^ v) * mul
    a = a ^ _shr(a, 47)
    b = (v ^ a) * mul
    b = b ^ _shr(b, 47)
    return b * mul


def _decimal_bytes(x: torch.Tensor):
    """[N] int64 -> ([N, 20] bytes of each value's decimal string, zero-padded; [N] lengths)."""
    q, digits, count = x.clone(), [], torch.zeros_like(x)
    for _ in range(19):  # int64 has at most 19 digits; -2^63 is reached without negation
        # |fmod(q, 10)| and q truncated towards zero, from floor division (which torch's ONNX
        # exporter keeps in integers; its truncating division goes through floats)
        r = torch.remainder(q, 10)
        up = (q < 0) & (r != 0)
        digits.append(torch.where(up, 10 - r, r))
        q = torch.floor_divide(q, 10) + up.long()
        count = count + (q != 0).long()
    digits = torch.stack(digits, dim=1)            # least significant first
    count = count + 1
    negative = (x < 0).long()
    length = count + negative
    j = torch.arange(20, device=x.device).unsqueeze(0)
    k = (length.unsqueeze(1) - 1 - j)               # digit index of position j
    valid = (k >= 0) & (k < count.unsqueeze(1))
    byte = torch.where(valid, 48 + torch.gather(digits, 1, k.clamp(0, 18)), torch.zeros_like(k))
    byte = torch.where((j == 0) & (negative.unsqueeze(1) == 1), torch.full_like(byte, 45), byte)
    return byte, length


def _fetch(byte, offset, width: int):
    """Little-endian `width`-byte words at per-row offsets."""
    idx = (offset.clamp(min=0).unsqueeze(1) + torch.arange(width, device=byte.device)).clamp(max=byte.shape[1] - 1)
    parts = torch.gather(byte, 1, idx)
    word = torch.zeros_like(offset)
    for i in range(width):
        word = word | (parts[:, i] << (8 * i))
    return word


def fingerprint64(x: torch.Tensor) -> torch.Tensor:
    """FarmHash Fingerprint64 of each int64 value's decimal string (as int64 bits)."""
    byte, n = _decimal_bytes(x.reshape(-1).long())
    mul = _K2 + n * 2
    first8 = _fetch(byte, torch.zeros_like(n), 8)
    # 8 to 16 bytes
    a = first8 + _K2
    b = _fetch(byte, n - 8, 8)
    h8 = _hash16(_rotr(b, 37) * mul + a, (_rotr(a, 25) + b) * mul, mul)
    # 4 to 7 bytes
    h4 = _hash16(n + (_fetch(byte, torch.zeros_like(n), 4) << 3), _fetch(byte, n - 4, 4), mul)
    # 1 to 3 bytes
    c0, c1, c2 = byte[:, 0], torch.gather(byte, 1, (n >> 1).unsqueeze(1)).squeeze(1), \
        torch.gather(byte, 1, (n - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    y, z = c0 + (c1 << 8), n + (c2 << 2)
    h1 = y * _K2 ^ z * _K0
    h1 = (h1 ^ _shr(h1, 47)) * _K2
    # 17 to 20 bytes
    a = first8 * _K1
    b = _fetch(byte, torch.full_like(n, 8), 8)
    c = _fetch(byte, n - 8, 8) * mul
    d = _fetch(byte, n - 16, 8) * _K2
    h17 = _hash16(_rotr(a + b, 43) + _rotr(c, 30) + d, a + _rotr(b + _K2, 18) + c, mul)
    h = torch.where(n > 16, h17, torch.where(n >= 8, h8, torch.where(n >= 4, h4, h1)))
    return h.reshape(x.shape)


# SipHash-2-4 (TensorFlow's to_hash_bucket_strong, which a salted Hashing runs: the salt is the
# 128-bit key, two unsigned 64-bit words) of byte rows, vectorised over the rows.
_SIP = tuple(_u64(c) for c in (0x736f6d6570736575, 0x646f72616e646f6d, 0x6c7967656e657261, 0x7465646279746573))


def _rotl(x, s: int):
    return (x << s) | _shr(x, 64 - s)


def _sip_rounds(v0, v1, v2, v3, count: int):
    for _ in range(count):
        v0 = v0 + v1
        v1 = _rotl(v1, 13) ^ v0
        v0 = _rotl(v0, 32)
        v2 = v2 + v3
        v3 = _rotl(v3, 16) ^ v2
        v0 = v0 + v3
        v3 = _rotl(v3, 21) ^ v0
        v2 = v2 + v1
        v1 = _rotl(v1, 17) ^ v2
        v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash24(byte: torch.Tensor, n: torch.Tensor, key) -> torch.Tensor:
    """SipHash-2-4 under key (k0, k1) of each row's first n bytes ([N, L] byte values, zero past
    n; [N] lengths), as int64 bits."""
    byte = torch.nn.functional.pad(byte, (0, 8))  # (the last block's tail reads zeros past n)
    k0, k1 = (_u64(k) for k in key)
    v0, v1, v2, v3 = (torch.full_like(n, _u64((k ^ c) & ((1 << 64) - 1)))
                      for k, c in zip((k0, k1, k0, k1), _SIP))
    for j in range(byte.shape[1] // 8 - 1):  # the whole 8-byte words
        m = _fetch(byte, torch.full_like(n, 8 * j), 8)
        u0, u1, u2, u3 = _sip_rounds(v0, v1, v2, v3 ^ m, 2)
        whole = j < torch.div(n, 8, rounding_mode="floor")
        v0, v1, v2, v3 = (torch.where(whole, a, b) for a, b in ((u0 ^ m, v0), (u1, v1), (u2, v2), (u3, v3)))
    tail = _fetch(byte, torch.div(n, 8, rounding_mode="floor") * 8, 8) | ((n & 255) << 56)
    v0, v1, v2, v3 = _sip_rounds(v0, v1, v2, v3 ^ tail, 2)
    v0, v1, v2, v3 = _sip_rounds(v0 ^ tail, v1, v2 ^ 0xFF, v3, 4)
    return v0 ^ v1 ^ v2 ^ v3


def string_siphash(strings: np.ndarray, key) -> torch.Tensor:
    """siphash24 of each string's UTF-8 bytes, as an int64 tensor of the strings' shape: the
    strings hashed together in groups of like length (their 8-byte word counts within a power of
    two), so that no group is padded to more than about twice its own bytes."""
    encoded = [s.encode("utf-8") for s in strings.reshape(-1)]
    groups: dict = {}
    for i, e in enumerate(encoded):
        groups.setdefault((len(e) // 8).bit_length(), []).append(i)
    out = torch.empty(len(encoded), dtype=torch.int64)
    for rows in groups.values():
        lengths = [len(encoded[i]) for i in rows]
        byte = np.zeros((len(rows), max(max(lengths), 1)), dtype=np.int64)
        for k, i in enumerate(rows):
            byte[k, :lengths[k]] = np.frombuffer(encoded[i], dtype=np.uint8)
        out[torch.tensor(rows)] = siphash24(torch.from_numpy(byte), torch.tensor(lengths, dtype=torch.int64), key)
    return out.reshape(strings.shape)


def integer_siphash(x: torch.Tensor, key) -> torch.Tensor:
    """siphash24 of each int64 value's decimal string (TensorFlow's as_string), as int64 bits."""
    byte, n = _decimal_bytes(x.reshape(-1).long())
    return siphash24(byte, n, key).reshape(x.shape)


def salt_key(cfg: dict, ctx) -> Optional[tuple]:
    """The config's salt as SipHash's key (k0, k1): one word for both, or two, as Keras's
    constructors read it; None without one."""
    salt = cfg.get("salt")
    if salt is None:
        return None
    words = salt if isinstance(salt, list) else [salt, salt]
    if len(words) != 2 or not all(isinstance(w, int) and not isinstance(w, bool) and -(1 << 63) <= w < 1 << 63
                                  for w in words):  # (TensorFlow takes the key's words as int64)
        raise ctx.error(f"config salt={str(salt)[:60]}; expected a 64-bit integer or two of them")
    return tuple(words)


def _unsigned_mod(h: torch.Tensor, bins: int) -> torch.Tensor:
    """h's 64 bits read as an unsigned number, modulo bins (< 2^63): h + 2^64 where h < 0."""
    r, wrap = torch.remainder(h, bins), (1 << 64) % bins
    return torch.where(h < 0, torch.where(r >= bins - wrap, r - (bins - wrap), r + wrap), r)


class Hashing(_Single):
    """keras.layers.Hashing: TensorFlow's to_hash_bucket_fast of each value (integers and floats
    cast to int64 as their decimal strings, strings as their UTF-8 bytes) modulo the bins, or with
    a salt its to_hash_bucket_strong (SipHash-2-4 keyed by the salt's two words); with a
    mask_value, that value's bin is 0 and the others' are one on. String inputs are numpy arrays
    of str or bytes, or nested lists of them; the output is made on the module's device."""

    keeps_mask = False

    def __init__(self, num_bins: int, mask_value, mode: str, dtype: torch.dtype = torch.int64, salt=None):
        super().__init__()
        self.num_bins, self.mask_value, self.mode, self.dtype = num_bins, mask_value, mode, dtype
        self.salt = salt  # (k0, k1), or None
        self.register_buffer("anchor", torch.zeros(0), persistent=False)  # (the device of a string input's output)

    def apply(self, x):
        bins = self.num_bins - 1 if self.mask_value is not None and self.num_bins > 1 else self.num_bins
        if not isinstance(x, torch.Tensor):
            strings = strings_of(x, "Hashing")
            if bins != self.num_bins and not isinstance(self.mask_value, str):
                raise TypeError(f"Hashing with the integer mask_value {self.mask_value} takes integers; got strings")
            masked = torch.from_numpy(np.asarray(strings == self.mask_value, dtype=bool)) if bins != self.num_bins else None
            hashed = string_fingerprints(strings) if self.salt is None else string_siphash(strings, self.salt)
            y = _unsigned_mod(hashed, bins)
        else:
            if bins != self.num_bins and isinstance(self.mask_value, str):
                raise TypeError(f"Hashing with the string mask_value {self.mask_value!r} takes strings; got a tensor")
            masked = x == self.mask_value if bins != self.num_bins else None  # (before the cast, as Keras)
            if x.is_floating_point():
                x = x.long()  # TensorFlow casts floats to int64 before hashing
            y = _unsigned_mod(fingerprint64(x) if self.salt is None else integer_siphash(x, self.salt), bins)
        if masked is not None:
            y = torch.where(masked.to(y.device), torch.zeros_like(y), y + 1)
        if not isinstance(x, torch.Tensor):
            y = y.to(self.anchor.device)
        return encode_categorical(y, self.mode, self.num_bins, self.dtype)


@builder("Hashing", weights=False)
def build_hashing(cfg, ctx):
    _not_sparse(cfg, ctx)
    v = Values(cfg, ctx)
    salt = salt_key(cfg, ctx)
    mask_value = cfg.get("mask_value")
    if mask_value is not None and not isinstance(mask_value, str):
        mask_value = v.int("mask_value", lo=-(1 << 62), hi=1 << 62)
    mode = v.str("output_mode", "int", _MODES)
    # (bin indices up to 2^62; an encoded output has one column per bin)
    return Hashing(v.int("num_bins", lo=1, hi=1 << 62 if mode == "int" else MAX_SIZE), mask_value, mode,
                   _output_dtype(ctx, mode, _hash_int_dtype(cfg)), salt)


# HashedCrossing: tf.sparse.cross_hashed of scalar features, i.e. TensorFlow's HashCrosser: from
# the default hash key, each feature in turn folded in by FingerprintCat64 (an integer feature as
# its int64 value, a string as its FarmHash Fingerprint64), the result modulo the bins read as
# unsigned (num_bins 0: modulo 2^63 - 1).
_CROSS_KEY = 0xDECAFCAFFE
_CAT_MUL = _u64(0xc6a4a7935bd1e995)


def _fingerprint_cat64(fp1: torch.Tensor, fp2: torch.Tensor) -> torch.Tensor:
    m = fp2 * _CAT_MUL
    r = (fp1 ^ _CAT_MUL) ^ ((m ^ _shr(m, 47)) * _CAT_MUL)
    r = r * _CAT_MUL
    r = (r ^ _shr(r, 47)) * _CAT_MUL
    return r ^ _shr(r, 47)


class HashedCrossing(nn.Module):
    """keras.layers.HashedCrossing over two or more features of equal shape, each (), (batch,)
    or (batch, 1): integers (tensors or numpy arrays), or strings (numpy arrays of str or bytes, or
    lists of them). Output: the cross's bin (int64, or the config's int32; the features' shape) or
    its one-hot row, on the first integer feature's device (the module's where all are strings)."""

    def __init__(self, num_bins: int, mode: str, dtype: torch.dtype):
        super().__init__()
        self.num_bins, self.mode, self.dtype = num_bins, mode, dtype
        self.register_buffer("anchor", torch.zeros(0), persistent=False)  # (the device of the output)

    @staticmethod
    def _feature(i: int, x, device) -> torch.Tensor:
        if isinstance(x, np.ndarray) and x.dtype.kind in "biufc":
            x = torch.from_numpy(np.array(x, dtype=x.dtype.newbyteorder("=")))
        if isinstance(x, torch.Tensor):
            if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
                raise TypeError(f"HashedCrossing input {i} must hold integers or strings; got {x.dtype}")
            return x.long().to(device)
        return string_fingerprints(strings_of(x, f"HashedCrossing input {i}")).to(device)

    def forward(self, inputs, masks):
        if len(inputs) < 2:
            raise ValueError(f"HashedCrossing crosses two or more features; got {len(inputs)}")
        # (the output on the first integer feature's device, else the module's)
        device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), self.anchor.device)
        features = [self._feature(i, x, device) for i, x in enumerate(inputs)]
        shape = tuple(features[0].shape)
        if len(shape) > 2 or (len(shape) == 2 and shape[1] != 1):
            raise ValueError(f"HashedCrossing inputs must have shape (), (batch,) or (batch, 1); got {shape}")
        for i, f in enumerate(features[1:], 1):
            if tuple(f.shape) != shape:
                raise ValueError(f"HashedCrossing input {i} has shape {tuple(f.shape)}; input 0 has {shape}")
        h = torch.full(shape, _CROSS_KEY, dtype=torch.int64, device=device)
        for f in features:
            h = _fingerprint_cat64(h, f)
        y = _unsigned_mod(h, self.num_bins if self.num_bins > 0 else (1 << 63) - 1)
        return [encode_categorical(y, self.mode, self.num_bins, self.dtype)], [None]

    def extra_repr(self):
        return f"num_bins={self.num_bins}, output_mode={self.mode!r}"


@builder("HashedCrossing", weights=False)
def build_hashed_crossing(cfg, ctx):
    _not_sparse(cfg, ctx)
    v = Values(cfg, ctx)
    mode = v.str("output_mode", "int", ("int", "one_hot"))
    bins = v.int("num_bins", lo=0 if mode == "int" else 1, hi=(1 << 63) - 1 if mode == "int" else MAX_SIZE)
    return HashedCrossing(bins, mode, _output_dtype(ctx, mode, _hash_int_dtype(cfg)))


class AutoContrast(_Single):
    """keras.layers.AutoContrast (applied at inference too): each image's values stretched to the
    value range from its minimum and maximum over axes 1 and 2 (height and width of a
    channels-last batch), as Keras computes it in [0, 255]; NaN results keep the input value."""

    keeps_mask = False

    def __init__(self, low: float, high: float):
        super().__init__()
        self.low, self.high = low, high

    def apply(self, x):
        original = x
        x = x.float() if not x.is_floating_point() else x
        full = (self.low, self.high) == (0.0, 255.0)
        if not full:
            x = (x - self.low) / (self.high - self.low) * 255.0
        lo, hi = x.amin(dim=(1, 2), keepdim=True), x.amax(dim=(1, 2), keepdim=True)
        scale = 255.0 / (hi - lo)
        y = torch.clamp(x * scale + (-lo * scale), 0.0, 255.0)
        if not full:
            y = y / 255.0 * (self.high - self.low) + self.low
        return torch.where(torch.isnan(y), original.to(y.dtype), y)


@builder("AutoContrast", weights=False)
def build_auto_contrast(cfg, ctx):
    value_range = cfg.get("value_range", [0, 255])
    if not isinstance(value_range, list) or len(value_range) != 2 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in value_range) or \
            value_range[0] >= value_range[1]:
        raise ctx.error(f"AutoContrast value_range={str(value_range)[:40]}; expected [low, high] with low < high")
    return AutoContrast(float(value_range[0]), float(value_range[1]))


def _symmetric_rows(n: int, total: int, device) -> torch.Tensor:
    """Indices of rows 0..total-1 of a length-n axis padded at its end in numpy's "symmetric"
    mode (mirrored with the edge repeated, as often as the padding needs)."""
    i = torch.arange(total, device=device) % (2 * n)
    return torch.where(i < n, i, 2 * n - 1 - i)


class HistogramEqualization(_Single):
    """keras.layers.ContrastLimitedAdaptiveHistogramEqualization (applied at inference too): each
    image's channels in [0, 255] cut into a grid of tiles (the image padded at its bottom and right
    edges to whole tiles), a 256-bin histogram per tile and channel, clipped at clip_limit times
    the tile's mean bin and the excess spread evenly, its cumulative sum scaled to [0, 255], and
    each pixel's value looked up in the four nearest tiles' tables and interpolated bilinearly, in
    float32 as Keras computes it. Two steps differ between Keras's backends, and `backend` says
    whose are taken (as for bicubic resizes: shape.cubic_of; a .keras file names no backend, and
    its model is taken as the torch backend's): the torch backend pads by repeating
    the edge and counts its histograms in integers, so the clip limit is truncated to an integer;
    TensorFlow and JAX mirror the edge (numpy's "symmetric") and clip at the exact limit."""

    keeps_mask = False

    def __init__(self, value_range, clip_limit: float, grid, channels_last: bool, backend: Optional[str] = None):
        super().__init__()
        self.value_range, self.clip_limit, self.grid = tuple(value_range), clip_limit, tuple(grid)
        self.channels_last, self.torch_backend = channels_last, backend not in ("tensorflow", "jax")

    def _rescale(self, x, source, target):
        if source == target:
            return x
        (s0, s1), (t0, t1) = np.float32(source), np.float32(target)  # Keras's float32 bounds
        return (x.float() - float(s0)) / float(s1 - s0) * float(t1 - t0) + float(t0)

    def apply(self, x):
        dtype, unbatched = x.dtype, x.dim() == 3
        x = x if x.is_floating_point() else x.float()
        if not self.channels_last:
            x = x.movedim(-3, -1)
        x = self._rescale(x[None] if unbatched else x, self.value_range, (0.0, 255.0))
        b, h, w, c = x.shape
        (gh, gw), device = self.grid, x.device
        th, tw = -(-h // gh), -(-w // gw)
        hp, wp = th * gh, tw * gw
        if (hp, wp) != (h, w):
            if self.torch_backend:
                x = x[:, torch.arange(hp, device=device).clamp(max=h - 1)]
                x = x[:, :, torch.arange(wp, device=device).clamp(max=w - 1)]
            else:
                x = x[:, _symmetric_rows(h, hp, device)][:, :, _symmetric_rows(w, wp, device)]
        tiles = x.reshape(b, gh, th, gw, tw, c).permute(0, 1, 3, 5, 2, 4).reshape(b, gh, gw, c, th * tw)
        bins = tiles.to(torch.int32).clamp(0, 255).long()
        hist = torch.zeros(b, gh, gw, c, 256, device=device).scatter_add_(
            -1, bins, torch.ones((), device=device).expand(bins.shape))
        if self.clip_limit > 0:
            limit = self.clip_limit * (th * tw) / 256.0
            limit = float(int(limit) if self.torch_backend else np.float32(limit))
            clipped = hist.clamp(0.0, limit)
            hist = clipped + (hist - clipped).sum(-1, keepdim=True) / 256.0
        cdf = hist.cumsum(-1)
        low = cdf.amin(-1, keepdim=True)
        span = float(th * tw) - low
        table = ((cdf - low) * 255.0 / torch.where(span == 0, torch.ones_like(span), span)).clamp(0.0, 255.0)
        # the tile grid with its edge tiles repeated around it: [b, gh + 2, gw + 2, c, 256]
        table = table[:, torch.arange(-1, gh + 1, device=device).clamp(0, gh - 1)]
        table = table[:, :, torch.arange(-1, gw + 1, device=device).clamp(0, gw - 1)]

        def neighbours(size, tile, grid):
            pos = (torch.arange(size, dtype=torch.float32, device=device) - tile / 2.0) / tile + 1.0
            first = pos.floor()
            return first.clamp(0, grid + 1).long(), (first + 1.0).clamp(0, grid + 1).long(), pos - first

        y0, y1, wy = neighbours(hp, th, gh)
        x0, x1, wx = neighbours(wp, tw, gw)
        pixel = x.clamp(0.0, 255.0).to(torch.int32).long()
        bi = torch.arange(b, device=device)[:, None, None, None]
        ci = torch.arange(c, device=device)[None, None, None, :]
        ys, xs = (y0[None, :, None, None], y1[None, :, None, None]), (x0[None, None, :, None], x1[None, None, :, None])
        nw, ne, sw, se = (table[bi, yy, xx, ci, pixel] for yy in ys for xx in xs)
        wx, wy = wx[None, None, :, None], wy[None, :, None, None]
        y = (nw * (1.0 - wx) + ne * wx) * (1.0 - wy) + (sw * (1.0 - wx) + se * wx) * wy
        y = self._rescale(y[:, :h, :w], (0.0, 255.0), self.value_range).to(dtype)
        y = y[0] if unbatched else y
        return y if self.channels_last else y.movedim(-1, -3)

    def extra_repr(self):
        return f"value_range={self.value_range}, clip_limit={self.clip_limit}, tile_grid_size={self.grid}"


@builder("ContrastLimitedAdaptiveHistogramEqualization", weights=False)
def build_histogram_equalization(cfg, ctx):
    v = Values(cfg, ctx)
    value_range, grid = cfg.get("value_range", [0, 255]), cfg.get("tile_grid_size", [8, 8])
    if not isinstance(value_range, list) or len(value_range) != 2 or not all(
            isinstance(e, (int, float)) and not isinstance(e, bool) and np.isfinite(e) for e in value_range) or \
            value_range[0] == value_range[1]:
        raise ctx.error(f"config value_range={str(value_range)[:40]}; expected two different finite numbers")
    if not isinstance(grid, list) or len(grid) != 2:
        raise ctx.error(f"config tile_grid_size={str(grid)[:40]}; expected [height, width]")
    grid = [Values({"tile_grid_size": g}, ctx).int("tile_grid_size", lo=1, hi=256) for g in grid]
    return HistogramEqualization([float(e) for e in value_range], v.float("clip_limit", 4.0), grid,
                                 channels_last_format(cfg, ctx), ctx.backend)


# ---------------------------------------------------------------------------------------------
# FeatureSpace (keras.utils.FeatureSpace): the layers its encoded-features graph holds beside the
# stock preprocessing layers, which Keras 3 records by their module
# ---------------------------------------------------------------------------------------------
_FEATURE_SPACE_MODULE = re.compile(r"keras(\.src)?\.layers\.preprocessing\.feature_space")


class FeatureConcat(nn.Module):
    """FeatureSpace's TFDConcat (output_mode="concat"): its inputs concatenated along `axis`, as
    keras.ops.concatenate (dtypes promoted); a DataLayer, so no mask passes."""

    def __init__(self, axis: int):
        super().__init__()
        self.axis = axis

    def forward(self, inputs, masks):
        return [torch.cat(list(inputs), dim=self.axis)], [None]

    def extra_repr(self):
        return f"axis={self.axis}"


@builder("TFDConcat", "TFDIdentity", weights=False)
def build_feature_space_layer(cfg, ctx):
    """Keras 3's FeatureSpace layers, where the file records their module (legacy .h5 files record
    none, and Keras cannot load them back); a class of one of these names from another module is
    the model's own, and needs a builder."""
    module, name = ctx.spec.module, short_name(ctx.spec.class_name)
    if module and not _FEATURE_SPACE_MODULE.fullmatch(module):
        raise ctx.error(f"layer class {name} of module {module[:80]!r} is not supported (the class of that name "
                        "converted here is keras.utils.FeatureSpace's); a model's own classes can be given builders: "
                        f"load_keras(..., custom_layers={{{name!r}: builder}})")
    if ctx.spec.class_name == "TFDConcat":
        return FeatureConcat(Values(cfg, ctx).int("axis", -1, lo=-8, hi=8))
    module = Identity()
    module.keeps_mask = False
    return module
