"""The CUDA backends. Tests marked `cuda` need a GPU (conftest skips them, with that reason,
where there is none); the build check runs everywhere."""
import os
import shutil
import subprocess

import pytest
import torch

import cudnn_rnn
from cudnn_rnn import ops

cuda = pytest.mark.cuda
LAYERS = {"lstm": cudnn_rnn.LSTM, "gru": cudnn_rnn.GRU, "simple_rnn": cudnn_rnn.SimpleRNN}


@pytest.fixture(autouse=True)
def full_float32():
    """The comparisons here are in full float32. torch's default lets cuDNN (and so this extension's
    cuDNN calls, which follow torch.backends.cudnn.allow_tf32) use TF32 tensor cores from Ampere
    on: errors near 1e-3 against the CPU."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_cuda_build_links_the_cudnn_rnn_entry_points():
    """A CPU-only build must never pass for a CUDA one: in a CUDA build the extension itself
    references the cuDNN RNN calls."""
    if cudnn_rnn.build_info()["cudnn"] == "no":
        assert os.environ.get("FORCE_CUDA") != "1", "FORCE_CUDA=1 but the extension was built without cuDNN"
        pytest.skip("CPU-only build (FORCE_CUDA unset and no CUDA toolchain)")
    nm = shutil.which("nm")
    assert nm, "nm (binutils) is needed to inspect the extension"
    symbols = subprocess.run([nm, "-D", "--undefined-only", cudnn_rnn._C.__file__], capture_output=True, text=True,
                             check=True).stdout
    for name in ("cudnnRNNForward", "cudnnRNNBackwardData_v8", "cudnnRNNBackwardWeights_v8",
                 "cudnnGetRNNWeightParams", "cudnnSetRNNDescriptor_v8", "cudnnSetRNNDataDescriptor"):
        assert name in symbols, f"{name} is not referenced by {cudnn_rnn._C.__file__}"


def _pair(cell, num_layers=1, bidirectional=False, dtype=torch.float32, **kw):
    torch.manual_seed(0)
    layer = LAYERS[cell](6, 5, num_layers=num_layers, return_sequences=True, return_state=True, dtype=dtype, **kw)
    if bidirectional:
        layer = cudnn_rnn.Bidirectional(layer)
    with torch.no_grad():
        for p in layer.parameters():
            p.uniform_(-0.5, 0.5)
    gpu = __import__("copy").deepcopy(layer).cuda()
    return layer.eval(), gpu.eval()


def _right_padded(batch, time, device="cpu"):
    lengths = torch.tensor([time, max(1, time - 2), 1, max(1, time // 2)])[:batch]
    return torch.arange(time)[None, :] < lengths[:, None]


CASES = [(c, l, bi) for c in LAYERS for l in (1, 2) for bi in (False, True)]


@cuda
@pytest.mark.parametrize("cell,num_layers,bidirectional", CASES)
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cudnn_matches_cpu_forward_and_gradients(cell, num_layers, bidirectional, masked, dtype):
    cpu, gpu = _pair(cell, num_layers, bidirectional, dtype)
    x = torch.randn(4, 7, 6, dtype=dtype)
    mask = _right_padded(4, 7) if masked else None
    assert cudnn_rnn.explain(gpu).backend == "cudnn"
    before = cudnn_rnn.cudnn_fallback_count()
    xc, xg = x.clone().requires_grad_(True), x.cuda().requires_grad_(True)
    out_c = cpu(xc, mask=mask)
    out_g = gpu(xg, mask=None if mask is None else mask.cuda())
    assert cudnn_rnn.cudnn_fallback_count() == before
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=1e-10, rtol=1e-10)
    for a, b in zip(out_c, out_g):
        torch.testing.assert_close(b.cpu(), a.detach(), **tol)
    grads = [torch.randn_like(t) for t in out_c]
    torch.autograd.backward(out_c, grads)
    torch.autograd.backward(out_g, [g.cuda() for g in grads])
    torch.testing.assert_close(xg.grad.cpu(), xc.grad, **tol)
    for (name, p), q in zip(cpu.named_parameters(), gpu.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, **tol, msg=lambda m: f"{name}: {m}")


@cuda
@pytest.mark.parametrize("cell", list(LAYERS))
@pytest.mark.parametrize("bidirectional", [False, True])
def test_cudnn_go_backwards_matches_cpu(cell, bidirectional):
    cpu, gpu = _pair(cell, 1, bidirectional, torch.float64, go_backwards=True)
    assert cudnn_rnn.explain(gpu).backend == "cudnn"
    x = torch.randn(3, 6, 6, dtype=torch.float64)
    xc, xg = x.clone().requires_grad_(True), x.cuda().requires_grad_(True)
    out_c, out_g = cpu(xc), gpu(xg)
    for a, b in zip(out_c, out_g):
        torch.testing.assert_close(b.cpu(), a.detach(), atol=1e-10, rtol=1e-10)
    torch.autograd.backward(out_c, [torch.ones_like(t) for t in out_c])
    torch.autograd.backward(out_g, [torch.ones_like(t) for t in out_g])
    torch.testing.assert_close(xg.grad.cpu(), xc.grad, atol=1e-10, rtol=1e-10)


@cuda
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_cudnn_matches_torch_nn(cell):
    cpu, gpu = _pair(cell, 2, True)
    reference = gpu.to_torch().cuda()
    x = torch.randn(4, 9, 6, device="cuda")
    torch.testing.assert_close(gpu(x)[0], reference(x)[0], atol=1e-5, rtol=1e-5)


@cuda
def test_float32_follows_torch_tf32_setting():
    """float32 cuDNN calls use TF32 tensor cores exactly when torch.backends.cudnn.allow_tf32 lets
    torch.nn's do so; their error is then of torch.nn's size."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("TF32 needs an Ampere or later GPU")
    torch.manual_seed(0)
    ours = cudnn_rnn.LSTM(128, 128, return_sequences=True).cuda().eval()
    reference = ours.to_torch().cuda()
    x = torch.randn(8, 20, 128, device="cuda")
    with torch.no_grad():
        exact, exact_ref = ours(x), reference(x)[0]
        torch.backends.cudnn.allow_tf32 = True
        tf32, tf32_ref = ours(x), reference(x)[0]
    ours_err, torch_err = (tf32 - exact).abs().max().item(), (tf32_ref - exact_ref).abs().max().item()
    torch.testing.assert_close(exact, exact_ref, atol=1e-5, rtol=1e-5)
    assert torch_err > 0, "torch.nn did not use TF32: the check cannot tell"
    assert 0 < ours_err <= 4 * torch_err, f"TF32 error: ours {ours_err:.2e}, torch.nn {torch_err:.2e}"


@cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_low_precision_error_at_most_twice_torch(cell, dtype):
    """fp16 / bf16: error against fp32 no more than 2x that of torch.nn in the same precision."""
    _, gpu = _pair(cell)
    reference = gpu.to_torch().cuda()
    x = torch.randn(8, 30, 6, device="cuda")
    exact = gpu(x)[0]
    exact_ref = reference(x)[0]
    ours = gpu.to(dtype)(x.to(dtype))[0].float()
    theirs = reference.to(dtype)(x.to(dtype))[0].float()
    ours_err = (ours - exact).abs().max().item()
    torch_err = (theirs - exact_ref).abs().max().item()
    assert ours_err <= 2 * torch_err + 1e-6, f"ours {ours_err:.2e} vs torch.nn {torch_err:.2e}"


@cuda
def test_retain_graph_backward_twice_is_identical():
    _, gpu = _pair("lstm", 2, True)
    gpu.train()
    x = torch.randn(4, 7, 6, device="cuda", requires_grad=True)
    loss = gpu(x)[0].square().sum()
    g1, = torch.autograd.grad(loss, x, retain_graph=True)
    g2, = torch.autograd.grad(loss, x)
    torch.testing.assert_close(g1, g2, rtol=0, atol=0)


@cuda
def test_cuda_graph_capture_and_replay():
    _, gpu = _pair("gru", 1, True)
    x = torch.randn(4, 7, 6, device="cuda")
    with torch.no_grad():
        expected = gpu(x)[0].clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            gpu(x)  # warm-up: builds the plan outside capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = gpu(x)[0]
        graph.replay()
        torch.testing.assert_close(out, expected)
        # A replay reads the weights as they are then: the captured call packed them, it did not
        # keep a packed copy.
        for p in gpu.parameters():
            p.mul_(0.5)
        graph.replay()
        torch.testing.assert_close(out, gpu(x)[0])
        assert not torch.allclose(out, expected)


