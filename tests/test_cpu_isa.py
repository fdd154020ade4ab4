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


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_each_instruction_set_matches_torch_nn_float64(level):
    isa, needs = LEVELS[level]
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        pytest.skip("the instruction-set builds are x86-64's")
    missing = needs - cpu_flags()
    if missing:
        pytest.skip(f"this CPU lacks {sorted(missing)} (hardware)")
    env = dict(os.environ, ATEN_CPU_CAPABILITY=level, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["isa"] == isa, got
    for cell in ("lstm", "gru"):
        assert got[cell]["y"] < 2e-6, (cell, got)
        assert got[cell]["dx"] < 2e-6 * max(1.0, got[cell]["dx_scale"]), (cell, got)
