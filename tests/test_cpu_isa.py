"""The CPU backend's float32 activation and fused cell loops are compiled once per instruction
set (csrc/cpu/vec_loops*.cpp) and picked at load time from the CPU and ATen's level, which
ATEN_CPU_CAPABILITY lowers. Each set this CPU can run is held to torch.nn in float64 (the
oracle): a float32 LSTM and GRU, forward and backward, in a process started at that level."""
import json
import os
import subprocess
import sys

import pytest

from benchmarks.run import cpu_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


LEVELS = {  # ATEN_CPU_CAPABILITY -> (the loops it must pick, the CPU flags they need)
    "avx512": ("avx512", {"avx512f", "avx512bw", "avx512dq", "avx512vl"}),
    "avx2": ("avx2", {"avx2", "fma"}),
    "default": ("baseline", set()),
}

_PROBE = r"""
import json, torch, cudnn_rnn
torch.set_num_threads(2)
torch.manual_seed(0)
out = {"isa": cudnn_rnn._C.cpu_loops_isa(), "aten": torch.backends.cpu.get_cpu_capability()}
for name, cls in (("lstm", cudnn_rnn.LSTM), ("gru", cudnn_rnn.GRU)):
    ours = cls(24, 100, return_sequences=True)  # 100 units: the time loop splits them across threads
    with torch.no_grad():
        for p in ours.parameters():
            p.uniform_(-0.3, 0.3)
    ref = cudnn_rnn.to_torch(ours).double()
    x = torch.randn(64, 7, 24, requires_grad=True)
    x64 = x.detach().double().requires_grad_(True)
    g = torch.randn(64, 7, 100)
    y = ours(x)
    y64, _ = ref(x64)
    (y * g).sum().backward()
    (y64 * g.double()).sum().backward()
    out[name] = {"y": (y.double() - y64).abs().max().item(), "dx": (x.grad.double() - x64.grad).abs().max().item(),
                 "dx_scale": x64.grad.abs().max().item()}
print(json.dumps(out))
"""


def _probe_at(level: str, probe: str) -> dict:
    """The JSON a probe prints, run in a process started at ATEN level `level` (skipped where
    this CPU cannot run it), after checking that the loops of that level were picked."""
    isa, needs = LEVELS[level]
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        pytest.skip("the instruction-set builds are x86-64's")
    missing = needs - cpu_flags()
    if missing:
        pytest.skip(f"this CPU lacks {sorted(missing)} (hardware)")
    env = dict(os.environ, ATEN_CPU_CAPABILITY=level, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["isa"] == isa, got
    return got


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_each_instruction_set_matches_torch_nn_float64(level):
    got = _probe_at(level, _PROBE)
    for cell in ("lstm", "gru"):
        assert got[cell]["y"] < 2e-6, (cell, got)
        assert got[cell]["dx"] < 2e-6 * max(1.0, got[cell]["dx_scale"]), (cell, got)


_LANES_PROBE = r"""
import json, math, torch, cudnn_rnn
t = cudnn_rnn._C._testing
torch.manual_seed(0)
n = 45  # two 16-float vectors (five 8-float ones) and a rest of 13 (5)
special = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-30, -1e-30, 0.625, -0.625, 0.62499994,
           88.5, -88.5, 87.4, -87.4, 43.7, -43.7, 1e-6]
out = {"isa": cudnn_rnn._C.cpu_loops_isa(), "same": True, "nan_kept": True, "err": 0.0}
for cell, gates in (("lstm", 4), ("gru", 3)):
    for act_tanh, ract_tanh in ((True, False), (True, True), (False, False)):
        xw = torch.randn(6, gates * n) * 6
        flat = xw.view(-1)
        flat[torch.randperm(flat.numel())[: 4 * len(special)]] = torch.tensor(special * 4)
        rec = torch.randn(6, gates * n) * 2
        prev = torch.randn(6, n) * 3
        whole = t.cell_rows(cell, act_tanh, ract_tanh, xw, rec, prev, n)
        for width in (1, 3, 8, 17):  # a unit as a lone float, and at every position of a vector
            part = t.cell_rows(cell, act_tanh, ract_tanh, xw, rec, prev, width)
            for a, b in zip(whole, part):
                both_nan = a.isnan() & b.isnan()  # (a NaN's sign and payload may differ)
                out["same"] &= bool(((a.view(torch.int32) == b.view(torch.int32)) | both_nan).all())
        h = whole[0]
        nan_in = (xw.view(6, gates, n).isnan().any(1) | rec.view(6, gates, n).isnan().any(1))
        out["nan_kept"] &= bool(h[nan_in].isnan().all())
        # against float64, away from NaN
        x64, r64, p64 = xw.double(), rec.double(), prev.double()
        act = torch.tanh if act_tanh else torch.sigmoid
        ract = torch.tanh if ract_tanh else torch.sigmoid
        z = (x64 + r64).view(6, gates, n)
        if cell == "lstm":
            i, f, g, o = ract(z[:, 0]), ract(z[:, 1]), act(z[:, 2]), ract(z[:, 3])
            c = f * p64 + i * g
            h64 = o * act(c)
        else:
            zz, rr = ract(z[:, 0]), ract(z[:, 1])
            cand = act(x64.view(6, 3, n)[:, 2] + rr * r64.view(6, 3, n)[:, 2])
            h64 = zz * p64 + (1 - zz) * cand
        ok = ~h64.isnan() & ~nan_in
        out["err"] = max(out["err"], (h.double() - h64)[ok].abs().max().item())
print(json.dumps(out))
"""


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_cell_rows_give_the_same_bits_at_every_position(level):
    """The fused cell rows run whole vectors, then the rest of a row one float at a time (GCC's
    vectorised loop and its remainder in the AVX2 and AVX-512 builds): the same operations in the
    same order on every lane, so a unit's values come out bit for bit the same whether it falls
    in a vector or in the rest, as the serial-against-threaded bit tests assume (a row
    split into calls of 1, 3, 8 or 17 units against one call; a NaN for a NaN), NaN stays NaN
    through every gate,
    and the cell is within 1e-6 of float64 at inputs that reach the clamps of exp and the switch
    of tanh's two branches."""
    got = _probe_at(level, _LANES_PROBE)
    assert got["same"] and got["nan_kept"], got
    assert got["err"] < 1e-6, got