@cuda
def test_inference_weight_space_follows_in_place_updates():
    """Inference keeps the packed cuDNN weight space across calls; an in-place write to any one
    weight (an optimizer step, copy_ under no_grad) must reach the next call."""
    cpu, gpu = _pair("lstm", 2, True)
    x = torch.randn(4, 7, 6)
    with torch.no_grad():
        torch.testing.assert_close(gpu(x.cuda())[0].cpu(), cpu(x)[0], atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(gpu(x.cuda())[0].cpu(), cpu(x)[0], atol=2e-5, rtol=2e-5)
        for p, q in zip(cpu.parameters(), gpu.parameters()):
            p.mul_(0.5)
            q.mul_(0.5)
            torch.testing.assert_close(gpu(x.cuda())[0].cpu(), cpu(x)[0], atol=2e-5, rtol=2e-5)
    # Training after inference reads the same weights, and its gradients match the CPU's.
    gpu.train(), cpu.train()
    xg, xc = x.cuda().requires_grad_(True), x.clone().requires_grad_(True)
    gpu(xg)[0].sum().backward()
    cpu(xc)[0].sum().backward()
    torch.testing.assert_close(xg.grad.cpu(), xc.grad, atol=2e-5, rtol=2e-5)


def _lstm_input_grad(forward_algorithm, backward_algorithm=None):
    """A training LSTM's output and the gradient of its sum with respect to x (the same layer and x
    on every call), the forward run under one cuDNN algorithm preference and the backward under
    another (default the same); the preference is "auto" again afterwards."""
    _, gpu = _pair("lstm")
    gpu.train()
    torch.manual_seed(3)
    x = torch.randn(8, 9, 6, device="cuda", requires_grad=True)
    try:
        cudnn_rnn.set_cudnn_algorithm(forward_algorithm)
        out = gpu(x)[0]
        cudnn_rnn.set_cudnn_algorithm(backward_algorithm or forward_algorithm)
        grad, = torch.autograd.grad(out.sum(), x)
    finally:
        cudnn_rnn.set_cudnn_algorithm("auto")
    return out.detach(), grad


@cuda
def test_backward_runs_the_forwards_algorithm():
    """The reserve's size records the algorithm that wrote it: a preference changed between a
    forward and its backward must not change the backward (it would read a persistent kernel's
    reserve as STANDARD's)."""
    _, g_same = _lstm_input_grad("persist_static_small_h")
    _, g_changed = _lstm_input_grad("persist_static_small_h", "standard")
    torch.testing.assert_close(g_changed, g_same, atol=0, rtol=0)


@cuda
def test_empty_cache_drops_kept_weight_spaces():
    """A write the version counter does not see (through .data) needs cudnn_rnn.empty_cache()."""
    cpu, gpu = _pair("gru")
    x = torch.randn(4, 7, 6)
    with torch.no_grad():
        before = gpu(x.cuda())[0].cpu()
        gpu.kernel.data.mul_(0.5)
        cpu.kernel.data.mul_(0.5)
        cudnn_rnn.empty_cache()
        torch.testing.assert_close(gpu(x.cuda())[0].cpu(), cpu(x)[0], atol=2e-5, rtol=2e-5)
    assert not torch.allclose(before, cpu(x)[0])


@cuda
def test_opcheck_and_compile_on_cuda():
    _, gpu = _pair("lstm", 1, True)
    x = torch.randn(3, 5, 6, device="cuda", requires_grad=True)
    mask = _right_padded(3, 5).cuda()
    sides = [gpu.forward_layer, gpu.backward_layer]
    weights = [w for s in sides for w in s.layer_weights(0)]
    spec = ops.RnnSpec(cell="lstm", bidirectional=True, zero_output_for_mask=True)
    args = (x, weights, mask, None, None, [], [], *spec.args(), True)
    # opcheck's AOT test compares every output byte for byte, the reserve too: cuDNN's reserve is
    # opaque scratch for the backward whose bytes differ between identical calls (seen on an H200,
    # cuDNN 9.19). The outputs and gradients under AOTAutograd are compared below instead.
    torch.library.opcheck(torch.ops.cudnn_rnn.rnn_forward.default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))

    def forward(x):
        return gpu(x, mask=mask)

    def outputs_and_grads(fn):
        out = fn(x)
        loss = sum(o.square().sum() for o in out)
        return (*out, *torch.autograd.grad(loss, [x, *weights]))

    compiled = torch.compile(forward, fullgraph=True, dynamic=True)
    for got, want in zip(outputs_and_grads(compiled), outputs_and_grads(forward)):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@cuda
