"""bfloat16 / float16 on the CPU (computed in float32, bfloat16 with its GEMMs in bfloat16 where the
CPU has AMX or AVX512_BF16): the error against float32 is no more than
twice that of torch.nn in the same precision (the flash-attention rule), and gradients come
back in the caller's dtype."""
import copy
import os
import subprocess
import sys

import pytest
import torch

import cudnn_rnn


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_low_precision_error_at_most_twice_torch(cell, dtype):
    torch.manual_seed(0)
    layer = {"lstm": cudnn_rnn.LSTM, "gru": cudnn_rnn.GRU}[cell](16, 32, return_sequences=True).eval()
    reference = layer.to_torch().eval()
    x = torch.randn(8, 40, 16)
    with torch.no_grad():
        exact, exact_ref = layer(x), reference(x)[0]
        ours = copy.deepcopy(layer).to(dtype)(x.to(dtype)).float()
        theirs = copy.deepcopy(reference).to(dtype)(x.to(dtype))[0].float()
    ours_err = (ours - exact).abs().max().item()
    torch_err = (theirs - exact_ref).abs().max().item()
    assert ours_err <= 2 * torch_err + 1e-6, f"ours {ours_err:.2e} vs torch.nn {torch_err:.2e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_gradients(dtype):
    torch.manual_seed(0)
    layer = cudnn_rnn.GRU(6, 5, reset_after=False, return_sequences=True)
    x = torch.randn(3, 7, 6, requires_grad=True)
    layer(x).sum().backward()
    low = copy.deepcopy(layer).to(dtype)
    low.zero_grad()
    xl = x.detach().to(dtype).requires_grad_(True)
    low(xl).float().sum().backward()
    assert xl.grad.dtype == dtype and all(p.grad.dtype == dtype for p in low.parameters())
    torch.testing.assert_close(xl.grad.float(), x.grad, atol=5e-2, rtol=5e-2)
    for p, q in zip(low.parameters(), layer.parameters()):
        torch.testing.assert_close(p.grad.float(), q.grad, atol=1e-1, rtol=5e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cls", [cudnn_rnn.LSTM, cudnn_rnn.GRU, cudnn_rnn.SimpleRNN])
def test_layers_built_in_low_precision(cls, dtype):
    """dtype=bfloat16 / float16 at construction: the Keras initializers (orthogonal included,
    which torch cannot compute in these dtypes) are drawn in float32 and rounded."""
    torch.manual_seed(0)
    layer = cls(5, 8, dtype=dtype)
    assert all(p.dtype == dtype and torch.isfinite(p).all() for p in layer.parameters())
    k = layer.recurrent_kernel.float()  # [u, G*u], orthogonal rows
    torch.testing.assert_close(k @ k.t(), torch.eye(8), atol=3e-2, rtol=0)
    assert layer(torch.randn(2, 3, 5, dtype=dtype)).dtype == dtype


def _grads(layer, x, mask, g):
    x = x.detach().clone().requires_grad_(True)
    y = layer(x, mask=mask)
    (y.float() * g).sum().backward()
    return y.float(), x.grad.float(), [p.grad.float() for p in layer.parameters()]


BF16_LAYERS = {
    "lstm": lambda I, U: cudnn_rnn.LSTM(I, U, return_sequences=True),
    "gru": lambda I, U: cudnn_rnn.GRU(I, U, return_sequences=True),
    "simple_rnn": lambda I, U: cudnn_rnn.SimpleRNN(I, U, return_sequences=True),
    # the inner layer reads (and its gradients are laid out) time-major
    "lstm-2layer": lambda I, U: cudnn_rnn.LSTM(I, U, num_layers=2, return_sequences=True),
    "gru-2layer": lambda I, U: cudnn_rnn.GRU(I, U, num_layers=2, return_sequences=True),
    # the backward direction reads x from the last step down
    "bidirectional-lstm": lambda I, U: cudnn_rnn.Bidirectional(cudnn_rnn.LSTM(I, U, return_sequences=True)),
}


@pytest.mark.parametrize("split", ["units", "rows"])
@pytest.mark.parametrize("cell", list(BF16_LAYERS))
def test_bfloat16_gemms_error_at_most_twice_torch(cell, split):
    """bfloat16 with its GEMMs in bfloat16 where this CPU has them (_C.cpu_bf16_gemms(): AMX or
    AVX512_BF16; else float32 throughout): outputs, input and weight gradients against a float32
    run, no more than twice torch.nn's bfloat16 error against its own float32 run. Sizes that
    split units across threads, odd depths (the micro-kernel pads them), and a padded batch; the
    time loop's two splits forced (LSTM and SimpleRNN run rows apart: each row group's rows in
    place, or gathered where the mask leaves holes; GRU keeps its unit blocks)."""
    torch.manual_seed(0)
    B, T, I, U = 64, 7, 23, 211  # 211 units: unit blocks split across threads, an odd depth
    layer = BF16_LAYERS[cell](I, U)
    with torch.no_grad():
        for p in layer.parameters():
            p.uniform_(-0.2, 0.2)
    layer.bfloat16().float()  # weights that bfloat16 holds exactly: the error is the computation's
    reference = layer.to_torch()
    x = torch.randn(B, T, I).bfloat16().float()
    g = torch.randn(B, T, 2 * U if cell.startswith("bidirectional") else U)
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,))[:, None]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    cudnn_rnn._C._testing.override_cpu_split(split)
    try:
        def torch_run(module, dtype):
            xx = x.detach().to(dtype).clone().requires_grad_(True)
            y = module(xx)[0]
            (y.float() * g).sum().backward()
            return y.float(), xx.grad.float(), [p.grad.float() for p in module.parameters()]

        t32 = torch_run(copy.deepcopy(reference), torch.float32)
        t16 = torch_run(copy.deepcopy(reference).bfloat16(), torch.bfloat16)
        torch_err = [(t16[0] - t32[0]).abs().max(), (t16[1] - t32[1]).abs().max(),
                     max((a - b).abs().max() / b.abs().max() for a, b in zip(t16[2], t32[2]))]
        for m in (None, mask):
            o32 = _grads(copy.deepcopy(layer), x, m, g)
            o16 = _grads(copy.deepcopy(layer).bfloat16(), x.bfloat16(), m, g)
            ours_err = [(o16[0] - o32[0]).abs().max(), (o16[1] - o32[1]).abs().max(),
                        max((a - b).abs().max() / b.abs().max() for a, b in zip(o16[2], o32[2]))]
            for what, ours, theirs in zip(("output", "input gradient", "weight gradients (relative)"), ours_err, torch_err):
                assert ours <= 2 * theirs + 1e-6, f"{what} {'masked' if m is not None else ''}: ours {ours:.2e} vs torch.nn {theirs:.2e}"
    finally:
        cudnn_rnn._C._testing.override_cpu_split("")
        torch.set_num_threads(before)


