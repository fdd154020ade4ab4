"""keras.ops's neural-network, math, linear-algebra and image operations (keras.src.ops.nn,
.math, .linalg, .image) beyond the activations of ops.py: shrinkage and sparse activations,
normalizations, one-hot encodings, moments, pooling, attention, log-sum-exp, top-k, framing,
norms and solves, and the channel reductions of images. NN_OPS maps each class to a builder
(config, context) -> (function, description), as ops_numpy.NUMPY_OPS does."""
from __future__ import annotations

import math
from typing import Callable, Dict

import torch
import torch.nn.functional as F

from .base import channels_last_format, to_channels_first
from .convolution import Convolution
from .op_args import axes_arg, dtype_arg, fixed, floating, one_axis
from .pooling import AdaptivePooling, Pooling
from .preprocessing import resizing_of
from .values import MAX_SIZE, Values, int_tuple

EPSILON = 1e-7  # keras.config.epsilon()


def _number(name: str, default, fn):
    """An activation with one number in its config (Celu alpha, HardShrink threshold, ...)."""
    def build(cfg, ctx):
        value = Values(cfg, ctx).float(name, default)
        return (lambda x: fn(x, value)), f"{name}={value}"
    return build


def _threshold(cfg, ctx):
    v = Values(cfg, ctx)
    t, value = v.float("threshold"), v.float("default_value")
    return (lambda x: F.threshold(x, t, value)), f"threshold={t} default={value}"


def _sparse_plus(x):
    return torch.where(x <= -1, torch.zeros_like(x), torch.where(x < 1, 0.25 * (x + 1) ** 2, x))


def _sparse_sigmoid(x):
    return torch.where(x <= -1, torch.zeros_like(x), torch.where(x >= 1, torch.ones_like(x), 0.5 * (x + 1)))


def _sparsemax(x, axis):
    """Martins and Astudillo's sparsemax along `axis`, computed as Keras computes it."""
    z, _ = torch.sort(x, dim=axis, descending=True)
    cumsum = torch.cumsum(z, dim=axis)
    shape = [1] * x.dim()
    shape[axis] = -1
    r = torch.arange(1, x.shape[axis] + 1, device=x.device, dtype=x.dtype).view(shape)
    support = z - (cumsum - 1) / r > 0
    k = support.sum(dim=axis, keepdim=True)
    tau = (torch.where(support, cumsum, torch.zeros_like(cumsum)).sum(dim=axis, keepdim=True) - 1) / k
    return torch.clamp(x - tau, min=0.0)


def _axis_op(fn, default=-1):
    def build(cfg, ctx):
        axis = one_axis(cfg, ctx, default)
        return (lambda x: fn(x, axis)), f"axis={axis}"
    return build


def _logsumexp(cfg, ctx):
    axis, keepdims = axes_arg(cfg, ctx), Values(cfg, ctx).bool("keepdims", False)

    def logsumexp(x):
        dims = tuple(range(x.dim())) if axis is None else axis
        return torch.logsumexp(floating(x), dim=dims, keepdim=keepdims)
    return logsumexp, f"axis={axis} keepdims={keepdims}"


def _epsilon(cfg, ctx):
    return Values(cfg, ctx).float("epsilon", EPSILON, lo=0.0) if cfg.get("epsilon") is not None else EPSILON


def _normalize(cfg, ctx):
    v = Values(cfg, ctx)
    axis, order, eps = one_axis(cfg, ctx, -1), v.int("order", 2, lo=1, hi=1 << 10), _epsilon(cfg, ctx)

    def normalize(x):
        if order == 2:  # x * rsqrt(sum(x^2)), the factor at most 1 / epsilon
            inv = torch.rsqrt(torch.sum(x * x, dim=axis, keepdim=True))
            return x * torch.clamp(inv, max=1.0 / eps)
        norm = torch.linalg.vector_norm(x, ord=order, dim=axis, keepdim=True)
        return x / torch.clamp(norm, min=eps)
    return normalize, f"axis={axis} order={order}"


def _trailing(axes, x) -> bool:
    """Whether the sorted axes are consecutive and end the shape: F.layer_norm / F.rms_norm then
    compute what Keras computes (its torch backend calls them; its other backends compute the
    same statistics). Elsewhere, and for a scale that broadcasts (a per-sample one), the formula
    Keras writes out."""
    axes = sorted(a % x.dim() for a in axes)
    return axes == list(range(axes[0], axes[-1] + 1)) and axes[-1] == x.dim() - 1


def _shaped(w, shape) -> bool:
    """w's shape is `shape` (the rank first: a per-sample weight is told apart without comparing
    the batch size, which an export keeps free)."""
    return w.dim() == len(shape) and tuple(w.shape) == tuple(shape)


def _norm_axes(cfg, ctx):
    axis = axes_arg(cfg, ctx)
    return [-1] if axis is None else list(axis) if isinstance(axis, tuple) else [axis]


def _rms_norm(cfg, ctx):
    axes, eps = _norm_axes(cfg, ctx), _epsilon(cfg, ctx)

    def rms_norm(x, scale=None):
        dtype, x = x.dtype, x.to(torch.promote_types(x.dtype, torch.float32))
        shape = tuple(x.shape[a] for a in sorted(axes))
        if _trailing(axes, x) and (scale is None or _shaped(scale, shape)):
            out = F.rms_norm(x, shape, scale, eps)
        else:
            out = x * torch.rsqrt(torch.mean(x * x, dim=axes, keepdim=True) + eps)
            out = out if scale is None else out * scale
        return out.to(dtype)
    return rms_norm, f"axis={axes}"


