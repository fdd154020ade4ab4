"""Every activation of the CPU kernels (the vectorised float32 loops included) against Keras 3's
own function, and its derivative against autograd through Keras's function (torch backend)."""
import numpy as np
import pytest
import torch

import cudnn_rnn
from keras_oracle import keras_activation

import keras

NAMES = list(cudnn_rnn._C.activation_names())


def _grid(dtype):
    x = np.concatenate([np.linspace(-12, 12, 24001), np.linspace(-0.7, 0.7, 2001), [0.0, 1e-6, -1e-6, 90.0, -90.0]])
    return torch.tensor(x, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", NAMES)
def test_activation_matches_keras(name, dtype):
    x = _grid(dtype)
    if name == "exponential":
        x = x[x.abs() < 20]
    y, g = cudnn_rnn._C._testing.apply_activation(name, x)
    fn = keras.activations.get(keras_activation(name))
    xk = x.clone().requires_grad_(True)
    yk = fn(xk)
    yk.sum().backward()
    # Keras computes some in float32; torch's AVX-512 float32 gelu (Keras's) is itself up to 1e-6
    # from the exact value near x = -3.4 (ours: 4.8e-7), so float32 allows 2e-6
    tol = dict(atol=2e-6, rtol=2e-6) if dtype == torch.float32 else dict(atol=1e-8, rtol=1e-7)
    torch.testing.assert_close(y, yk.detach(), **tol)
    # derivatives: away from the kinks of the piecewise activations, where both sides pick one side
    kinks = torch.tensor([0.0, -3.0, 3.0, -2.5, 2.5, 6.0, -1.0, 1.0, -0.5, 0.5])
    smooth = (x[:, None] - kinks[None, :].to(dtype)).abs().min(1).values > 1e-3
    torch.testing.assert_close(g[smooth], xk.grad[smooth], **tol)
