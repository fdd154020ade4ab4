"""The CPU's own convolution weight gradient (csrc/cpu/conv_weight_grad.cpp), which ConvLSTM's float32
backward runs for its input and recurrent kernels, each build this CPU runs (AVX2 and AVX-512), held
to ATen's convolution backward in float64 over shapes that reach every tile: 1-D to 3-D kernels,
strides, dilation (a dilated last dimension splits the input slab per kernel column), asymmetric
padding, rows longer than a block, one or many input channels, output channels that leave a partial
vector or tile, a gradient whose rows lie further apart than its channels (a narrowed gate block),
and row counts over the most chunks; then the same bits on any thread count, and the ConvLSTM
layer's float32 gradients (dropout masks per gate, go_backwards) against float64."""
import pytest
import torch

import cudnn_rnn
from cudnn_rnn import _C

pytestmark = pytest.mark.skipif(not _C._testing.cpu_packed_gemm(), reason="the CPU's kernel needs AVX2 + FMA")

from isa_builds import packed_build  # noqa: F401,E402  (the `build` fixture)


def aten_reference(x, g, kernel, stride, pad_before, pad_after, dilation, bias):
    """ATen's weight (and bias) gradient in float64, the padding applied to the input first."""
    nd = len(kernel)
    pads = [0, 0]
    for d in reversed(range(nd)):
        pads += [pad_before[d], pad_after[d]]
    xp = torch.nn.functional.pad(x.double(), pads)
    perm = [0, nd + 1] + list(range(1, nd + 1))
    C, O = x.shape[-1], g.shape[-1]
    weight = torch.zeros(O, C, *kernel, dtype=torch.float64)
    _, gw, gb = torch.ops.aten.convolution_backward(
        g.double().permute(perm), xp.permute(perm), weight, [O] if bias else None, list(stride), [0] * nd,
        list(dilation), False, [0] * nd, 1, [False, True, bias])
    return gw, gb


CASES = [
    # spatial, C, O, kernel, stride, pad_before, pad_after, dilation, N
    ((7, 9), 16, 128, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), 3),     # ConvLSTM2D's own: full tiles
    ((6, 5), 5, 33, (2, 3), (2, 1), (0, 1), (1, 1), (1, 1), 2),       # one channel past a tile
    ((9, 8), 3, 20, (3, 3), (1, 1), (2, 2), (2, 2), (2, 2), 2),       # dilated: a slab per column
    ((11,), 1, 4, (5,), (2,), (2,), (2,), (1,), 4),                   # 1-D, one input channel
    ((13,), 6, 12, (3,), (1,), (2,), (2,), (2,), 3),                  # 1-D dilated
    ((3, 5, 6), 7, 48, (2, 3, 3), (1, 1, 2), (1, 1, 1), (0, 1, 1), (1, 2, 1), 2),  # 3-D
    ((8, 8), 13, 17, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), 40),    # 320 rows: every chunk
    ((5, 4), 37, 8, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), 2),       # 111-wide slab: partial column tile
    ((4, 40), 2, 64, (1, 3), (1, 3), (0, 0), (0, 0), (1, 1), 2),      # strided last dimension, valid
    ((1, 1), 4, 24, (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), 5),       # one pixel
    ((3, 300), 3, 20, (2, 5), (1, 2), (1, 2), (0, 2), (1, 2), 2),     # rows of 148 pixels, in pieces
    ((700,), 4, 9, (3,), (1,), (1,), (1,), (1,), 2),                  # 1-D: a 700-pixel row
]