def _layer_norm(cfg, ctx):
    axes, eps = _norm_axes(cfg, ctx), _epsilon(cfg, ctx)
    rms = Values(cfg, ctx).bool("rms_scaling", False)

    def layer_norm(x, gamma=None, beta=None):
        dtype, x = x.dtype, x.to(torch.promote_types(x.dtype, torch.float32))
        dims = sorted(a % x.dim() for a in axes)
        shape = [x.shape[d] if d in dims else 1 for d in range(x.dim())]

        def fit(w):
            return w if w is None or w.dim() == x.dim() or dims == [x.dim() - 1] else w.reshape(shape)
        if rms:
            out = x * torch.rsqrt(x.var(dim=dims, keepdim=True, unbiased=False) + eps)
            out = out if gamma is None else out * fit(gamma)
        elif _trailing(dims, x) and all(w is None or _shaped(w, tuple(x.shape[d] for d in dims)) for w in (gamma, beta)):
            out = F.layer_norm(x, tuple(x.shape[d] for d in dims), gamma, beta, eps)
        else:
            mean = x.mean(dim=dims, keepdim=True)
            var = (x * x).mean(dim=dims, keepdim=True) - mean * mean
            inv = torch.rsqrt(var + eps)
            inv = inv if gamma is None else inv * fit(gamma)
            res = -mean * inv
            out = x * inv + (res if beta is None else res + fit(beta))
        return out.to(dtype)
    return layer_norm, f"axis={axes} rms_scaling={rms}"


def _encoding(multi: bool):
    """OneHot (a class id per position; an id outside [0, num_classes) gives zeros) and MultiHot (the classes present
    across axis 1, or 0 for a vector)."""
    def build(cfg, ctx):
        v = Values(cfg, ctx)
        if v.bool("sparse", False):
            raise ctx.error("a sparse one-hot encoding is not supported")
        n, axis = v.int("num_classes", lo=1, hi=MAX_SIZE), v.int("axis", -1, lo=-8, hi=8)
        dtype = dtype_arg(cfg, ctx) or torch.float32

        def one_hot(x):
            x = torch.as_tensor(x).long()
            out = F.one_hot(x.clamp(0, n - 1), n) * ((x >= 0) & (x < n)).unsqueeze(-1)  # (others: zeros, as TF's)
            if axis != -1 and axis != out.dim() - 1:
                out = torch.movedim(out, -1, axis)
            return out.to(dtype)

        def multi_hot(inputs):
            return torch.amax(one_hot(inputs), dim=1 if inputs.dim() > 1 else 0)
        return (multi_hot if multi else one_hot), f"classes={n} axis={axis}"
    return build


def _moments(cfg, ctx):
    v = Values(cfg, ctx)
    axes = v.int_list("axes", lo=-8, hi=8) if isinstance(cfg.get("axes"), list) else [v.int("axes", lo=-8, hi=8)]
    keepdims = v.bool("keepdims", False)
    if v.bool("synchronized", False):
        raise ctx.error("synchronized moments are not supported")

    def moments(x):
        dtype = x.dtype
        x = x.float() if dtype == torch.float16 else x
        mean = x.mean(dim=axes, keepdim=True)
        var = (x * x).mean(dim=axes, keepdim=True) - mean * mean  # E[x^2] - E[x]^2, as Keras computes it
        if not keepdims:
            mean, var = mean.squeeze(tuple(a % x.dim() for a in axes)), var.squeeze(tuple(a % x.dim() for a in axes))
        if dtype == torch.float16:
            lim = torch.finfo(torch.float16).max
            mean, var = mean.clamp(-lim, lim).to(dtype), var.clamp(-lim, lim).to(dtype)
        return [mean, var]
    return moments, f"axes={axes} keepdims={keepdims}"


def _batch_norm(cfg, ctx):
    v = Values(cfg, ctx)
    axis, eps = v.int("axis", lo=-8, hi=8), v.float("epsilon", 1e-3, lo=0.0)

    def batch_norm(x, mean, variance, offset=None, scale=None):
        shape = [1] * x.dim()
        shape[axis] = x.shape[axis]
        inv = torch.rsqrt(variance + eps)
        if scale is not None:
            inv = inv * scale
        res = -mean * inv if offset is None else offset - mean * inv
        return x * inv.reshape(shape) + res.reshape(shape)
    return batch_norm, f"axis={axis}"


def _pool(average: bool):
    def build(cfg, ctx):
        v = Values(cfg, ctx)
        padding = v.str("padding", "valid", choices=("valid", "same"))
        channels_last = channels_last_format(cfg, ctx)
        by_rank = {}  # the pooling module of each input rank, made on its first call

        def pool(inputs):
            rank = inputs.dim() - 2
            if rank not in by_rank:
                size = int_tuple(v, "pool_size", rank, None)
                by_rank[rank] = Pooling(average, size, int_tuple(v, "strides", rank, list(size)), padding,
                                        channels_last)
            return by_rank[rank].apply(inputs)
        return pool, f"pool_size={cfg.get('pool_size')} strides={cfg.get('strides')} padding={padding}"
    return build


