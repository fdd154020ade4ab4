"""Dynamic int8 quantization (cudnn_rnn.quantize_dynamic; csrc/cpu/int8_gemm.cpp, plan_int8.cpp).

Oracles: the quantization scheme itself computed in float64 (per-column weight scales, per-row
activation scales, round half to even, int32 sums), for the GEMM; float32 torch.nn for the
layers, with torch.ao.quantization.quantize_dynamic's error on the same model as the bar."""
import os
import warnings

import pytest
import torch

import cudnn_rnn
from cudnn_rnn import _C

HERE = os.path.dirname(os.path.abspath(__file__))
needs_int8 = pytest.mark.skipif(not cudnn_rnn.int8_available(), reason="the int8 kernels need AVX2")
needs_both = pytest.mark.skipif(not (cudnn_rnn.int8_available() and _C._testing.cpu_int8_gemm_avx512()),
                                reason="comparing the builds needs AVX512_VNNI")
from isa_builds import int8_build  # noqa: F401,E402  (the `build` fixture)


def _quantize(t: torch.Tensor, dim: int):
    """Symmetric int8 along dim: (q, scale) with q = round_half_even(t / scale), |q| <= 127."""
    top = t.abs().amax(dim=dim, keepdim=True)
    scale = torch.where(top > 0, top / 127.0, torch.ones_like(top))
    return torch.round(t / scale).clamp(-127, 127), scale


def _reference_linear(x, kernel, bias):
    xs = x.reshape(-1, x.shape[-1]).float()
    # The kernel's scales and the rows' scales as float32 computes them, the sums exact in float64.
    qa, sa = _quantize(xs, 1)
    qw, sw = _quantize(kernel.float(), 0)
    out = (qa.double() @ qw.double()) * (sa.double() * sw.double())
    if bias is not None:
        out = out + bias.double()
    return out.reshape(*x.shape[:-1], kernel.shape[1])


