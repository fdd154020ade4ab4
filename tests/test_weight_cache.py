"""The CPU weight cache (csrc/cpu/weight_cache.h): packed kernels are kept across calls while the
weight tensors are unchanged, and every way of changing a weight in place that PyTorch tracks
(an optimizer step, load_state_dict, copy_ under no_grad) makes the next call pack again. The
oracle is torch.nn with the same weights after each change."""
import copy

import pytest
import torch

import cudnn_rnn
from cudnn_rnn import _C

pytestmark = pytest.mark.skipif(not _C._testing.cpu_packed_gemm(),
                                reason="the packed engine (the one that caches) needs AVX2 + FMA")


@pytest.fixture(autouse=True)
def packed_engine():
    _C._testing.override_cpu_gemm_engine("packed")
    yield
    _C._testing.override_cpu_gemm_engine("")


def _packs():
    return _C._testing.weight_cache_packs()


LAYERS = {
    "lstm": lambda: cudnn_rnn.LSTM(24, 40, return_sequences=True),
    "gru": lambda: cudnn_rnn.GRU(24, 40, return_sequences=True),
    "simple_rnn": lambda: cudnn_rnn.SimpleRNN(24, 40, return_sequences=True),
}


@pytest.mark.parametrize("cell", list(LAYERS))
def test_inference_packs_once(cell):
    torch.manual_seed(0)
    layer = LAYERS[cell]().eval()
    x = torch.randn(3, 5, 24)
    with torch.no_grad():
        first = layer(x)
        before = _packs()
        for _ in range(3):
            assert torch.equal(layer(x), first)
        assert _packs() == before, "an unchanged layer packed its weights again"
        # one step at a time (streaming) reads the same packed kernels
        step = layer(x[:, :1])
        assert _packs() == before
    torch.testing.assert_close(step, first[:, :1])


@pytest.mark.parametrize("cell", list(LAYERS))
def test_optimizer_steps_invalidate(cell):
    """Training with SGD: after every step our outputs equal torch.nn's in float64 with the updated
    weights. The steps (lr=0.5) move the weights up to ~10 and the outputs by far more than the
    tolerance, which is float32's error at these weights (torch.nn's own float32 error reaches
    2e-5 here): outputs from stale packed weights would fail."""
    torch.manual_seed(1)
    layer = LAYERS[cell]()
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    x = torch.randn(4, 6, 24)
    previous = None
    for _ in range(4):
        before = _packs()
        layer.eval()
        with torch.no_grad():
            got = layer(x)
            want = layer.to_torch().double()(x.double())[0]
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
        if previous is not None:
            assert (previous.double() - want).abs().max() > 1e-2, "the step did not change the outputs"
        previous = got
        layer.train()
        opt.zero_grad()
        layer(x).pow(2).sum().backward()
        opt.step()
        assert _packs() > before


@pytest.mark.parametrize("how", ["copy_", "load_state_dict", "mul_", "data_then_empty_cache", "tied_parameter"])
def test_in_place_writes_invalidate(how):
    torch.manual_seed(2)
    layer = cudnn_rnn.LSTM(16, 32, return_sequences=True).eval()
    other = cudnn_rnn.LSTM(16, 32, return_sequences=True).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        layer(x)  # cached
        if how == "copy_":
            for p, q in zip(layer.parameters(), other.parameters()):
                p.copy_(q)
        elif how == "load_state_dict":
            layer.load_state_dict(other.state_dict())
        elif how == "mul_":
            for p, q in zip(layer.parameters(), other.parameters()):
                p.mul_(0).add_(q)
        elif how == "tied_parameter":  # a new Parameter on the same storage: its own counter, its own entry
            for name, q in other.named_parameters():
                tied = torch.nn.Parameter(getattr(layer, name).data)
                tied.copy_(q)  # bumps the tied tensor's counter to the value layer's tensor has
                setattr(layer, name, tied)
        else:  # a write the version counter does not see, then the documented remedy
            for p, q in zip(layer.parameters(), other.parameters()):
                p.data.copy_(q.data)
            cudnn_rnn.empty_cpu_cache()
        torch.testing.assert_close(layer(x), other(x), atol=0, rtol=0)


