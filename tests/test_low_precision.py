"""bfloat16 / float16 on the CPU compute in float32: the error against float32 is no more than
twice that of torch.nn in the same precision (the flash-attention rule), and gradients come
back in the caller's dtype."""
import copy

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
