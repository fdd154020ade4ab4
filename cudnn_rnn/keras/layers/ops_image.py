"""keras.ops.image's resampling operations and SSIM: map_coordinates (order 0 and 1, with SciPy's
border modes), affine_transform and perspective_transform (which sample the images the same way)
and ssim. Each entry of IMAGE_OPS is a builder (config, context) -> (function, description), as in
ops_nn.py.

Sampling follows Keras on torch and JAX (SciPy's map_coordinates): each neighbour's index is
brought inside the image by the border mode, and in "constant" mode a neighbour outside it reads
fill_value. An affine transform's projective terms divide as keras.ops.image.affine_transform's
documentation (and Keras on TensorFlow) says."""
from __future__ import annotations

import itertools
from typing import Callable, Dict, Sequence

import torch
import torch.nn.functional as F

from .base import channels_last_format
from .values import Values

_MODES = ("constant", "nearest", "wrap", "mirror", "reflect")
_ORDERS = {"nearest": 0, "bilinear": 1}


def _mirror(index: torch.Tensor, size: int) -> torch.Tensor:
    """Reflection about the first and last entries (d c b | a b c d | c b a)."""
    if size == 1:
        return torch.zeros_like(index)
    s = size - 1
    return torch.abs(torch.remainder(index + s, 2 * s) - s)


