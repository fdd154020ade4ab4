"""torch.autograd.gradcheck (float64) of the op for every cell, with masks, dropout, stacks and
both directions; torch.library.opcheck of the op; torch.compile(fullgraph=True) of a model."""
import copy
import itertools
import os
import subprocess
import sys

import pytest
import torch

import cudnn_rnn
from cudnn_rnn import ops
from cudnn_rnn.cells import GATES as CELLS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _weights(cell, reset_after, use_bias, num_layers, dirs, in_size, units, gen):
    g = CELLS[cell]
    ws = []
    for l in range(num_layers):
        width = in_size if l == 0 else dirs * units
        for _ in range(dirs):
            ws.append(torch.randn(width, g * units, dtype=torch.float64, generator=gen) * 0.5)
            ws.append(torch.randn(units, g * units, dtype=torch.float64, generator=gen) * 0.5)
            if use_bias:
                shape = (2, g * units) if cell == "gru" and reset_after else (g * units,)
                ws.append(torch.randn(shape, dtype=torch.float64, generator=gen) * 0.5)
    return [w.requires_grad_(True) for w in ws]


def _case(cell, *, reset_after=True, use_bias=True, num_layers=1, bidirectional=False, go_backwards=False,
          zero_output=False, mask_kind=None, dropout=False, activation="tanh", recurrent_activation="sigmoid",
          with_state=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    B, T, I, u = 3, 5, 4, 3
    dirs = 2 if bidirectional else 1
    x = torch.randn(B, T, I, dtype=torch.float64, generator=gen).requires_grad_(True)
    ws = _weights(cell, reset_after, use_bias, num_layers, dirs, I, u, gen)
    mask = None
    if mask_kind == "right":
        mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    elif mask_kind == "holes":
        mask = torch.tensor([[0, 1, 0, 1, 1], [1, 1, 0, 0, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    h0 = torch.randn(num_layers * dirs, B, u, dtype=torch.float64, generator=gen).requires_grad_(True) if with_state else None
    c0 = (torch.randn(num_layers * dirs, B, u, dtype=torch.float64, generator=gen).requires_grad_(True)
          if with_state and cell == "lstm" else None)
    dm, rdm = [], []
    if dropout:
        g = CELLS[cell]
        for l in range(num_layers):
            width = I if l == 0 else dirs * u
            for _ in range(dirs):
                dm.append((torch.rand(g, B, width, generator=gen) > 0.3).double() / 0.7)
                rdm.append((torch.rand(g, B, u, generator=gen) > 0.3).double() / 0.7)
    config = dict(cell=cell, activation=activation, recurrent_activation=recurrent_activation, use_bias=use_bias,
                  reset_after=reset_after, num_layers=num_layers, bidirectional=bidirectional,
                  go_backwards=go_backwards, zero_output_for_mask=zero_output)
    return x, ws, mask, h0, c0, dm, rdm, config


def _gradcheck(x, ws, mask, h0, c0, dm, rdm, config):
    n = len(ws)
    has_h0, has_c0 = h0 is not None, c0 is not None

    def f(x, *rest):
        weights = list(rest[:n])
        h = rest[n] if has_h0 else None
        c = rest[n + has_h0] if has_c0 else None
        y, h_n, c_n, _ = ops.rnn_forward(x, weights, mask, h, c, dm, rdm, **config)
        return (y, h_n, c_n) if config["cell"] == "lstm" else (y, h_n)

    inputs = [x, *ws] + ([h0] if has_h0 else []) + ([c0] if has_c0 else [])
    assert torch.autograd.gradcheck(f, inputs, atol=1e-6, rtol=1e-5)


GRID = [
    dict(cell=c, reset_after=ra, mask_kind=m)
    for c, ra, m in itertools.product(["lstm", "gru", "simple_rnn"], [True, False], [None, "right", "holes"])
    if not (c != "gru" and not ra)
]


@pytest.mark.parametrize("case", GRID, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_gradcheck_cells_and_masks(case):
    _gradcheck(*_case(**case))


@pytest.mark.parametrize("cell,reset_after", [("lstm", True), ("gru", True), ("gru", False), ("simple_rnn", True)])
@pytest.mark.parametrize("variant", [
    dict(bidirectional=True, num_layers=2, mask_kind="holes"),
    dict(go_backwards=True, num_layers=2, mask_kind="holes", zero_output=True),
    dict(go_backwards=True, bidirectional=True, mask_kind="right"),
    dict(dropout=True, num_layers=2, mask_kind="holes"),
    dict(use_bias=False, with_state=False, activation="softsign", recurrent_activation="hard_sigmoid"),
    dict(activation="elu", recurrent_activation="hard_sigmoid_keras2", mask_kind="holes", zero_output=True),
], ids=["bi-stack", "backwards-stack", "backwards-bi", "dropout", "nobias", "activations"])
def test_gradcheck_variants(cell, reset_after, variant):
    _gradcheck(*_case(cell, reset_after=reset_after, **variant))


@pytest.mark.parametrize("cell,reset_after", [("lstm", True), ("gru", True), ("gru", False), ("simple_rnn", True)])
def test_opcheck(cell, reset_after):
    for kwargs in (dict(mask_kind="holes"), dict(bidirectional=True, num_layers=2, dropout=True, with_state=False)):
        x, ws, mask, h0, c0, dm, rdm, config = _case(cell, reset_after=reset_after, **kwargs)
        args = (x, ws, mask, h0, c0, dm, rdm, *ops.RnnSpec(**config).args())
        torch.library.opcheck(torch.ops.cudnn_rnn.rnn_forward.default, args)
        no_grad = tuple(a.detach() if isinstance(a, torch.Tensor) else
                        ([t.detach() for t in a] if isinstance(a, list) else a) for a in args)
        torch.library.opcheck(torch.ops.cudnn_rnn.rnn_forward.default, no_grad)


def test_opcheck_backward_op():
    x, ws, mask, h0, c0, dm, rdm, config = _case("gru", reset_after=False, mask_kind="holes", dropout=True)
    y, h_n, c_n, reserve = ops.rnn_forward(x, ws, mask, h0, c0, dm, rdm, **config)
    args = (torch.randn_like(y), torch.randn_like(h_n), c_n.new_zeros(c_n.shape), x.detach(), [w.detach() for w in ws],
            mask, dm, rdm, reserve.detach(), *ops.RnnSpec(**config).args())
    torch.library.opcheck(torch.ops.cudnn_rnn.rnn_backward.default, args)


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(6, 8)
        self.lstm = cudnn_rnn.Bidirectional(cudnn_rnn.LSTM(8, 5, return_sequences=True), merge_mode="sum")
        self.gru = cudnn_rnn.GRU(5, 4, reset_after=False, recurrent_activation="hard_sigmoid", return_state=True)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x, mask):
        h = self.lstm(torch.relu(self.embed(x)), mask=mask)
        out, state = self.gru(h, mask=mask)
        return self.head(torch.cat([out, state], -1))


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph(dynamic):
    torch._dynamo.reset()  # compiled forwards of earlier tests count toward the recompile limit
    torch.manual_seed(0)
    model = _Model().eval()
    x = torch.randn(3, 7, 6)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 5:] = False
    mask[2, :2] = False
    compiled = torch.compile(model, fullgraph=True, dynamic=dynamic)
    torch.testing.assert_close(compiled(x, mask), model(x, mask))
    # training step through the compiled graph (AOT autograd uses the registered backward)
    model.train()
    x.requires_grad_(True)
    compiled(x, mask).sum().backward()
    g_compiled = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x, mask).sum().backward()
    for a, b in zip(g_compiled, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(a, b)


def test_torch_compile_traces_the_layers_without_warnings():
    """A fresh process (Dynamo warns once a process): compiling and exporting the layers prints no
    warning of Dynamo's about the layers' Python (it warns at every functools.lru_cache wrapper it
    traces through, "silent incorrectness is a potential risk")."""
    code = """if True:
        import warnings
        warnings.simplefilter("default")
        import torch, cudnn_rnn
        x = torch.randn(2, 5, 4)
        for layer in (cudnn_rnn.LSTM(4, 3, return_sequences=True), cudnn_rnn.GRU(4, 3, return_state=True),
                      cudnn_rnn.Bidirectional(cudnn_rnn.SimpleRNN(4, 3, return_sequences=True))):
            layer.eval()
            torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
            torch.export.export(layer, (x,))
        print("compiled")
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0 and "compiled" in out.stdout, out.stderr[-3000:]
    assert "Warning" not in out.stderr, out.stderr[-3000:]


def test_layers_gradcheck_through_module():
    """The module path (initial_state list, Bidirectional merge, last-step slicing) is differentiable."""
    torch.manual_seed(0)
    layer = cudnn_rnn.Bidirectional(cudnn_rnn.GRU(3, 2, return_state=True, dtype=torch.float64), merge_mode="mul").eval()
    x = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    s = [torch.randn(2, 2, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]], dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda x, a, b: tuple(layer(x, mask=mask, initial_state=[a, b])), (x, *s))


def test_torch_export_roundtrip():
    torch.manual_seed(0)
    model = _Model().eval()
    x = torch.randn(3, 7, 6)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[0, 4:] = False
    exported = torch.export.export(model, (x, mask))
    assert any(n.target == torch.ops.cudnn_rnn.rnn_forward.default for n in exported.graph.nodes)
    torch.testing.assert_close(exported.module()(x, mask), model(x, mask))


def test_non_contiguous_inputs_compile_and_opcheck():
    """Time-major data passed transposed: the fake kernels must report the kernels' (contiguous)
    gradient layout, or compiled backward fails on strides."""
    torch.manual_seed(0)
    layer = cudnn_rnn.GRU(3, 4, return_sequences=True)
    xt = torch.randn(6, 2, 3, requires_grad=True)  # (time, batch, features)

    def loss(xt):
        return layer(xt.transpose(0, 1)).square().sum()

    compiled = torch.compile(loss, fullgraph=True)
    g_compiled, = torch.autograd.grad(compiled(xt), xt)
    g_eager, = torch.autograd.grad(loss(xt), xt)
    torch.testing.assert_close(g_compiled, g_eager)
    x, ws, mask, h0, c0, dm, rdm, config = _case("lstm", mask_kind="holes")
    y, h_n, c_n, reserve = ops.rnn_forward(x, ws, mask, h0, c0, dm, rdm, **config)
    xt_nc = x.detach().transpose(0, 1).contiguous().transpose(0, 1)  # dense, not contiguous
    args = (torch.randn_like(y), torch.randn_like(h_n), torch.randn_like(c_n), xt_nc, [w.detach() for w in ws],
            mask, dm, rdm, reserve.detach(), *ops.RnnSpec(**config).args())
    torch.library.opcheck(torch.ops.cudnn_rnn.rnn_backward.default, args)


def test_second_derivatives_refuse_loudly():
    layer = cudnn_rnn.LSTM(3, 4)
    x = torch.randn(2, 5, 3, requires_grad=True)
    g, = torch.autograd.grad(layer(x).sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="second derivatives"):
        g.square().sum().backward()


def test_gradient_of_the_initial_state_alone():
    """Only h0 / c0 require grad (frozen input and weights): the graph is still built."""
    x, ws, mask, h0, c0, dm, rdm, config = _case("lstm", mask_kind="holes", num_layers=2, bidirectional=True)
    x, ws = x.detach(), [w.detach() for w in ws]
    f = lambda h, c: ops.rnn_forward(x, ws, mask, h, c, dm, rdm, **config)[:3]
    assert torch.autograd.gradcheck(f, (h0, c0))


def test_no_graph_without_inputs_that_require_grad():
    x, ws, mask, h0, c0, dm, rdm, config = _case("gru", mask_kind="right")
    frozen = [w.detach() for w in ws]
    out = ops.rnn_forward(x.detach(), frozen, mask, h0.detach(), None, dm, rdm, **config)
    assert all(t.grad_fn is None and not t.requires_grad for t in out)
    with torch.no_grad():
        out = ops.rnn_forward(x, ws, mask, h0, None, dm, rdm, **config)
    assert all(not t.requires_grad for t in out)
    y, h_n, _, reserve = ops.rnn_forward(x, ws, mask, h0, None, dm, rdm, **config)
    assert y.requires_grad and h_n.requires_grad and not reserve.requires_grad


def test_input_modified_in_place_after_forward_is_caught():
    """x is saved for the weight gradients: changing it before backward must raise, not be read."""
    x, ws, mask, h0, c0, dm, rdm, config = _case("simple_rnn")
    z = x * 1.0
    y = ops.rnn_forward(z, ws, mask, h0, c0, dm, rdm, **config)[0]
    with torch.no_grad():
        z.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_unused_outputs_need_no_gradient():
    """Only h_n used: backward still runs (zero gradient for the sequence output)."""
    layer = cudnn_rnn.GRU(3, 4, return_state=True, dtype=torch.float64)
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: layer(x)[1], (x,))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mask_kind", ["holes", None])
@pytest.mark.parametrize("cell,reset_after", [("lstm", True), ("gru", True), ("gru", False), ("simple_rnn", True)])
def test_inference_path_equals_training_path(cell, reset_after, mask_kind, dtype):
    """Without autograd the CPU keeps no per-step activations (one step of scratch, the fused
    float32 rows writing none) and two state slots instead of T + 1: the outputs and final
    states must not change. float64 runs the same arithmetic and must match bit for bit; in
    float32 inference may add the input product into the recurrent one inside the loop (the
    packed plan's in-loop projection, LSTM and SimpleRNN) where training adds a hoisted
    projection, a different association of the same sums: within float32 rounding."""
    x, ws, mask, h0, c0, dm, rdm, config = _case(cell, reset_after=reset_after, bidirectional=True, num_layers=2,
                                                 mask_kind=mask_kind)
    x, h0, c0 = (t.detach().to(dtype).requires_grad_() if t is not None else None for t in (x, h0, c0))
    ws = [w.detach().to(dtype).requires_grad_() for w in ws]
    trained = ops.rnn_forward(x, ws, mask, h0, c0, dm, rdm, **config)
    with torch.no_grad():
        inferred = ops.rnn_forward(x, ws, mask, h0, c0, dm, rdm, **config)
    for a, b in zip(trained[:3], inferred[:3]):
        if dtype == torch.float64:
            assert torch.equal(a.detach(), b)
        else:
            torch.testing.assert_close(b, a.detach(), atol=2e-6, rtol=2e-6)
    assert inferred[3].numel() < trained[3].numel()


def _dropout_layer(kind, seed):
    if kind == "bidirectional":
        return cudnn_rnn.Bidirectional(cudnn_rnn.GRU(6, 5, dropout=0.3, recurrent_dropout=0.25, seed=seed,
                                                     return_sequences=True))
    if kind == "conv_lstm":
        return cudnn_rnn.ConvLSTM1D(6, 3, 3, padding="same", dropout=0.3, recurrent_dropout=0.25, seed=seed,
                                    return_sequences=True)
    cls = {"lstm": cudnn_rnn.LSTM, "gru": cudnn_rnn.GRU, "simple_rnn": cudnn_rnn.SimpleRNN}[kind]
    return cls(6, 5, dropout=0.3, recurrent_dropout=0.25, seed=seed, return_sequences=True, num_layers=2)


@pytest.mark.parametrize("seed", [None, 7])
@pytest.mark.parametrize("kind", ["lstm", "gru", "simple_rnn", "bidirectional", "conv_lstm"])
def test_compile_with_dropout_under_changing_shapes(kind, seed):
    """Training-mode dropout and recurrent dropout compile with fullgraph=True and dynamic shapes
    (the last batch smaller, another length): no graph break, no recompile per shape failing.
    Seeded layers give the same masks compiled and eager (the counter-based draws of _random.py),
    a new mask per call, and the same gradients."""
    torch._dynamo.reset()  # compiled forwards of earlier tests count toward the recompile limit
    torch.manual_seed(0)
    eager = _dropout_layer(kind, seed).train()
    compiled_layer = copy.deepcopy(eager)
    compiled = torch.compile(compiled_layer, fullgraph=True, dynamic=True)
    shapes = [(4, 9), (3, 9), (4, 6), (2, 11)]
    outputs = []
    for b, t in shapes:
        x = torch.randn(b, t, 6) if kind != "conv_lstm" else torch.randn(b, t, 5, 6)
        y = compiled(x)
        y.square().sum().backward()
        assert y.shape[:2] == (b, t)
        outputs.append(y.detach())
        if seed is not None:
            y_eager = eager(x)
            torch.testing.assert_close(y, y_eager, msg=lambda m: f"compiled and eager seeded masks differ: {m}")
            y_eager.square().sum().backward()
    if seed is not None:
        for p, q in zip(eager.parameters(), compiled_layer.parameters()):
            torch.testing.assert_close(q.grad, p.grad)
    # dropout really applied: a fresh mask per call gives another output for the same input
    x = torch.randn(3, 8, 6) if kind != "conv_lstm" else torch.randn(3, 8, 5, 6)
    assert not torch.allclose(compiled(x), compiled(x))


def test_seeded_layers_repeat_their_masks_from_the_same_state():
    a = cudnn_rnn.LSTM(4, 3, dropout=0.5, recurrent_dropout=0.5, seed=11, return_sequences=True).train()
    b, fresh = copy.deepcopy(a), copy.deepcopy(a)
    x = torch.randn(2, 5, 4)
    torch.testing.assert_close(a(x), b(x))  # same seed, same number of draws: same masks
    assert not torch.allclose(a(x), a(x))   # then each call draws new ones
    c = cudnn_rnn.LSTM(4, 3, dropout=0.5, recurrent_dropout=0.5, seed=12, return_sequences=True).train()
    with torch.no_grad():
        for p, q in zip(c.parameters(), fresh.parameters()):
            p.copy_(q)
    assert not torch.allclose(c(x), fresh(x))  # another seed, other masks


def test_torch_func_transforms_are_refused_as_the_readme_says():
    """docs/limits.md: the C++ autograd Function cannot be transformed by functorch; the refusal
    is torch's own clear error, not a wrong result."""
    layer = cudnn_rnn.LSTM(3, 4)
    with pytest.raises(RuntimeError, match="cannot use C\\+\\+ torch::autograd::Function with functorch"):
        torch.func.grad(lambda x: layer(x).sum())(torch.randn(2, 5, 3))