def test_temporary_weights_do_not_collide():
    """Weights made fresh for every call (a new tensor may reuse a freed one's address) are
    never mistaken for each other."""
    torch.manual_seed(3)
    x = torch.randn(2, 4, 8)
    for i in range(20):
        layer = cudnn_rnn.LSTM(8, 16, return_sequences=True).eval()
        with torch.no_grad():
            got = layer(x)
            want = layer.to_torch()(x)[0]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        del layer
    assert _C._testing.weight_cache_entries() <= 256


def test_inference_mode_and_deepcopy():
    torch.manual_seed(4)
    layer = cudnn_rnn.GRU(8, 16, return_sequences=True).eval()
    x = torch.randn(2, 4, 8)
    with torch.inference_mode():
        a = layer(x)
    twin = copy.deepcopy(layer)
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(0.1)
        torch.testing.assert_close(layer(x), a, atol=0, rtol=0)
        torch.testing.assert_close(twin(x), twin.to_torch()(x)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cell", list(LAYERS))
def test_streaming_one_step_at_a_time_equals_the_sequence(cell):
    """The streaming recipe (docs/guides/serving.md): T calls of one step, states passed in and out, give the
    whole sequence's outputs and final states (the weights packed once for all the calls)."""
    torch.manual_seed(6)
    layer = {"lstm": cudnn_rnn.LSTM, "gru": cudnn_rnn.GRU, "simple_rnn": cudnn_rnn.SimpleRNN}[cell](
        24, 40, return_sequences=True, return_state=True).eval()
    x = torch.randn(2, 12, 24)
    with torch.no_grad():
        full = layer(x)
        states = [torch.zeros(2, 40) for _ in full[1:]]
        before = _packs()
        steps = []
        for t in range(12):
            y, *states = layer(x[:, t:t + 1], initial_state=states)
            steps.append(y)
        assert _packs() == before
    torch.testing.assert_close(torch.cat(steps, 1), full[0], rtol=0, atol=1e-6)
    for a, b in zip(states, full[1:]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.skipif(_C.cpu_bf16_gemm_kernel() == "none", reason="no bfloat16 GEMM on this CPU (AMX or AVX512_BF16)")
@pytest.mark.parametrize("cell", list(LAYERS))
def test_bfloat16_panels_are_kept_and_follow_the_weights(cell):
    """bfloat16 inference packs its panels from the caller's bfloat16 weights once; an in-place
    update packs again. Oracle: the same layer in float32 with the bfloat16 weights, within
    bfloat16's rounding of the state."""
    torch.manual_seed(2)
    layer = LAYERS[cell]().to(torch.bfloat16).eval()
    reference = copy.deepcopy(layer).float()
    x = torch.randn(3, 5, 24).to(torch.bfloat16)
    with torch.no_grad():
        first = layer(x)
        before = _packs()
        assert torch.equal(layer(x), first)
        assert _packs() == before, "unchanged bfloat16 weights were packed again"
        torch.testing.assert_close(first.float(), reference(x.float()), atol=3e-2, rtol=3e-2)
        for p, q in zip(layer.parameters(), reference.parameters()):
            p.mul_(-0.5)
            q.copy_(p.float())
        again = layer(x)
        assert _packs() > before, "weights changed in place but the old panels were used"
        torch.testing.assert_close(again.float(), reference(x.float()), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("cell", list(LAYERS))
def test_float16_weights_float32_copies_follow_the_weights(cell):
    """A float16 call computes in float32 from float32 copies of the weights, kept across calls
    while the weights are unchanged. Training with SGD (lr=0.5, the outputs move far beyond the
    tolerance each step): every step's outputs and weight gradients equal a float32 layer's with
    the updated float16 weights, so a stale copy would fail; an unchanged layer converts nothing
    again."""
    torch.manual_seed(3)
    layer = LAYERS[cell]().to(torch.float16)
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    x = torch.randn(3, 5, 24).to(torch.float16)
    previous = None
    for _ in range(3):
        reference = copy.deepcopy(layer).float()
        out = layer(x)
        expected = reference(x.float())
        torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=2e-3)
        if previous is not None:  # the step moved the outputs: the old weights' would fail above
            assert (expected - previous).abs().max() > 0.1
        previous = expected.detach()
        out.float().sum().backward()
        expected.sum().backward()
        for p, q in zip(layer.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad.float(), q.grad, atol=2e-2, rtol=2e-3)
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        first = layer(x)
        before = _packs()
        assert torch.equal(layer(x), first)
        assert _packs() == before, "unchanged float16 weights were converted or packed again"
