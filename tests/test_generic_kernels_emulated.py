"""The generic CUDA backend's kernels, checked without a GPU: their element functions
(csrc/cuda/generic_kernels_body.h, the code the CUDA threads run) are executed on the CPU in
ascending, descending and shuffled thread order under the same driver, and must reproduce the
CPU backend in float64 (outputs, states, the whole reserve, every gradient) to 1e-12. (Not bit for
bit: the CPU backend's own time loop issues its recurrent GEMMs per unit block, straight to BLAS,
so their rounding may differ in the last place from the driver's ATen GEMMs.)"""
import itertools

import numpy as np
import pytest
import torch

from cudnn_rnn import _C
from cudnn_rnn import ops
from cudnn_rnn.cells import GATES



def _case(seed):
    rng = np.random.RandomState(seed)
    cell = str(rng.choice(list(GATES)))
    reset_after = bool(rng.rand() < 0.5)
    use_bias = bool(rng.rand() < 0.8)
    layers, dirs = int(rng.randint(1, 3)), int(rng.randint(1, 3))
    B, T, I, u = int(rng.randint(0, 4)), int(rng.randint(1, 6)), int(rng.randint(1, 5)), int(rng.randint(1, 5))
    g = GATES[cell]
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, dtype=torch.float64, generator=gen) * 0.6  # noqa: E731
    weights = []
    for l in range(layers):
        width = I if l == 0 else dirs * u
        for _ in range(dirs):
            weights += [r(width, g * u), r(u, g * u)]
            if use_bias:
                weights.append(r(2, g * u) if cell == "gru" and reset_after else r(g * u))
    mask = None
    if rng.rand() < 0.7 and B > 0:
        mask = torch.from_numpy(rng.rand(B, T) > 0.4)
        if rng.rand() < 0.3:
            mask[0] = False
    h0 = r(layers * dirs, B, u) if rng.rand() < 0.5 else None
    c0 = r(layers * dirs, B, u) if cell == "lstm" and rng.rand() < 0.5 else None
    dm, rdm = [], []
    if rng.rand() < 0.3 and B > 0:
        k = g if rng.rand() < 0.5 else 1
        for l in range(layers):
            for _ in range(dirs):
                dm.append((torch.rand(k, B, I if l == 0 else dirs * u, generator=gen) > 0.3).double() / 0.7)
                rdm.append((torch.rand(k, B, u, generator=gen) > 0.3).double() / 0.7)
    acts = ["tanh", "relu", "gelu", "softsign"]
    config = ops.RnnSpec(cell=cell, activation=str(rng.choice(acts)),
                         recurrent_activation=str(rng.choice(["sigmoid", "hard_sigmoid", "hard_sigmoid_keras2"])),
                         use_bias=use_bias, reset_after=reset_after, num_layers=layers, bidirectional=dirs == 2,
                         go_backwards=bool(rng.rand() < 0.3), zero_output_for_mask=bool(rng.rand() < 0.3))
    x = r(B, T, I)
    return x, weights, mask, h0, c0, dm, rdm, config


@pytest.mark.parametrize("seed,order", list(itertools.product(range(60), [0, 1, 2]))[::2])
def test_emulated_cuda_kernels_reproduce_the_cpu_backend(seed, order):
    x, weights, mask, h0, c0, dm, rdm, config = _case(seed)
    expected = torch.ops.cudnn_rnn.rnn_forward(x, weights, mask, h0, c0, dm, rdm, *config.args())
    _C._testing.set_emulation_order(order)
    got = _C._testing.emulated_generic_forward(x, weights, mask, h0, c0, dm, rdm, *config.args(), True)
    for name, a, b in zip(("y", "h_n", "c_n", "reserve"), got, expected):
        if name == "reserve":
            a, b = a.view(torch.float64), b.view(torch.float64)
        _close(a, b, name)
    grads = [torch.randn_like(expected[0]), torch.randn_like(expected[1]), torch.randn_like(expected[2])]
    expected_b = torch.ops.cudnn_rnn.rnn_backward(*grads, x, weights, mask, dm, rdm, expected[3], *config.args())
    got_b = _C._testing.emulated_generic_backward(*grads, x, weights, mask, dm, rdm, expected[3], *config.args())
    _close(got_b[0], expected_b[0], "grad_x")
    for i, (a, b) in enumerate(zip(got_b[1], expected_b[1])):
        _close(a, b, f"grad_weights[{i}]")
    _close(got_b[2], expected_b[2], "grad_h0")
    _close(got_b[3], expected_b[3], "grad_c0")


def _close(a, b, name):
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=lambda m: f"{name}: {m}")


def test_the_sweep_covers_what_it_should():
    seen = set()
    for s in range(60):
        x, weights, mask, h0, c0, dm, rdm, config = _case(s)
        seen.add(f"gru-{config.reset_after}" if config.cell == "gru" else config.cell)
        seen |= {f"mask={mask is not None}", f"dropout={bool(dm)}", f"bidirectional={config.bidirectional}",
                 f"go_backwards={config.go_backwards}", f"zero_output={config.zero_output_for_mask}",
                 f"layers={config.num_layers}"}
    assert {"lstm", "simple_rnn", "gru-True", "gru-False", "mask=True", "dropout=True", "bidirectional=True",
            "go_backwards=True", "zero_output=True", "layers=2"} <= seen