def _attention(cfg, ctx):
    v = Values(cfg, ctx)
    causal = v.bool("is_causal", False)
    cap = v.float("attn_logits_soft_cap", None, lo=0.0)

    def attention(query, key, value, bias=None, scale=None):
        # [batch, time, heads, depth], as keras.ops takes it (a 3-D input has no heads axis); a
        # mask= argument is refused by build_op (the graph reads mask= as a layer's mask)
        three = query.dim() == 3
        if three:
            query, key, value = query.unsqueeze(2), key.unsqueeze(2), value.unsqueeze(2)
        q, k, val = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        if k.shape[1] != q.shape[1]:  # grouped-query attention: each key head serves several
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            val = val.repeat_interleave(q.shape[1] // val.shape[1], dim=1)
        s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        logits = torch.matmul(q, k.transpose(-1, -2)) * s
        if cap is not None:
            logits = cap * torch.tanh(logits / cap)
        if bias is not None:
            logits = logits + bias
        if causal:
            keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
            logits = logits.masked_fill(~keep, torch.finfo(logits.dtype).min)
        out = torch.matmul(torch.softmax(logits.float(), dim=-1).to(val.dtype), val).transpose(1, 2)
        return out.squeeze(2) if three else out
    return attention, f"causal={causal}"


def _top_k(cfg, ctx):
    v = Values(cfg, ctx)
    k, ordered = v.int("k", lo=1, hi=MAX_SIZE), v.bool("sorted", True)

    def top_k(x):
        values, indices = torch.topk(x, k, sorted=True)
        return [values, indices.to(torch.int32)]
    return top_k, f"k={k} sorted={ordered}"


def _extract_sequences(cfg, ctx):
    v = Values(cfg, ctx)
    length, stride = v.int("sequence_length", lo=1), v.int("sequence_stride", lo=1)
    return (lambda x: x.unfold(-1, length, stride)), f"length={length} stride={stride}"


def _norm(cfg, ctx):
    v = Values(cfg, ctx)
    order = cfg.get("ord")
    if isinstance(order, str):
        order = v.str("ord", choices=("fro", "nuc"))
    elif order is not None:
        order = v.float("ord")
    axis, keepdims = axes_arg(cfg, ctx), v.bool("keepdims", False)

    def norm(x):
        return torch.linalg.norm(floating(x), ord=order, dim=axis, keepdim=keepdims)
    return norm, f"ord={order} axis={axis}"


def _rgb_to_grayscale(cfg, ctx):
    channels_last = channels_last_format(cfg, ctx)

    def gray(images):
        axis = -1 if channels_last else -3
        if images.shape[axis] == 1:
            return images.clone()
        r, g, b = images.unbind(dim=axis)
        return (0.2989 * r + 0.587 * g + 0.114 * b).to(images.dtype).unsqueeze(axis)
    return gray, f"channels_last={channels_last}"


def _hsv(to_hsv: bool):
    """RGBToHSV / HSVToRGB of float images, hue in [0, 1) (dm_pix's and TensorFlow's formulas:
    hue from the largest channel, a grey pixel's hue and saturation 0)."""
    def build(cfg, ctx):
        channels_last = channels_last_format(cfg, ctx)

        def rgb_to_hsv(images):
            eps = torch.finfo(images.dtype).eps
            images = torch.where(images.abs() < eps, torch.zeros_like(images), images)
            r, g, b = images.unbind(dim=-1 if channels_last else -3)
            value = torch.maximum(torch.maximum(r, g), b)
            spread = value - torch.minimum(torch.minimum(r, g), b)
            saturation = torch.where(value > 0, spread / torch.where(value > 0, value, 1.0), 0.0)
            norm = 1.0 / (6.0 * torch.where(spread > 0, spread, 1.0))
            hue = torch.where(value == g, norm * (b - r) + 2.0 / 6.0, norm * (r - g) + 4.0 / 6.0)
            hue = torch.where(value == r, norm * (g - b), hue)
            hue = torch.where(spread > 0, hue, 0.0) + (hue < 0.0).to(hue.dtype)
            return torch.stack((hue, saturation, value), dim=-1 if channels_last else -3)

        def hsv_to_rgb(images):
            h, s, v = images.unbind(dim=-1 if channels_last else -3)
            sector = torch.remainder(h, 1.0) * 6.0
            weights = (torch.clip(torch.abs(sector - 3.0) - 1.0, 0.0, 1.0),
                       torch.clip(2.0 - torch.abs(sector - 2.0), 0.0, 1.0),
                       torch.clip(2.0 - torch.abs(sector - 4.0), 0.0, 1.0))
            return torch.stack([v * ((1.0 - s) + s * w) for w in weights], dim=-1 if channels_last else -3)

        def check(fn):
            def run(images):
                if images.dim() not in (3, 4) or not images.is_floating_point():
                    raise ValueError(f"expected float images of rank 3 or 4, got {images.dtype} of shape "
                                     f"{tuple(images.shape)}")
                return fn(images)
            return run
        return check(rgb_to_hsv if to_hsv else hsv_to_rgb), f"channels_last={channels_last}"
    return build


def _nchw(images, channels_last, fn):
    """fn on images as a [N, C, H, W] batch (a single [H, W, C] / [C, H, W] image as a batch of
    one), its [N, C, H, W, ...] result back in the images' layout."""
    if images.dim() not in (3, 4):
        raise ValueError(f"expected images of rank 3 or 4, got shape {tuple(images.shape)}")
    batched = images.dim() == 4
    out = fn(to_channels_first(images if batched else images.unsqueeze(0), channels_last))
    if channels_last:
        out = out.permute(0, 2, 3, 1, *range(4, out.dim()))
    return out if batched else out.squeeze(0)


def _gaussian_blur(cfg, ctx):
    """A depthwise convolution by the product of two normalized Gaussians, zero padding "same"
    (TensorFlow's split: the odd pixel after), as Keras on TensorFlow computes it: the
    [size[1], size[0]] outer product laid out as [size[0], size[1]] rows."""
    v = Values(cfg, ctx)
    size = int_tuple(v, "kernel_size", 2, [3, 3])
    if max(size) > 128:
        raise ctx.error(f"config kernel_size={list(size)}; expected at most 128 a side")
    sigma = cfg.get("sigma", [1.0, 1.0])
    sigma = sigma if isinstance(sigma, list) else [sigma, sigma]
    if len(sigma) != 2:
        raise ctx.error(f"config sigma={str(sigma)[:40]!r}; expected 2 numbers")
    sigma = [Values({"sigma": e}, ctx).float("sigma", lo=1e-6) for e in sigma]
    channels_last = channels_last_format(cfg, ctx)

    def gaussian(n, s, dtype, device):
        t = torch.arange(n, dtype=dtype, device=device) - (n - 1) / 2
        g = torch.exp(-0.5 * (t / s) ** 2)
        return g / g.sum()

    def blur(x):
        gy, gx = gaussian(size[1], sigma[1], x.dtype, x.device), gaussian(size[0], sigma[0], x.dtype, x.device)
        kernel = torch.outer(gy, gx).reshape(1, 1, size[0], size[1]).expand(x.shape[1], 1, size[0], size[1])
        (h0, w0), (h1, w1) = ((k - 1) // 2 for k in size), (k - 1 - (k - 1) // 2 for k in size)
        return F.conv2d(F.pad(x, (w0, w1, h0, h1)), kernel, groups=x.shape[1])
    return (lambda images: _nchw(images, channels_last, blur)), f"kernel_size={size} sigma={sigma}"


def _sobel_edges(cfg, ctx):
    """[..., 2]: the vertical then the horizontal Sobel gradient of each channel, the borders
    reflected (tf.image.sobel_edges, what Keras on TensorFlow computes), or zero-padded where the
    file says Keras on torch or JAX wrote it (their backends pad with zeros; a .keras file does
    not say, and gets TensorFlow's)."""
    channels_last = channels_last_format(cfg, ctx)
    zeros = ctx.backend in ("torch", "jax")

    def sobel(x):
        dy = torch.tensor([[-1.0, -2.0, -1.0], [0.0, 0.0, 0.0], [1.0, 2.0, 1.0]], dtype=x.dtype, device=x.device)
        kernels = torch.stack((dy, dy.t())).unsqueeze(1).repeat(x.shape[1], 1, 1, 1)  # [2C, 1, 3, 3]
        out = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="constant" if zeros else "reflect"), kernels, groups=x.shape[1])
        return out.reshape(x.shape[0], x.shape[1], 2, *out.shape[2:]).permute(0, 1, 3, 4, 2)
    return (lambda images: _nchw(images, channels_last, sobel)), f"channels_last={channels_last}"