def _inside(index: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    if mode in ("constant", "nearest"):
        return index.clamp(0, size - 1)
    if mode == "wrap":
        return torch.remainder(index, size)
    if mode == "mirror":
        return _mirror(index, size)
    # reflect: about the outer edges (c b a | a b c | c b a)
    return torch.div(_mirror(2 * index + 1, 2 * size + 1) - 1, 2, rounding_mode="floor")


def _nodes(coordinate: torch.Tensor, order: int) -> list:
    """(index, weight) of each neighbour a coordinate reads along one axis."""
    if order == 0:
        c = torch.round(coordinate) if coordinate.is_floating_point() else coordinate
        return [(c.long(), None)]
    lower = torch.floor(coordinate)
    upper = coordinate - lower
    return [(lower.long(), 1 - upper), (lower.long() + 1, upper)]


def sample(data: torch.Tensor, coordinates: Sequence[torch.Tensor], sizes: Sequence[int], order: int, mode: str,
           fill_value: float, lead: Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """data[*lead, c_1, ..., c_k] interpolated (order 0: the nearest entry, 1: linear) at the
    fractional coordinates c_i along the k axes of `sizes` after the `lead` index tensors, the
    axes after them taken whole; an integer result rounded."""
    out = None
    for combo in itertools.product(*(_nodes(c, order) for c in coordinates)):
        index = [_inside(i, n, mode) for (i, _), n in zip(combo, sizes)]
        value = data[(*lead, *index)]
        weight = None
        for _, w in combo:
            if w is not None:
                weight = w if weight is None else weight * w
        if mode == "constant":
            valid = None
            for (i, _), n in zip(combo, sizes):
                ok = (i >= 0) & (i < n)
                valid = ok if valid is None else valid & ok
            valid = valid.reshape(valid.shape + (1,) * (value.dim() - valid.dim()))
            value = torch.where(valid, value, torch.as_tensor(fill_value, dtype=value.dtype, device=value.device))
        if weight is not None:
            value = weight.reshape(weight.shape + (1,) * (value.dim() - weight.dim())) * value
        out = value if out is None else out + value
    if not data.is_floating_point() and out.is_floating_point():
        out = torch.round(out)
    return out.to(data.dtype)


def _fill(cfg, ctx) -> float:
    return Values(cfg, ctx).float("fill_value", 0.0)


def _map_coordinates(cfg, ctx):
    v = Values(cfg, ctx)
    order = v.int("order", lo=0, hi=1)
    mode = v.str("fill_mode", "constant", choices=_MODES)
    fill = _fill(cfg, ctx)

    def map_coordinates(inputs, coordinates):
        coords = list(coordinates) if isinstance(coordinates, (list, tuple)) else list(torch.unbind(coordinates))
        if len(coords) != inputs.dim():
            raise ValueError(f"map_coordinates of an input of rank {inputs.dim()} with {len(coords)} coordinate arrays")
        coords = [torch.as_tensor(c, device=inputs.device) for c in coords]
        return sample(inputs, coords, inputs.shape, order, mode, fill)
    return map_coordinates, f"order={order} fill_mode={mode}"


def _batched_nhwc(images: torch.Tensor, channels_last: bool, fn) -> torch.Tensor:
    """fn on images as an [N, H, W, C] batch (one [H, W, C] / [C, H, W] image as a batch of one),
    its result back in the images' layout."""
    if images.dim() not in (3, 4):
        raise ValueError(f"expected images of rank 3 or 4, got shape {tuple(images.shape)}")
    batched = images.dim() == 4
    x = images if batched else images.unsqueeze(0)
    out = fn(x if channels_last else x.permute(0, 2, 3, 1))
    out = out if channels_last else out.permute(0, 3, 1, 2)
    return out if batched else out.squeeze(0)


def _projective(x: torch.Tensor, t: torch.Tensor, order: int, mode: str, fill: float) -> torch.Tensor:
    """[N, H, W, C] images through projective transforms t ([N or 1, 8] rows [a0, a1, a2, b0, b1,
    b2, c0, c1]): output pixel (x, y) samples the input at ((a0 x + a1 y + a2) / k, (b0 x + b1 y +
    b2) / k), k = c0 x + c1 y + 1."""
    N, H, W = x.shape[0], x.shape[1], x.shape[2]
    cols = torch.arange(W, dtype=t.dtype, device=x.device).reshape(1, 1, W)
    rows = torch.arange(H, dtype=t.dtype, device=x.device).reshape(1, H, 1)
    a0, a1, a2, b0, b1, b2, c0, c1 = (t[:, i].reshape(-1, 1, 1) for i in range(8))
    k = c0 * cols + c1 * rows + 1
    x_in = ((a0 * cols + a1 * rows + a2) / k).expand(N, H, W)
    y_in = ((b0 * cols + b1 * rows + b2) / k).expand(N, H, W)
    images = torch.arange(N, device=x.device).reshape(-1, 1, 1)
    return sample(x, [y_in, x_in], (H, W), order, mode, fill, lead=(images,))


def _affine_transform(cfg, ctx):
    """Each image through its row of the transforms (_projective; one row: every image)."""
    v = Values(cfg, ctx)
    order = _ORDERS[v.str("interpolation", "bilinear", choices=tuple(_ORDERS))]
    mode = v.str("fill_mode", "constant", choices=_MODES)
    fill = _fill(cfg, ctx)
    channels_last = channels_last_format(cfg, ctx)

    def transform_images(x, transform):
        t = torch.as_tensor(transform, device=x.device)
        t = (t if t.is_floating_point() else t.float()).reshape(-1, 8)
        if t.shape[0] not in (1, x.shape[0]):
            raise ValueError(f"affine_transform of {x.shape[0]} images with {t.shape[0]} transforms")
        return _projective(x, t, order, mode, fill)
    return ((lambda images, transform: _batched_nhwc(images, channels_last, lambda x: transform_images(x, transform))),
            f"order={order} fill_mode={mode}")


def homography(start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """[N, 8]: the projective transform [a0, a1, a2, b0, b1, b2, c0, c1] that takes each of the 4
    end points (x, y) to its start point, solved in float32 or wider."""
    work = torch.promote_types(start.dtype, torch.float32)
    s, e = start.to(work), end.to(work)
    ex, ey, sx, sy = e[..., 0], e[..., 1], s[..., 0], s[..., 1]  # [N, 4]
    one, zero = torch.ones_like(ex), torch.zeros_like(ex)
    x_rows = torch.stack([ex, ey, one, zero, zero, zero, -sx * ex, -sx * ey], dim=-1)
    y_rows = torch.stack([zero, zero, zero, ex, ey, one, -sy * ex, -sy * ey], dim=-1)
    a = torch.stack([x_rows, y_rows], dim=2).reshape(-1, 8, 8)  # rows x1, y1, x2, y2, ...
    b = torch.stack([sx, sy], dim=-1).reshape(-1, 8, 1)
    return torch.linalg.solve(a, b).reshape(-1, 8)


def _perspective_transform(cfg, ctx):
    """Each image through the projective transform that takes the 4 end points to the 4 start
    points (_projective, border mode "constant")."""
    v = Values(cfg, ctx)
    order = _ORDERS[v.str("interpolation", "bilinear", choices=tuple(_ORDERS))]
    fill = _fill(cfg, ctx)
    channels_last = channels_last_format(cfg, ctx)

    def transform_images(x, start_points, end_points):
        start = torch.as_tensor(start_points, device=x.device)
        end = torch.as_tensor(end_points, device=x.device)
        if start.shape[-2:] != (4, 2) or start.shape != end.shape or start.dim() not in (2, 3):
            raise ValueError(f"perspective_transform with start points {tuple(start.shape)} and end points "
                             f"{tuple(end.shape)}; expected (4, 2) or (N, 4, 2) each")
        t = homography(start.reshape(-1, 4, 2), end.reshape(-1, 4, 2)).to(x.dtype if x.is_floating_point() else
                                                                          torch.float32)
        if t.shape[0] not in (1, x.shape[0]):
            raise ValueError(f"perspective_transform of {x.shape[0]} images with {t.shape[0]} sets of points")
        return _projective(x, t, order, "constant", fill)
    return ((lambda images, start_points, end_points: _batched_nhwc(
        images, channels_last, lambda x: transform_images(x, start_points, end_points))), f"order={order}")


def _ssim(cfg, ctx):
    """The mean structural similarity of each pair of images: Gaussian-weighted local means,
    variances and covariance over filter_size x filter_size windows inside the image ("valid"),
    the SSIM map averaged over the pixels, then over the channels; in the first image's dtype."""
    v = Values(cfg, ctx)
    max_val = v.float("max_val", 1.0)
    size = v.int("filter_size", 11, lo=1, hi=1024)
    sigma = v.float("filter_sigma", 1.5, lo=1e-6)
    k1, k2 = v.float("k1", 0.01), v.float("k2", 0.03)
    channels_last = channels_last_format(cfg, ctx)
    c1, c2 = (k1 * max_val) ** 2, (k2 * max_val) ** 2

    def ssim(image1, image2):
        if image1.dim() not in (3, 4) or image1.shape != image2.shape:
            raise ValueError(f"ssim of images of shapes {tuple(image1.shape)} and {tuple(image2.shape)}; expected "
                             "equal shapes of rank 3 or 4")
        batched = image1.dim() == 4
        work = image1.dtype if image1.is_floating_point() else torch.float32
        a, b = (t.to(work) if batched else t.to(work).unsqueeze(0) for t in (image1, image2))
        if channels_last:
            a, b = a.permute(0, 3, 1, 2), b.permute(0, 3, 1, 2)
        N, C, H, W = a.shape
        a, b = a.reshape(N * C, 1, H, W), b.reshape(N * C, 1, H, W)
        g = torch.arange(size, dtype=work, device=a.device) - (size - 1) / 2.0
        g = torch.exp(-(g * g) / (2.0 * sigma * sigma))
        g = g / g.sum()
        kernel = torch.outer(g, g).reshape(1, 1, size, size)
        mean = lambda t: F.conv2d(t, kernel)  # noqa: E731
        mu1, mu2 = mean(a), mean(b)
        var1, var2, cov = mean(a * a) - mu1 * mu1, mean(b * b) - mu2 * mu2, mean(a * b) - mu1 * mu2
        m = (2.0 * mu1 * mu2 + c1) * (2.0 * cov + c2) / ((mu1 * mu1 + mu2 * mu2 + c1) * (var1 + var2 + c2))
        out = m.mean(dim=(1, 2, 3)).reshape(N, C).mean(dim=-1).to(image1.dtype)
        return out if batched else out.squeeze(0)
    return ssim, f"filter_size={size} filter_sigma={sigma}"


IMAGE_OPS: Dict[str, Callable] = {
    "MapCoordinates": _map_coordinates, "AffineTransform": _affine_transform,
    "PerspectiveTransform": _perspective_transform, "SSIM": _ssim,
}