def test_bfloat16_gemms_switch():
    """CUDNN_RNN_CPU_BF16=float32 computes bfloat16 calls in float32; anything else but
    'bfloat16' is refused with the variable's name."""
    probe = "import cudnn_rnn; print(cudnn_rnn._C.cpu_bf16_gemms())"
    off = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "CUDNN_RNN_CPU_BF16": "float32"},
                         capture_output=True, text=True, timeout=120)
    assert off.returncode == 0 and off.stdout.strip() == "False", off.stderr[-2000:]
    bad = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "CUDNN_RNN_CPU_BF16": "fp8"},
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "CUDNN_RNN_CPU_BF16" in bad.stderr


@pytest.mark.parametrize("cls", [cudnn_rnn.LSTM, cudnn_rnn.GRU])
def test_bfloat16_weight_gradients_hold_only_their_own_memory(cls):
    """A bfloat16 layer's weight gradients (masked batch: the GEMMs over the real rows only, the
    kernel's and recurrent kernel's gradients one stacked product) are tensors of their own, not
    views keeping the whole product alive."""
    torch.manual_seed(0)
    layer = cls(23, 211, return_sequences=True).bfloat16()
    x = torch.randn(8, 10, 23).bfloat16().requires_grad_(True)
    mask = torch.zeros(8, 10, dtype=torch.bool)
    mask[:, :2] = True
    layer(x, mask=mask).float().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad.dtype == torch.bfloat16, name
        assert p.grad.untyped_storage().nbytes() == p.grad.numel() * p.grad.element_size(), name


@pytest.mark.parametrize("case", ["lstm-holes-3threads", "lstm-backwards-dropout", "simple_rnn-2layer", "bidirectional"])
def test_bfloat16_row_split_equals_the_unit_blocks(case):
    """bfloat16 LSTM / SimpleRNN on the AVX512_BF16 kernel with the time loop's two splits forced:
    the row split (each thread its batch rows through every step, converting its own rows) gives
    the unit blocks' outputs, input and weight gradients bit for bit, and the unit blocks are
    themselves held to torch.nn above (the bias gradients, summed per row group in float64, may
    differ in the last place). Uneven row groups (11 rows on 3 threads), masks with holes,
    go_backwards, the hoisted projection of input dropout, a second layer reading time-major x."""
    if cudnn_rnn._C.cpu_bf16_gemm_kernel() != "avx512_bf16":
        pytest.skip("needs the AVX512_BF16 kernel (this CPU has no AVX512_BF16, or runs AMX's)")
    torch.manual_seed(3)
    threads = 3 if case == "lstm-holes-3threads" else 2
    make = {"lstm-holes-3threads": lambda: cudnn_rnn.LSTM(9, 45, return_sequences=True),
            "lstm-backwards-dropout": lambda: cudnn_rnn.LSTM(9, 45, return_sequences=True, go_backwards=True,
                                                             dropout=0.3, seed=5),
            "simple_rnn-2layer": lambda: cudnn_rnn.SimpleRNN(9, 33, num_layers=2, return_sequences=True),
            "bidirectional": lambda: cudnn_rnn.Bidirectional(cudnn_rnn.LSTM(9, 17, return_sequences=True))}[case]
    layer = make().bfloat16()
    B, T = 11, 6
    x = torch.randn(B, T, 9).bfloat16()
    mask = torch.rand(B, T) > 0.3
    mask[:, 0] = True
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    results = {}
    try:
        for split in ("units", "rows"):
            cudnn_rnn._C._testing.override_cpu_split(split)
            inner = layer.forward_layer if isinstance(layer, cudnn_rnn.Bidirectional) else layer
            assert cudnn_rnn.explain(inner, "cpu", mask=mask).plan[-1].startswith(f"steps split by {split}")
            torch.manual_seed(7)  # (the same dropout masks)
            copy_ = copy.deepcopy(layer).train(case == "lstm-backwards-dropout")
            xx = x.clone().requires_grad_(True)
            y = copy_(xx, mask=mask)
            (y.float() * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
            results[split] = [y, xx.grad] + [(n, p.grad) for n, p in copy_.named_parameters()]
    finally:
        cudnn_rnn._C._testing.override_cpu_split("")
        torch.set_num_threads(before)
    units, rows = results["units"], results["rows"]
    assert torch.equal(units[0], rows[0]) and torch.equal(units[1], rows[1])
    for (name, a), (_, b) in zip(units[2:], rows[2:]):
        if "bias" in name:
            torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-6, msg=name)
        else:
            assert torch.equal(a, b), name