def _extract_patches(cfg, ctx):
    """Each output pixel holds its size[0] x size[1] patch's pixels, rows then columns then
    channels: a convolution by the identity (exact), with Conv's strides, dilation and padding.
    (2-D patches; a 3-D size is refused.)"""
    size = int_tuple(Values(cfg, ctx), "size", 2, None)
    conv, _ = _conv("conv")({"padding": cfg.get("padding", "valid"), "strides": cfg.get("strides") or list(size),
                             "dilation_rate": cfg.get("dilation_rate", 1), "data_format": cfg.get("data_format")}, ctx)
    channels_last = channels_last_format(cfg, ctx)

    def extract_patches(images):
        batched = images.dim() == 4
        images = images if batched else images.unsqueeze(0)
        channels = images.shape[-1] if channels_last else images.shape[1]
        depth = size[0] * size[1] * channels
        if depth > 1 << 12:
            raise ValueError(f"patches of {size[0]} x {size[1]} x {channels} values: at most {1 << 12} are supported")
        eye = torch.eye(depth, dtype=images.dtype, device=images.device).reshape(size[0], size[1], channels, depth)
        out = conv(images, eye)
        return out if batched else out.squeeze(0)
    return extract_patches, f"size={size}"


def depth_to_space(x, b: int, last: bool):
    """TensorFlow's ordering: a block's rows, then its columns, then the channels."""
    if not last:
        x = x.permute(0, 2, 3, 1)
    n, h, w, c = x.shape
    x = x.reshape(n, h, w, b, b, c // (b * b)).permute(0, 1, 3, 2, 4, 5).reshape(n, h * b, w * b, c // (b * b))
    return x if last else x.permute(0, 3, 1, 2)


def space_to_depth(x, b: int, last: bool):
    if not last:
        x = x.permute(0, 2, 3, 1)
    n, h, w, c = x.shape
    x = x.reshape(n, h // b, b, w // b, b, c).permute(0, 1, 3, 2, 4, 5).reshape(n, h // b, w // b, b * b * c)
    return x if last else x.permute(0, 3, 1, 2)


def _space(to_depth: bool):
    """DepthToSpace / SpaceToDepth with TensorFlow's ordering."""
    def build(cfg, ctx):
        b = Values(cfg, ctx).int("block_size", lo=1, hi=1 << 10)
        last = Values(cfg, ctx).str("data_format", "channels_last", choices=("channels_last", "channels_first"))
        fn = space_to_depth if to_depth else depth_to_space
        return (lambda x, last=last == "channels_last": fn(x, b, last)), f"block_size={b}"
    return build


def _solve_triangular(a, b, lower):
    if b.dim() == a.dim() - 1:
        return torch.linalg.solve_triangular(a, b.unsqueeze(-1), upper=not lower).squeeze(-1)
    return torch.linalg.solve_triangular(a, b, upper=not lower)


def _cdist(x, y):
    d = x.unsqueeze(-2) - y.unsqueeze(-3)
    return torch.sqrt(torch.sum(d * d, dim=-1))


def _in_top_k(cfg, ctx):
    k = Values(cfg, ctx).int("k", lo=1, hi=MAX_SIZE)

    def in_top_k(targets, predictions):
        top = torch.topk(predictions, min(k, predictions.shape[-1])).values
        at_target = torch.take_along_dim(predictions, targets.long()[:, None], dim=-1)
        return torch.any(at_target >= top, dim=-1)  # (NaN scores are never in)
    return in_top_k, f"k={k}"


def _adaptive(average: bool):
    def build(cfg, ctx):
        size = cfg.get("output_size")
        sizes = size if isinstance(size, list) else [size]
        sizes = [Values({"output_size": e}, ctx).int("output_size", lo=1, hi=1 << 16) for e in sizes]
        channels_last = channels_last_format(cfg, ctx)

        def pool(inputs):
            rank = inputs.dim() - 2
            out = sizes * rank if len(sizes) == 1 else sizes
            if len(out) != rank:
                raise ValueError(f"output_size {size} for a {rank}-D pooling")
            return AdaptivePooling(average, out, channels_last).apply(inputs)
        return pool, f"output_size={size}"
    return build


def _resize(cfg, ctx):
    v = Values(cfg, ctx)
    size = v.int_list("size", lo=1, hi=1 << 16)
    if len(size) != 2:
        raise ctx.error(f"config size={size}; expected [height, width]")
    module = resizing_of(cfg, ctx, size[0], size[1], "Resize")

    def resize(images):
        if images.dim() == 3:  # one image
            return module.apply(images.unsqueeze(0)).squeeze(0)
        return module.apply(images)
    return resize, f"size={size} {module.interpolation}"


def _image_window(crop: bool):
    """CropImages / PadImages: the box from two of (start, end, target) per side, as Keras infers it."""
    what = "cropping" if crop else "padding"

    def build(cfg, ctx):
        v = Values(cfg, ctx)
        top, bottom, left, right = (v.int(f"{k}_{what}", None, lo=0, hi=MAX_SIZE) for k in ("top", "bottom", "left", "right"))
        th, tw = v.int("target_height", None, lo=0, hi=MAX_SIZE), v.int("target_width", None, lo=0, hi=MAX_SIZE)
        channels_last = channels_last_format(cfg, ctx)
        for a, b, t in ((top, bottom, th), (left, right, tw)):
            if sum(e is not None for e in (a, b, t)) != 2:
                raise ctx.error(f"{what} needs two of the start, the end and the target size on each axis")

        def sides(length, a, b, t):
            if crop:
                a = length - t - b if a is None else a
                t = length - a - b if t is None else t
                return a, t
            a = t - b - length if a is None else a
            b = t - a - length if b is None else b
            return a, b

        def window(images):
            x = images if channels_last else images.movedim(-3, -1)
            h, w = x.shape[-3], x.shape[-2]
            (t0, t1), (l0, l1) = sides(h, top, bottom, th), sides(w, left, right, tw)
            if min(t0, t1, l0, l1) < 0:
                raise ValueError(f"{what} of an image {h}x{w} outside it")
            if crop:
                y = x[..., t0:t0 + t1, l0:l0 + l1, :]
            else:
                y = F.pad(x, [0, 0, l0, l1, t0, t1])
            return y if channels_last else y.movedim(-1, -3)
        return window, what
    return build


def _conv(kind: str):
    """Conv (grouped where the kernel's input channels divide the input's), DepthwiseConv and
    SeparableConv with Keras's kernel layouts ((*k, in / groups, out); (*k, in, multiplier)), the
    kernels the call's tensors or constant arrays. (Keras 3.15 cannot run its ConvTranspose
    operation: it is not converted.)"""
    def build(cfg, ctx):
        v = Values(cfg, ctx)
        padding = v.str("padding", "valid", choices=("valid", "same") if kind != "conv" else ("valid", "same", "causal"))
        channels_last = channels_last_format(cfg, ctx)

        def conv(inputs, kernel, pointwise_kernel=None):
            rank = inputs.dim() - 2
            order = (rank + 1, rank, *range(rank))
            s, d = int_tuple(v, "strides", rank, 1), int_tuple(v, "dilation_rate", rank, 1)
            channels = inputs.shape[-1] if channels_last else inputs.shape[1]
            kernel = kernel.to(inputs.dtype)
            if kind in ("depthwise", "separable"):  # (*k, in, m) -> (in * m, 1, *k)
                weight = kernel.reshape(*kernel.shape[:rank], 1, -1).permute(*order)
                point = None if pointwise_kernel is None else pointwise_kernel.to(inputs.dtype).permute(*order)
                module = Convolution(kind, weight, None, s, padding, d, channels, _identity, channels_last,
                                     pointwise=point)
            else:
                if channels % kernel.shape[-2]:
                    raise ValueError(f"the kernel's {kernel.shape[-2]} input channels do not divide the input's {channels}")
                module = Convolution("conv", kernel.permute(*order), None, s, padding, d, channels // kernel.shape[-2],
                                     _identity, channels_last)
            return module.apply(inputs)
        return conv, f"{kind} padding={padding}"
    return build


def _identity(x):
    return x


def _crossentropy(kind: str):
    """BinaryCrossentropy, CategoricalCrossentropy, SparseCategoricalCrossentropy, per sample (no
    reduction), as Keras computes them: probabilities clipped to [epsilon, 1 - epsilon] (and
    renormalized over the classes), or logits through log-sigmoid / log-softmax."""
    def build(cfg, ctx):
        v = Values(cfg, ctx)
        logits, axis = v.bool("from_logits", False), v.int("axis", -1, lo=-8, hi=8)

        def binary(target, output):
            if logits:
                return F.binary_cross_entropy_with_logits(output, target.to(output.dtype), reduction="none")
            p = output.clamp(EPSILON, 1.0 - EPSILON)
            return F.binary_cross_entropy(p, target.to(output.dtype), reduction="none")

        def log_probabilities(output):
            if logits:
                return F.log_softmax(output, dim=axis)
            p = output / output.sum(dim=axis, keepdim=True)
            return torch.log(p.clamp(EPSILON, 1.0 - EPSILON))

        def categorical(target, output):
            return -(target.to(output.dtype) * log_probabilities(output)).sum(dim=axis)

        def sparse(target, output):
            target = target.long()
            if target.dim() == output.dim() and target.shape[axis] == 1:
                target = target.squeeze(axis)
            logp = log_probabilities(output).movedim(axis, -1)
            return -torch.gather(logp, -1, target.unsqueeze(-1)).squeeze(-1)
        return {"binary": binary, "categorical": categorical, "sparse": sparse}[kind], f"from_logits={logits}"
    return build


def _psnr(cfg, ctx):
    max_val = Values(cfg, ctx).float("max_val", lo=0.0)

    def psnr(x1, x2):
        # one figure for the whole batch: the mean squared error over every element
        mse = torch.mean((x1 - x2) ** 2)
        return 20 * torch.log10(torch.as_tensor(max_val, dtype=x1.dtype)) - 10 * torch.log10(mse)
    return psnr, f"max_val={max_val}"


_MAX_BLOCKS = 1 << 26  # values of an unfold's result, a sample


def _blocks(fold: bool):
    """unfold / fold: sliding blocks of a [N, C, H, W] image, or an image from them."""
    def build(cfg, ctx):
        def pair(key, default, lo, hi=1 << 10):
            value = cfg.get(key, default)
            values = value if isinstance(value, list) else [value, value]
            if len(values) != 2:
                raise ctx.error(f"config {key}={str(value)[:40]!r}; expected an integer or 2 of them")
            return tuple(Values({key: e}, ctx).int(key, lo=lo, hi=hi) for e in values)
        args = dict(kernel_size=pair("kernel_size", None, 1), dilation=pair("dilation", 1, 1),
                    padding=pair("padding", 0, 0), stride=pair("stride", 1, 1))
        if fold:
            size = pair("output_size", None, 1, 1 << 12)
            return (lambda x: F.fold(x, size, **args)), f"output_size={size} {args}"

        def unfold(x):
            (kh, kw), (ph, pw) = args["kernel_size"], args["padding"]
            rows, cols = (x.shape[-2] + 2 * ph) // args["stride"][0] + 1, (x.shape[-1] + 2 * pw) // args["stride"][1] + 1
            if x.shape[-3] * kh * kw * rows * cols > _MAX_BLOCKS:  # (a sample's: the batch stays free)
                raise ValueError(f"unfold {args}: more than {_MAX_BLOCKS} values a sample")
            return F.unfold(x, **args)
        return unfold, str(args)
    return build


def _ctc_loss(cfg, ctx):
    """Per-sample CTC loss of [B, T, C] logits against [B, S] labels: the negative log-likelihood
    under a softmax over the classes, blank = mask_index (tf.nn.ctc_loss's, torch's ctc_loss)."""
    blank = Values(cfg, ctx).int("mask_index", 0, lo=0, hi=MAX_SIZE)

    def ctc_loss(target, output, target_length, output_length):
        output = output if output.dtype in (torch.float32, torch.float64) else output.float()
        if output.dim() != 3 or blank >= output.shape[-1]:
            raise ValueError(f"ctc_loss of output of shape {tuple(output.shape)}, blank {blank}; expected "
                             "[batch, time, classes] with the blank among the classes")
        logp = F.log_softmax(output.transpose(0, 1), dim=-1)
        return F.ctc_loss(logp, torch.as_tensor(target).long(), torch.as_tensor(output_length).long(),
                          torch.as_tensor(target_length).long(), blank=blank, reduction="none")
    return ctc_loss, f"mask_index={blank}"


def _ctc_greedy(x, lengths, merge: bool, blank: int):
    """Each step's best class, steps past a sample's length blank, repeats merged (merge), blanks
    dropped and the labels moved to the front, -1 after them: [1, B, T] int32 labels and [B, 1]
    scores (minus the sum of each step's best score)."""
    T = x.shape[1]
    scores, labels = x.max(dim=-1)
    past = torch.arange(T, device=x.device)[None, :] >= lengths[:, None]
    labels = torch.where(past, blank, labels)
    scores = torch.where(past, torch.zeros_like(scores), scores)
    if merge:
        repeat = F.pad(labels[:, 1:] == labels[:, :-1], (1, 0))
        labels = torch.where(repeat, blank, labels)
    # the kept labels to the front in order (each to the count of kept ones before it; a dropped
    # one to a column past the end), -1 after them: no sort, which ONNX exports
    kept = labels != blank
    to = torch.where(kept, torch.cumsum(kept.long(), dim=1) - 1, T)
    front = torch.full((labels.shape[0], T + 1), -1, dtype=labels.dtype, device=x.device)
    labels = front.scatter(1, to, torch.where(kept, labels, -1))[:, :T].to(torch.int32)
    return [labels.unsqueeze(0), -scores.sum(dim=1, keepdim=True)]


def _merged(paths, scores, size: int):
    """Rows of paths [B, N, T] made unique per sample, padded with rows of -1 to `size`: [B, size,
    T] and, for each score vector, the log of the sum of exp(score) of the rows each unique row
    gathers (relative to the vector's maximum, as Keras sums them; -inf for a pad row)."""
    B, N, T = paths.shape
    rows = torch.cat([torch.arange(B, device=paths.device).repeat_interleave(N)[:, None], paths.reshape(-1, T)], dim=1)
    unique, inverse = torch.unique(rows, dim=0, return_inverse=True)
    first = torch.searchsorted(unique[:, 0].contiguous(), torch.arange(B, device=paths.device))
    slot = (inverse - first[rows[:, 0]]).reshape(B, N)
    out = torch.full((B, size, T), -1, dtype=paths.dtype, device=paths.device)
    out[unique[:, 0], torch.arange(unique.shape[0], device=paths.device) - first[unique[:, 0]]] = unique[:, 1:]
    merged = []
    for s in scores:
        top = s.max(dim=1, keepdim=True).values
        total = torch.zeros(B, size, dtype=s.dtype, device=s.device).scatter_add_(1, slot, torch.exp(s - top))
        merged.append(torch.log(total) + top)
    return out, merged


def _ctc_beam_search(x, lengths, width: int, top_paths: int, blank: int):
    """Beam search over the log-softmax of the scores, Keras's: prefixes (blanks dropped, repeats
    not after a blank merged) kept `width` at a time by the log-sum of their blank-ending and
    label-ending alignments, equal prefixes merged each step; the classes taken in reverse order
    where scores tie (as Keras does). [top_paths, B, T] int32 labels, -1 after each path, and [B,
    top_paths] log-probabilities, best first."""
    B, T, C = x.shape
    x = torch.flip(F.log_softmax(x, dim=-1), dims=[2])
    blank = C - 1 - blank
    slots, size = 2 * width, 2 * C * width
    first = min(C, width)
    dev = x.device
    classes = torch.argsort(x[:, 0], dim=-1, stable=True)[:, -first:]
    paths = torch.full((B, slots, T), -1, dtype=torch.long, device=dev)
    paths[:, :first, 0] = torch.where(classes == blank, -1, classes)
    scores = torch.full((B, slots), -math.inf, dtype=x.dtype, device=dev)
    scores[:, :first] = torch.gather(x[:, 0], 1, classes)
    ended = paths[:, :, 0] == -1  # the alignment's last step was a blank
    step_class = torch.arange(C, device=dev).masked_fill(torch.arange(C, device=dev) == blank, -1).repeat(slots)
    blank_step = (step_class == -1)[None, :].expand(B, -1)
    batch = torch.arange(B, device=dev)[:, None]
    grown_rows = torch.arange(slots * C, device=dev)[None, :]
    blank_half = torch.arange(slots, device=dev)[None, :] >= width  # the kept paths' blank-ending copies
    for t in range(1, T):
        grow = paths.repeat_interleave(C, dim=1)  # [B, slots * C, T]
        grown = scores.repeat_interleave(C, dim=1) + x[:, t].repeat(1, slots)
        tail_at = (grow == -1).to(torch.int8).argmax(dim=2)
        tail = torch.where(tail_at == 0, -1, torch.gather(grow, 2, (tail_at - 1).clamp(min=0)[..., None])[..., 0])
        was_ended = ended.repeat_interleave(C, dim=1)
        grow[batch, grown_rows, tail_at] = torch.where(
            ~was_ended & (tail == step_class), -1, step_class)
        unique, (label_end, blank_end) = _merged(grow, [torch.where(blank_step, -math.inf, grown),
                                                        torch.where(blank_step, grown, -math.inf)], size)
        keep = torch.argsort(torch.logaddexp(label_end, blank_end), dim=1, stable=True)[:, -width:]
        kept = torch.gather(unique, 1, keep[..., None].expand(-1, -1, T)).repeat(1, 2, 1)
        kept_scores = torch.cat([torch.gather(label_end, 1, keep), torch.gather(blank_end, 1, keep)], dim=1)
        live = (t < lengths)[:, None]
        paths = torch.where(live[..., None], kept, paths)
        scores = torch.where(live, kept_scores, scores)
        ended = torch.where(live, blank_half, ended)
    unique, (total,) = _merged(paths, [scores], size)
    best = torch.argsort(total, dim=1, stable=True)[:, -top_paths:].flip(1)
    labels = torch.gather(unique, 1, best[..., None].expand(-1, -1, T))
    labels = torch.where(labels == -1, -1, C - 1 - labels).to(torch.int32)
    return [labels.permute(1, 0, 2), torch.gather(total, 1, best)]


def _ctc_decode(cfg, ctx):
    """CTC decoding of [B, T, C] scores as Keras computes it: greedy (_ctc_greedy) or beam search
    (_ctc_beam_search); the blank is mask_index, or the last class where that is null."""
    v = Values(cfg, ctx)
    strategy = v.str("strategy", "greedy", choices=("greedy", "beam_search"))
    merge = v.bool("merge_repeated", True)
    width = v.int("beam_width", 100, lo=1, hi=4096)
    top_paths = v.int("top_paths", 1, lo=1, hi=4096)
    blank = v.int("mask_index", None, lo=0, hi=MAX_SIZE)
    if strategy == "beam_search" and top_paths > width:
        raise ctx.error(f"config top_paths={top_paths} above beam_width={width}")

    def ctc_decode(inputs, sequence_lengths):
        x = inputs if inputs.dtype in (torch.float32, torch.float64) else inputs.float()
        if x.dim() != 3:
            raise ValueError(f"ctc_decode of inputs of shape {tuple(x.shape)}; expected [batch, time, classes]")
        mask = x.shape[2] - 1 if blank is None else blank
        if mask >= x.shape[2]:
            raise ValueError(f"ctc_decode with mask_index {mask} of {x.shape[2]} classes")
        lengths = torch.as_tensor(sequence_lengths, device=x.device).long()
        if strategy == "greedy":
            return _ctc_greedy(x, lengths, merge, mask)
        return _ctc_beam_search(x, lengths, width, top_paths, mask)
    return ctc_decode, f"{strategy} mask_index={blank}"

NN_OPS: Dict[str, Callable] = {
    # activations
    "Celu": _number("alpha", 1.0, lambda x, a: F.celu(x, alpha=a)),
    "HardShrink": _number("threshold", 0.5, lambda x, t: F.hardshrink(x, lambd=t)),
    "SoftShrink": _number("threshold", 0.5, lambda x, t: F.softshrink(x, lambd=t)),
    "Squareplus": _number("b", 4.0, lambda x, b: (x + torch.sqrt(x * x + b)) / 2),
    "HardTanh": fixed(lambda x: F.hardtanh(x, -1.0, 1.0)), "TanhShrink": fixed(F.tanhshrink),
    "Threshold": _threshold, "SparsePlus": fixed(_sparse_plus), "SparseSigmoid": fixed(_sparse_sigmoid),
    "Sparsemax": _axis_op(_sparsemax), "Glu": _axis_op(lambda x, a: F.glu(x, dim=a)),
    # normalizations, encodings, statistics
    "Normalize": _normalize, "RMSNorm": _rms_norm, "LayerNorm": _layer_norm, "BatchNorm": _batch_norm,
    "OneHot": _encoding(False), "MultiHot": _encoding(True), "Moments": _moments,
    # pooling and attention
    "MaxPool": _pool(False), "AveragePool": _pool(True), "DotProductAttention": _attention,
    "AdaptiveMaxPool": _adaptive(False), "AdaptiveAveragePool": _adaptive(True),
    "Conv": _conv("conv"), "DepthwiseConv": _conv("depthwise"), "SeparableConv": _conv("separable"),
    "BinaryCrossentropy": _crossentropy("binary"), "CategoricalCrossentropy": _crossentropy("categorical"),
    "SparseCategoricalCrossentropy": _crossentropy("sparse"),
    "CTCLoss": _ctc_loss, "CTCDecode": _ctc_decode,
    # keras.ops.math
    "Logsumexp": _logsumexp, "TopK": _top_k, "ExtractSequences": _extract_sequences, "PSNR": _psnr,
    "Unfold": _blocks(False), "Fold": _blocks(True),
    "Erfinv": fixed(lambda x: torch.erfinv(floating(x))), "Erfc": fixed(lambda x: torch.erfc(floating(x))),
    # keras.ops.linalg
    # (a singular matrix gives what LAPACK computes, inf or NaN, not an error: the zeros that
    # loading runs a model on are singular)
    "Norm": _norm, "Det": fixed(torch.linalg.det), "Inv": fixed(lambda x: torch.linalg.inv_ex(x).inverse),
    "Solve": fixed(lambda a, b: torch.linalg.solve_ex(a, b).result), "Logdet": fixed(torch.logdet),
    "Cholesky": lambda cfg, ctx: ((lambda x, u=Values(cfg, ctx).bool("upper", False): torch.linalg.cholesky_ex(
        x, upper=u).L), "cholesky"),
    "Qr": lambda cfg, ctx: ((lambda x, m=Values(cfg, ctx).str("mode", "reduced", choices=("reduced", "complete")):
                             list(torch.linalg.qr(x, mode=m))), "qr"),
    "Pinv": lambda cfg, ctx: ((lambda x, r=Values(cfg, ctx).float("rcond", None, lo=0.0): torch.linalg.pinv(x, rtol=r)),
                              "pinv"),
    "SolveTriangular": lambda cfg, ctx: ((lambda a, b, lower=Values(cfg, ctx).bool("lower", False):
                                          _solve_triangular(a, b, lower)), "solve_triangular"),
    "CDist": fixed(_cdist), "InTopK": _in_top_k,
    # keras.ops.image
    "RGBToGrayscale": _rgb_to_grayscale, "DepthToSpace": _space(False), "SpaceToDepth": _space(True),
    "Resize": _resize, "CropImages": _image_window(True), "PadImages": _image_window(False),
    "RGBToHSV": _hsv(True), "HSVToRGB": _hsv(False), "ExtractPatches": _extract_patches,
    "GaussianBlur": _gaussian_blur, "SobelEdges": _sobel_edges,
}