@needs_int8
@pytest.mark.parametrize("rows,K,N", [(1, 1, 1), (5, 3, 17), (6, 64, 64), (7, 100, 130), (13, 257, 200),
                                      (64, 512, 1024)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_int8_gemm_is_the_scheme(build, rows, K, N, with_bias):
    """Every row tile (1-6 rows; the 256-bit builds' 1-4), 1-4 panel groups with a
    partial last panel, depths not a multiple of 4: each build computes exactly the documented
    integer arithmetic."""
    assert _C.cpu_int8_gemm_isa() == build
    g = torch.Generator().manual_seed(rows * 1000 + K + N)
    x = torch.randn(rows, K, generator=g)
    x[0, 0] = 0.0
    kernel = torch.randn(K, N, generator=g) * 0.1
    bias = torch.randn(N, generator=g) if with_bias else None
    got = torch.ops.cudnn_rnn.linear_int8(x, kernel, bias)
    want = _reference_linear(x, kernel, bias)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # a transposed view (torch.nn.Linear's weight.t()) and a zero row
    x[1:] = 0.0 if rows > 1 else x[1:]
    got_t = torch.ops.cudnn_rnn.linear_int8(x, kernel.t().contiguous().t(), bias)
    torch.testing.assert_close(got_t.double(), _reference_linear(x, kernel, bias), rtol=1e-5, atol=1e-5)


class _Out0(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)[0]


@needs_int8
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_layer_error_within_torch_ao(cell, seed):
    """Our quantized layer's error against float32 torch.nn is at most 1.5x that of
    torch.ao.quantization.quantize_dynamic (fbgemm) on the same model."""
    torch.manual_seed(seed)
    layer = {"lstm": cudnn_rnn.LSTM, "gru": cudnn_rnn.GRU}[cell](48, 80, return_sequences=True).eval()
    reference = _Out0(layer.to_torch()).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notice
        theirs_model = torch.ao.quantization.quantize_dynamic(reference, {torch.nn.LSTM, torch.nn.GRU},
                                                              dtype=torch.qint8)
    ours_model = cudnn_rnn.quantize_dynamic(layer)
    x = torch.randn(6, 30, 48)
    with torch.no_grad():
        want = reference(x)
        ours = (ours_model(x) - want).abs().max().item()
        theirs = (theirs_model(x) - want).abs().max().item()
    assert theirs > 0, "torch.ao did not quantize the reference"
    assert ours <= 1.5 * theirs, f"ours {ours:.3e} against torch.ao's {theirs:.3e}"


@needs_int8
@pytest.mark.parametrize("make", [
    lambda: cudnn_rnn.LSTM(16, 40, return_sequences=True),
    lambda: cudnn_rnn.GRU(16, 40, return_sequences=True, go_backwards=True),
    lambda: cudnn_rnn.SimpleRNN(16, 40, return_sequences=True),
    lambda: cudnn_rnn.Bidirectional(cudnn_rnn.LSTM(16, 40, return_sequences=True)),
    lambda: cudnn_rnn.LSTM(16, 40, return_sequences=True, num_layers=2),
])
def test_masked_rows_are_their_own_sequences(make):
    """Each row is quantized on its own, so a padded batch gives each row what the row alone, cut
    to its length, gives (masked steps carried as in the float layer)."""
    torch.manual_seed(3)
    q = cudnn_rnn.quantize_dynamic(make())
    lengths = [9, 1, 5, 9, 3]
    x = torch.randn(len(lengths), 9, 16)
    mask = torch.arange(9)[None] < torch.tensor(lengths)[:, None]
    with torch.no_grad():
        batch = q(x, mask=mask)
        for b, n in enumerate(lengths):
            alone = q(x[b:b + 1, :n])
            if isinstance(q, cudnn_rnn.Bidirectional):
                torch.testing.assert_close(batch[b, :n], alone[0], rtol=1e-6, atol=1e-6)
            elif q.go_backwards:  # outputs in processing order: the last one is time 0's
                torch.testing.assert_close(batch[b, -1], alone[0, -1], rtol=1e-6, atol=1e-6)
            else:
                torch.testing.assert_close(batch[b, n - 1], alone[0, n - 1], rtol=1e-6, atol=1e-6)


@needs_int8
def test_weights_changed_after_quantizing_are_seen():
    torch.manual_seed(4)
    q = cudnn_rnn.quantize_dynamic(cudnn_rnn.LSTM(8, 24, return_sequences=True))
    x = torch.randn(3, 5, 8)
    with torch.no_grad():
        before = q(x)
        for p in q.parameters():
            p.mul_(1.5)
        after = q(x)
        fresh = cudnn_rnn.quantize_dynamic(q)(x)  # packs the changed weights anew
    assert not torch.equal(before, after)
    torch.testing.assert_close(after, fresh, rtol=0, atol=0)


def test_quantized_model_keeps_its_parameters_and_refuses_training():
    torch.manual_seed(5)
    model = torch.nn.Sequential()
    model.add_module("rnn", cudnn_rnn.LSTM(8, 16))
    model.add_module("head", torch.nn.Linear(16, 3))
    q = cudnn_rnn.quantize_dynamic(model)
    assert isinstance(q.head, cudnn_rnn.Int8Linear) and q.rnn.quantized and not model.rnn.quantized
    assert list(q.state_dict()) == list(model.state_dict())
    x = torch.randn(2, 4, 8)
    with torch.no_grad():
        got, want = q(x), model(x)
    tol = 0.05 if cudnn_rnn.int8_available() else 0.0  # float32 where there is no VNNI
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    q.train()
    with pytest.raises(RuntimeError, match="inference only; call model.eval"):
        q(x)
    with pytest.raises(RuntimeError, match="Int8Linear runs inference only; call model.eval"):
        q.head(torch.randn(2, q.head.in_features))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        cudnn_rnn.quantize_dynamic("model")


@needs_int8
def test_keras_example_error():
    """The shipped Keras model (Embedding, LSTM, Dense), quantized: the largest difference of its
    sigmoid outputs from float32 over 64 random token sequences, as docs/guides/serving.md states it."""
    model = cudnn_rnn.load_keras(os.path.join(HERE, "..", "examples", "sentiment.h5")).eval()
    q = cudnn_rnn.quantize_dynamic(model)
    vocab = next(m for m in model.modules() if type(m).__name__ == "Embedding").embeddings.shape[0]
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, vocab, (64, 20), generator=g)
    tokens[::3, 14:] = 0  # padded (masked) tails
    with torch.no_grad():
        want, got = model(tokens), q(tokens)
    err = (got - want).abs().max().item()
    assert 0 < err < 0.01, err


def test_bad_input():
    with pytest.raises(RuntimeError, match="linear_int8: x \\[..., 4\\]"):
        torch.ops.cudnn_rnn.linear_int8(torch.randn(2, 3), torch.randn(4, 5), None)
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.cudnn_rnn.linear_int8(torch.randn(2, 4).double(), torch.randn(4, 5).double(), None)
    q = cudnn_rnn.quantize_dynamic(cudnn_rnn.GRU(4, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="a quantized layer takes float32 CPU tensors"):
        q(torch.randn(1, 2, 4, dtype=torch.float64))


@needs_both
def test_builds_give_the_same_bits():
    """AVX2's vpmaddubsw on the values' magnitudes and the signed weights makes vpdpbusd's int32
    sums, and the same float32 epilogue follows: a quantized LSTM and a linear_int8 give the same
    bits on every build this CPU runs, in either order of builds (all read the same packs)."""
    g = torch.Generator().manual_seed(11)
    lstm = cudnn_rnn.LSTM(40, 96, return_sequences=True)
    q = cudnn_rnn.quantize_dynamic(lstm)
    x = torch.randn(5, 9, 40, generator=g)
    kernel, bias, xs = torch.randn(40, 70, generator=g), torch.randn(70, generator=g), torch.randn(7, 40, generator=g)
    out = {}
    try:
        names = ["avx512_vnni", "avx2"] + (["avx_vnni"] if _C._testing.cpu_int8_gemm_avx_vnni() else [])
        for order in (tuple(names), tuple(reversed(names))):
            for name in order:
                _C._testing.override_int8_gemm_isa(name)
                with torch.no_grad():
                    out[order, name] = (q(x), torch.ops.cudnn_rnn.linear_int8(xs, kernel, bias))
            cudnn_rnn.empty_cpu_cache()  # the next order packs for its first build
    finally:
        _C._testing.override_int8_gemm_isa("")
    first = next(iter(out.values()))
    for got in out.values():
        assert torch.equal(got[0], first[0]) and torch.equal(got[1], first[1])


def _flushing_subnormals() -> bool:
    return (torch.tensor([1e-40]) * 1.0).item() == 0.0


@pytest.fixture
def thread_keeps_subnormals():
    """This thread computes with subnormal floats, whatever mode the process left it in (a library
    built with -ffast-math sets flush-to-zero as it loads); restored afterwards."""
    was = _flushing_subnormals()
    torch.set_flush_denormal(False)
    yield
    torch.set_flush_denormal(was)


@needs_int8
def test_tiny_rows_where_the_thread_flushes_subnormals(build, thread_keeps_subnormals):
    """Where the thread treats subnormals as zero, a row of them is zero, and its products are
    zero, as float32's are."""
    kernel = torch.linspace(-1, 1, 8 * 20).reshape(8, 20)
    x = torch.full((2, 8), 1e-40)
    assert torch.set_flush_denormal(True), "this CPU cannot flush subnormals"
    got = torch.ops.cudnn_rnn.linear_int8(x, kernel, None)
    assert torch.equal(got, torch.zeros(2, 20)) and torch.equal(x @ kernel, got)


@needs_int8
def test_rows_with_nan_infinity_or_tiny_values(build, thread_keeps_subnormals):
    """A row holding a NaN or an infinity comes out NaN (not a finite guess); a row whose largest
    value is so small that 1 / scale overflows keeps its values' signs and, within its subnormal
    scale's few bits, their size; the other rows are untouched. A weight column holding a NaN or
    an infinity makes its products NaN. Every build the same bits."""
    kernel = torch.linspace(-1, 1, 8 * 20).reshape(8, 20)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(2))
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    x[3] = torch.full((8,), 1e-40)
    x[4] = torch.tensor([1e-40, -2e-40, 0.0, 3e-40, -1e-40, 0.0, 2e-40, 1e-40])
    got = torch.ops.cudnn_rnn.linear_int8(x, kernel, None)
    assert got[1:3].isnan().all()
    exact = x[3:].double() @ kernel.double()  # subnormal floats: a few significant bits
    top = exact.abs().max().item()
    large = exact.abs() > 0.2 * top
    assert (torch.sign(got[3:].double()) == torch.sign(exact))[large].all()
    torch.testing.assert_close(got[3:].double(), exact, rtol=0, atol=0.15 * top)
    torch.testing.assert_close(got[0].double(), _reference_linear(x[:1], kernel, None)[0], rtol=1e-5, atol=1e-5)
    bad = kernel.clone()
    bad[2, 4], bad[5, 9] = float("inf"), float("nan")
    with_bad = torch.ops.cudnn_rnn.linear_int8(x[:1], bad, None)
    assert with_bad[0, [4, 9]].isnan().all() and not with_bad[0, [0, 1, 2, 3, 5, 6, 7, 8]].isnan().any()
    runs = {"avx2": True, "avx_vnni": _C._testing.cpu_int8_gemm_avx_vnni(),
            "avx512_vnni": _C._testing.cpu_int8_gemm_avx512()}
    others = {}
    for name in runs:
        if name != build and runs[name]:
            _C._testing.override_int8_gemm_isa(name)
            others[name] = torch.ops.cudnn_rnn.linear_int8(x, kernel, None)
    _C._testing.override_int8_gemm_isa(build)
    for name, other in others.items():
        torch.testing.assert_close(other, got, rtol=0, atol=0, equal_nan=True, msg=f"{name} against {build}")