@pytest.mark.parametrize("spatial, C, O, kernel, stride, pad_before, pad_after, dilation, N", CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_weight_gradient_matches_float64(build, spatial, C, O, kernel, stride, pad_before, pad_after, dilation, N,
                                         bias):
    gen = torch.Generator().manual_seed(C * 1009 + O * 31 + N)
    out = [(s + b + a - (k - 1) * d - 1) // st + 1
           for s, b, a, k, d, st in zip(spatial, pad_before, pad_after, kernel, dilation, stride)]
    x = torch.randn(N, *spatial, C, generator=gen)
    g = torch.randn(N, *out, O, generator=gen)
    got = _C._testing.conv_weight_grad(x, g, kernel, stride, pad_before, pad_after, dilation, bias)
    assert got is not None
    ref_w, ref_b = aten_reference(x, g, kernel, stride, pad_before, pad_after, dilation, bias)
    assert got[0].shape == ref_w.shape
    torch.testing.assert_close(got[0].double(), ref_w, rtol=1e-5, atol=1e-5 * ref_w.abs().max().item())
    if bias:
        torch.testing.assert_close(got[1].double(), ref_b, rtol=1e-5, atol=1e-5 * ref_b.abs().max().item())
    else:
        assert got[1] is None


def test_rows_further_apart_than_the_channels(build):
    """A gate block of the stacked gate gradient (dropout masks per gate): rows 4 * O apart."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 6, 7, 9, generator=gen)
    whole = torch.randn(3, 6, 7, 4 * 20, generator=gen)
    g = whole[..., 20:40]
    got = _C._testing.conv_weight_grad(x, g, [3, 3], [1, 1], [1, 1], [1, 1], [1, 1], True)
    ref_w, ref_b = aten_reference(x, g, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), True)
    torch.testing.assert_close(got[0].double(), ref_w, rtol=1e-5, atol=1e-5 * ref_w.abs().max().item())
    torch.testing.assert_close(got[1].double(), ref_b, rtol=1e-5, atol=1e-5 * ref_b.abs().max().item())


def test_same_bits_on_any_thread_count(build):
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(24, 10, 12, 6, generator=gen)
    g = torch.randn(24, 10, 12, 40, generator=gen)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(_C._testing.conv_weight_grad(x, g, [3, 3], [1, 1], [1, 1], [1, 1], [1, 1], True))
    finally:
        torch.set_num_threads(before)
    for w, b in results[1:]:
        assert torch.equal(w, results[0][0]) and torch.equal(b, results[0][1])


def test_float64_is_left_to_aten():
    x = torch.randn(2, 5, 5, 3, dtype=torch.float64)
    g = torch.randn(2, 5, 5, 8, dtype=torch.float64)
    assert _C._testing.conv_weight_grad(x, g, [3, 3], [1, 1], [1, 1], [1, 1], [1, 1], True) is None


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("masks", ["shared", "per_gate"])
def test_conv_lstm_float32_gradients_match_float64(build, go_backwards, masks):
    """The layer's op in float32 (this kernel for both kernels' gradients) and float64 (ATen's):
    outputs and every gradient, with dropout masks shared by the gates (one convolution per step)
    or per gate (each gate's block of the gate gradient on its own)."""
    gen = torch.Generator().manual_seed(3 + go_backwards)
    C, F, S = 9, 11, (6, 7)
    x = torch.randn(3, 4, *S, C, dtype=torch.float64, generator=gen)
    k = torch.randn(4 * F, C, 3, 3, dtype=torch.float64, generator=gen) * 0.3
    r = torch.randn(4 * F, F, 3, 3, dtype=torch.float64, generator=gen) * 0.3
    b = torch.randn(4 * F, dtype=torch.float64, generator=gen)
    groups = 1 if masks == "shared" else 4
    dm = (torch.rand(groups, 3, *S, C, generator=gen) > 0.3).double() / 0.7
    rm = (torch.rand(groups, 3, *S, F, generator=gen) > 0.3).double() / 0.7
    op = torch.ops.cudnn_rnn.conv_lstm_forward

    def run(dtype):
        args = [t.to(dtype).requires_grad_(True) for t in (x, k, r, b)]
        y, h, c = op(*args, None, None, None, dm.to(dtype), rm.to(dtype), [1, 1], [1, 1], [1, 1], [1, 1], "tanh",
                     "sigmoid", go_backwards)[:3]
        grads = torch.autograd.grad((y * y).sum() + h.sum() + (c * c).sum(), args)
        return [t.double() for t in (y, h, c) + grads]

    for i, (a, e) in enumerate(zip(run(torch.float32), run(torch.float64))):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4 * max(1.0, e.abs().max().item()),
                                   msg=lambda m: f"tensor {i}: {m}")


def test_conv_lstm_layer_gradients_same_bits_on_any_thread_count():
    """The kernels' gradients of a ConvLSTM2D training step: identical on 1 and 2 threads."""
    layer = cudnn_rnn.ConvLSTM2D(4, 6, 3, padding="same", return_sequences=True)
    x = torch.randn(4, 3, 9, 10, 4, generator=torch.Generator().manual_seed(4))
    before = torch.get_num_threads()
    grads = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            layer.zero_grad()
            layer(x).square().sum().backward()
            grads.append([p.grad.clone() for p in layer.parameters()])
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*grads):
        assert torch.equal(a, b)