def test_calls_cudnn_cannot_run_are_counted():
    _, gpu = _pair("gru", reset_after=False)
    before = cudnn_rnn.cudnn_fallback_count()
    gpu(torch.randn(2, 4, 6, device="cuda"))
    assert cudnn_rnn.cudnn_fallback_count() == before + 1


GENERIC = [
    ("gru", dict(reset_after=False), "holes"),
    ("lstm", dict(recurrent_activation="hard_sigmoid"), "right"),
    ("lstm", dict(go_backwards=True), "left"),
    ("simple_rnn", dict(activation="elu"), None),
    ("gru", dict(go_backwards=True, num_layers=2), "holes"),
    ("lstm", dict(), "left"),
    ("gru", dict(), "empty_row"),
]


def _mask(kind, batch, time):
    if kind is None:
        return None
    m = _right_padded(batch, time)
    if kind == "left":
        m = m.flip(1)
    elif kind == "holes":
        m = torch.rand(batch, time, generator=torch.Generator().manual_seed(1)) > 0.4
    elif kind == "empty_row":
        m[1] = False
    return m


@cuda
@pytest.mark.parametrize("cell,kw,mask_kind", GENERIC)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_generic_cuda_matches_cpu(cell, kw, mask_kind, bidirectional):
    kw = dict(kw)
    num_layers = kw.pop("num_layers", 1)
    cpu, gpu = _pair(cell, num_layers, bidirectional, torch.float64, **kw)
    x = torch.randn(4, 7, 6, dtype=torch.float64)
    mask = _mask(mask_kind, 4, 7)
    before = cudnn_rnn.cudnn_fallback_count()
    xc, xg = x.clone().requires_grad_(True), x.cuda().requires_grad_(True)
    out_c = cpu(xc, mask=mask)
    out_g = gpu(xg, mask=None if mask is None else mask.cuda())
    assert cudnn_rnn.cudnn_fallback_count() > before
    for a, b in zip(out_c, out_g):
        torch.testing.assert_close(b.cpu(), a.detach(), atol=1e-10, rtol=1e-10)
    grads = [torch.randn_like(t) for t in out_c]
    torch.autograd.backward(out_c, grads)
    torch.autograd.backward(out_g, [g.cuda() for g in grads])
    torch.testing.assert_close(xg.grad.cpu(), xc.grad, atol=1e-10, rtol=1e-10)
    for (name, p), q in zip(cpu.named_parameters(), gpu.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-10, rtol=1e-10, msg=lambda m: f"{name}: {m}")


@cuda
def test_generic_cuda_dropout_matches_cpu():
    cpu, gpu = _pair("gru", 2, False, torch.float64, reset_after=False, dropout=0.3, recurrent_dropout=0.4)
    cpu.train(), gpu.train()
    x = torch.randn(3, 6, 6, dtype=torch.float64)
    masks = cpu.dropout_masks(x, training=True)
    cpu.dropout_masks = lambda x, training: masks
    gpu.dropout_masks = lambda x, training: ([m.cuda() for m in masks[0]], [m.cuda() for m in masks[1]])
    torch.testing.assert_close(gpu(x.cuda())[0].cpu(), cpu(x)[0].detach(), atol=1e-10, rtol=1e-10)


@cuda
def test_generic_cuda_half_precision():
    cpu, gpu = _pair("gru", reset_after=False)
    x = torch.randn(4, 7, 6)
    exact = cpu(x)[0]
    half = gpu.half()(x.cuda().half())[0].float().cpu()
    torch.testing.assert_close(half, exact.detach(), atol=2e-2, rtol=2e-2)


@cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_generic_cuda_low_precision_backward(dtype):
    """float16 / bfloat16 on the generic path compute in float32: gradients come back in the
    caller's dtype and close to float32's."""
    _, gpu = _pair("gru", reset_after=False)
    x = torch.randn(4, 7, 6, device="cuda", requires_grad=True)
    gpu(x)[0].sum().backward()
    exact = x.grad.clone()
    low = __import__("copy").deepcopy(gpu).to(dtype)
    xl = x.detach().to(dtype).requires_grad_(True)
    low(xl)[0].float().sum().backward()
    assert xl.grad.dtype == dtype and all(p.grad.dtype == dtype for p in low.parameters())
    torch.testing.assert_close(xl.grad.float(), exact, atol=5e-2, rtol=5e-2)


@cuda
@pytest.mark.parametrize("algorithm", ["auto", "persist_static_small_h", "persist_static"])
def test_persistent_algorithms_match_standard(algorithm):
    """Each algorithm (or its remembered fallback to STANDARD) gives STANDARD's numbers, forward
    and backward."""
    out, g_ref = _lstm_input_grad("standard")
    out_p, g_p = _lstm_input_grad(algorithm)
    torch.testing.assert_close(out_p, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g_p, g_ref, atol=1e-5, rtol=1e-5)


@cuda
@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask_kind", ["steps", "positions"])
def test_conv_lstm_cuda_matches_cpu_forward_and_gradients(rank, dtype, mask_kind):
    """ConvLSTM on CUDA (cuDNN convolutions through ATen, the fused cell kernel) against the CPU
    backend, which the Keras tests pin: outputs, states and every gradient, with a mask (per step
    or per position), dropout masks, asymmetric 'same' padding and go_backwards."""
    torch.manual_seed(0)
    spatial = {1: (9,), 2: (6, 7), 3: (4, 5, 3)}[rank]
    layer = getattr(cudnn_rnn, f"ConvLSTM{rank}D")(3, 4, 2, padding="same", return_sequences=True, return_state=True,
                                                   go_backwards=True, dropout=0.3, recurrent_dropout=0.2, seed=1,
                                                   dtype=dtype)
    x = torch.randn(3, 5, *spatial, 3, dtype=dtype)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 1, 0, 1]], dtype=torch.bool)
    if mask_kind == "positions":
        mask = torch.rand(3, 5, *spatial) < 0.7
    state = (3, *spatial, 4)  # the op's layout: channels last
    dmask = (torch.rand(4, 3, *spatial, 3, dtype=dtype) > 0.3).to(dtype) / 0.7
    rmask = (torch.rand(4, *state, dtype=dtype) > 0.2).to(dtype) / 0.8
    gpu = __import__("copy").deepcopy(layer).cuda()
    layer.dropout_masks = lambda x_op, s, training: (dmask, rmask)
    gpu.dropout_masks = lambda x_op, s, training: (dmask.cuda(), rmask.cuda())
    xc, xg = x.clone().requires_grad_(True), x.cuda().requires_grad_(True)
    out_c, out_g = layer(xc, mask=mask), gpu(xg, mask=mask.cuda())
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-10, rtol=1e-10)
    for a, b in zip(out_c, out_g):
        torch.testing.assert_close(b.cpu(), a.detach(), **tol)
    sum(o.square().sum() for o in out_c).backward()
    sum(o.square().sum() for o in out_g).backward()
    torch.testing.assert_close(xg.grad.cpu(), xc.grad, **tol)
    for p, q in zip(layer.parameters(), gpu.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, **tol)


@cuda
def test_conv_lstm_cuda_under_autocast_and_compile():
    """Under torch.autocast the op still computes in its inputs' float32 (CUDA autocast would
    hand its convolutions float16), and it compiles without graph breaks on CUDA."""
    torch.manual_seed(0)
    layer = cudnn_rnn.ConvLSTM2D(3, 4, 3, padding="same", return_sequences=True).cuda()
    x = torch.randn(2, 4, 6, 6, 3, device="cuda")
    expected = layer(x)
    with torch.autocast("cuda"):
        got = layer(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected)
    compiled = torch.compile(layer, fullgraph=True)
    torch.testing.assert_close(compiled(x), expected, atol=1e-5, rtol=1e-5)
