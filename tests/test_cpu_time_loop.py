"""The CPU backend's threaded time loop (csrc/cpu/rnn_cpu.cpp): the recurrent GEMM and the cell
update split into unit blocks, one per thread. Small problems get one block, so these tests use
sizes that split, and hold the split result to torch.nn (the oracle) and to the one-block run
(itself held to Keras by test_keras_parity) where torch.nn cannot express the call (masks)."""
import copy

import os
import subprocess
import sys

import pytest
import torch

import cudnn_rnn
from cudnn_rnn import _C
from cudnn_rnn.cells import GATES
from test_packed_gemm import needs_avx512, needs_packed
from test_torch_parity import _grads_as_module

B, T, I, U = 64, 6, 24, 100  # U = 100: blocks of 32, 16, 32 and 20 units on 4 threads
LAYERS = {"lstm": cudnn_rnn.LSTM, "gru": cudnn_rnn.GRU, "simple_rnn": cudnn_rnn.SimpleRNN}
BATCH = {"lstm": B, "gru": B, "simple_rnn": 4 * B}  # enough work per step to split


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_parallel_for_runs_on_torch_threads(threads):
    # at::parallel_for compiles to a serial loop in an extension built without OpenMP.
    threads(2)
    assert _C._testing.parallel_for_threads() == 2
    threads(1)
    assert _C._testing.parallel_for_threads() == 1


def test_unit_blocks_split_on_threads(threads):
    threads(4)
    bounds = _C._testing.cpu_unit_blocks(B, U, 4)
    assert bounds == [0, 32, 48, 80, 100]  # multiples of 16 (the packed GEMM's panels), nearest the even split
    threads(1)
    assert _C._testing.cpu_unit_blocks(B, U, 4) == [0, U]
    threads(4)
    assert _C._testing.cpu_unit_blocks(1, 16, 4) == [0, 16]  # too little work to split


# Cell configurations that reach every branch of the time loop's rows: both LSTM output modes
# under a mask, GRU with and without bias, reversed, a non-tanh SimpleRNN.
CELL_CONFIGS = [
    ("lstm", {}),
    ("lstm", {"go_backwards": True, "zero_output_for_mask": True}),
    ("gru", {}),
    ("gru", {"use_bias": False, "go_backwards": True}),
    ("simple_rnn", {"activation": "relu"}),
]


def _layer(cell, bidirectional=False, units=U, **kwargs):
    torch.manual_seed(0)
    layer = LAYERS[cell](I, units, return_sequences=True, return_state=True, dtype=torch.float64, **kwargs)
    if bidirectional:
        layer = cudnn_rnn.Bidirectional(layer)
    with torch.no_grad():
        for p in layer.parameters():
            p.uniform_(-0.3, 0.3)
    return layer


def _run(layer, x, mask=None):
    x = x.detach().clone().requires_grad_(True)
    out = layer(x, mask=mask)
    torch.manual_seed(1)  # the same cotangents whatever the dtype
    loss = sum((o * torch.randn(o.shape, dtype=torch.float64).to(o.dtype)).sum() for o in out)
    grads = torch.autograd.grad(loss, [x, *layer.parameters()])
    return [o.detach() for o in out], grads


@pytest.mark.parametrize("cell", ["lstm", "gru", "simple_rnn"])
def test_split_loop_matches_torch_nn(cell, threads):
    threads(4)
    assert len(_C._testing.cpu_unit_blocks(BATCH[cell], U, GATES[cell])) > 2
    ours = _layer(cell, num_layers=2)
    ref = ours.to_torch()
    x = torch.randn(BATCH[cell], T, I, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    y = ours(x)[0]
    y_ref, _ = ref(x_ref)
    torch.testing.assert_close(y, y_ref)
    g = torch.randn_like(y)
    (y * g).sum().backward()
    (y_ref * g).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    back = cudnn_rnn.from_torch(_grads_as_module(ref))
    for (name, p), (_, q) in zip(ours.named_parameters(), back.named_parameters()):
        torch.testing.assert_close(p.grad, q, msg=lambda m: f"{name}: {m}")


def _random_mask(seed, batch):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, T, generator=g) > 0.3
    mask[0] = False          # a row with no real step
    mask[1, :3] = False      # leading masked steps
    return mask


def _engines():
    """The float32 GEMM engines this machine and torch can run (csrc/cpu/gemm_engine.h)."""
    return (["packed"] if _C._testing.cpu_packed_gemm() else []) + (["brgemm"] if _C._testing.cpu_brgemm() else []) \
        + ["blas"]


def _engine_builds():
    """_engines() with the packed kernel once per build this CPU runs (AVX2, AVX-512)."""
    packed = [e for e in _engines() if e == "packed"]
    avx512 = _C._testing.cpu_packed_gemm_avx512()
    builds = [f"packed-{isa}" for isa in ("avx2", "avx512") if packed and (isa == "avx2" or avx512)]
    return builds + [e for e in _engines() if e != "packed"]


@pytest.fixture
def engine(request):
    name, _, isa = request.param.partition("-")
    _C._testing.override_cpu_gemm_engine(name)
    _C._testing.override_packed_gemm_isa(isa)
    yield request.param
    _C._testing.override_cpu_gemm_engine("")
    _C._testing.override_packed_gemm_isa("")


@pytest.mark.parametrize("cell,kwargs", CELL_CONFIGS)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_split_loop_matches_one_block_with_masks(cell, kwargs, bidirectional, threads):
    x = torch.randn(BATCH[cell], T, I, dtype=torch.float64)
    mask = _random_mask(2, BATCH[cell])
    layer = _layer(cell, bidirectional, **kwargs)
    threads(1)
    out1, grads1 = _run(layer, x, mask)
    threads(4)
    assert len(_C._testing.cpu_unit_blocks(BATCH[cell], U, GATES[cell])) > 2
    out4, grads4 = _run(layer, x, mask)
    for a, b in zip(out4 + list(grads4), out1 + list(grads1)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_step_scheduler_runs_every_block_once_and_gives_up_a_lagging_thread(threads):
    """csrc/cpu/time_loop.h: a step's blocks run across threads until one thread lags twice
    running; then the caller runs stretches of steps alone (16, 32, ... steps), probing the
    threads between them. Every block of every step runs exactly once either way."""
    threads(2)
    ones = torch.ones(200, 2, dtype=torch.long)
    counts, _ = _C._testing.step_scheduler_trace(200, 2, 0)
    assert torch.equal(counts, ones)
    counts, stretches = _C._testing.step_scheduler_trace(200, 2, 2000)  # the other thread sleeps 2 ms a block
    assert torch.equal(counts, ones)
    if _C._testing.parallel_for_threads() == 2:
        assert stretches >= 3  # 16 + 32 + 64 steps alone, each after a probe that lagged again
    else:  # no OpenMP: the caller runs every block, nothing lags
        assert stretches == 0


@pytest.mark.parametrize("engine", _engine_builds(), indirect=True)
@pytest.mark.parametrize("cell,kwargs", [("lstm", {}), ("gru", {"go_backwards": True}), ("simple_rnn", {})])
def test_serial_steps_give_the_threaded_bits(cell, kwargs, threads, engine):
    """The steps the scheduler runs on the calling thread (BLAS held to one thread there) are the
    threaded steps' blocks one after another: the same bits, float32 on every engine, masked,
    both directions, forward and backward."""
    threads(4)
    assert len(_C._testing.cpu_unit_blocks(BATCH[cell], U, GATES[cell])) > 2
    layer = _layer(cell, True, **kwargs).float()
    x = torch.randn(BATCH[cell], T, I)
    mask = _random_mask(4, BATCH[cell])
    out, grads = _run(layer, x, mask)
    _C._testing.force_serial_steps(True)
    try:
        out_serial, grads_serial = _run(layer, x, mask)
    finally:
        _C._testing.force_serial_steps(False)
    for a, b in zip(out + list(grads), out_serial + list(grads_serial)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("cell,kwargs", [
    ("lstm", {}),
    ("lstm", {"go_backwards": True, "zero_output_for_mask": True}),
    ("gru", {"use_bias": False}),
    ("gru", {"go_backwards": True}),
    ("simple_rnn", {}),
])
@pytest.mark.parametrize("engine", _engine_builds(), indirect=True)
@pytest.mark.parametrize("units,batch,bidirectional", [(U, None, False), (U, None, True), (199, 5, False),
                                                        (37, 130, False)])
@pytest.mark.parametrize("n_threads", [1, 4])
def test_float32_loop_matches_float64(cell, kwargs, units, batch, bidirectional, n_threads, threads, engine):
    """float32 runs the recurrent GEMMs, the input projection and the input gradient on each
    engine: the packed kernel's AVX2 and AVX-512 builds (csrc/cpu/packed_gemm.cpp: row tiles of 1
    to 6 rows, panels of 16 with a partial last one, AVX-512 groups of 1 to 4 panels, odd K (U = 199) for the tiles that split k in interleaved sums,
    K blocks of 512 in the backward at U = 199, masked rows read and written in place), oneDNN's
    brgemm (gate by gate, gathered rows) and BLAS; float64 runs them on BLAS and is held to
    torch.nn above. Same weights, inputs and mask. Batch 130: the loop's bias sums (float32
    partials over 64 rows at most, 64-column tiles and a tail) over more than one row group."""
    batch = batch or BATCH[cell]
    layer = _layer(cell, bidirectional, units, **kwargs)
    layer32 = copy.deepcopy(layer).float()
    x = torch.randn(batch, T, I, dtype=torch.float64)
    mask = _random_mask(3, batch)
    threads(n_threads)
    out64, grads64 = _run(layer, x, mask)
    out32, grads32 = _run(layer32, x.float(), mask)
    for a, b in zip(out32 + list(grads32), out64 + list(grads64)):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cell,kwargs", [
    ("lstm", {}),
    ("lstm", {"use_bias": False, "go_backwards": True}),
    ("simple_rnn", {}),
    ("gru", {}),
])
@pytest.mark.parametrize("engine", _engine_builds(), indirect=True)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_float32_unmasked_loop_matches_float64(cell, kwargs, bidirectional, threads, engine):
    """Without a mask every row is real: each engine's unmasked path (no rows gathered or
    compacted, the biases under the recurrent product; none, with use_bias=False), split into
    unit blocks on 4 threads. Held to the float64 run (itself held to torch.nn above)."""
    layer = _layer(cell, bidirectional, **kwargs)
    layer32 = copy.deepcopy(layer).float()
    x = torch.randn(BATCH[cell], T, I, dtype=torch.float64)
    threads(4)
    assert len(_C._testing.cpu_unit_blocks(BATCH[cell], U, GATES[cell])) > 2
    out64, grads64 = _run(layer, x)
    out32, grads32 = _run(layer32, x.float())
    for a, b in zip(out32 + list(grads32), out64 + list(grads64)):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


@pytest.fixture
def split(request):
    _C._testing.override_cpu_split(request.param)
    yield request.param
    _C._testing.override_cpu_split("")


@pytest.mark.parametrize("split", ["units", "rows"], indirect=True)
@pytest.mark.parametrize("engine", [e for e in _engine_builds() if e.startswith("packed") or e == "blas"],
                         indirect=True)
@pytest.mark.parametrize("cell,kwargs", CELL_CONFIGS)
@pytest.mark.parametrize("batch,masked,bidirectional", [(64, True, False), (7, True, True), (33, False, False),
                                                         (2, True, False)])
def test_both_splits_match_float64(cell, kwargs, batch, masked, bidirectional, split, engine, threads):
    """The two ways the time loop splits across threads (csrc/cpu/time_loop.h: unit blocks with a
    barrier a step, or row groups that run every step on their own), each forced, float32 on the
    packed kernel and on BLAS (MKL's packed GEMM, each row group's own rows in place or gathered)
    held to the float64 run: outputs, states, input and weight gradients (the bias sums of each
    row group added), masked (rows of different lengths per group, with holes: gathered per group)
    and not, both directions, groups of uneven size (7 and 33 rows on 4 threads)."""
    layer = _layer(cell, bidirectional, **kwargs)
    layer32 = copy.deepcopy(layer).float()
    x = torch.randn(batch, T, I, dtype=torch.float64)
    mask = _random_mask(5, batch) if masked else None
    threads(4)
    out64, grads64 = _run(layer, x, mask)
    out32, grads32 = _run(layer32, x.float(), mask)
    for a, b in zip(out32 + list(grads32), out64 + list(grads64)):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("split", ["units", "rows"], indirect=True)
@pytest.mark.parametrize("engine", [e for e in _engine_builds() if e.startswith("packed") or e == "blas"],
                         indirect=True)
@pytest.mark.parametrize("cell,kwargs", CELL_CONFIGS)
@pytest.mark.parametrize("batch,masked,bidirectional", [(64, True, False), (7, True, True), (33, False, True)])
def test_inference_matches_float64_on_both_splits(cell, kwargs, batch, masked, bidirectional, split, engine,
                                                  threads):
    """Inference runs a path of its own: no saved activations and, for LSTM and SimpleRNN on the
    packed kernel with the rows apart, each step's input product inside the loop instead of a
    hoisted projection (csrc/cpu/plan_choice.cpp: plan_projects_input). Held to the float64 run:
    outputs and final states, masked rows and not, both directions, uneven row groups."""
    layer = _layer(cell, bidirectional, **kwargs)
    layer32 = copy.deepcopy(layer).float()
    x = torch.randn(batch, T, I, dtype=torch.float64)
    mask = _random_mask(5, batch) if masked else None
    threads(4)
    with torch.no_grad():
        out64 = layer(x, mask=mask)
        out32 = layer32(x.float(), mask=mask)
    for a, b in zip(out32, out64):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


def test_split_choice_follows_the_kernel_size(threads):
    """Rows apart where the recurrent kernel fits a quarter of L2 or, from 4 rows a thread (12 on
    full-width AVX-512 cores), 8 L2;
    else unit blocks; one thread or one row: unit blocks (csrc/cpu/rnn_cpu.cpp: choose_split)."""
    split = _C._testing.cpu_split
    assert split(64, 64, 4, 2) == "rows" and split(2, 64, 4, 2) == "rows"
    assert split(1, 64, 4, 2) == "units" and split(64, 64, 4, 1) == "units"
    assert split(8, 4096, 4, 2) == "units"  # a 256 MiB kernel on every thread


def test_split_needs_more_rows_on_faster_cores():
    """Where the recurrent kernel outgrows L2 the row split needs 4 rows a thread, or 12 where the
    packed kernel runs AVX-512 on a core with full-width 512-bit FMAs: at H = 512 (a 4 MiB LSTM
    kernel; 2 MiB at H = 362) units below that count, rows from it on, on this machine's L2
    (csrc/cpu/rnn_cpu.cpp: choose_split, rows_to_cover_kernel). The count is the same in every
    process: it rests on a ratio of two rates (1.0 or 2.0), not on a rate."""
    try:  # the size glibc's sysconf gives the C++ rule (Python's os.sysconf does not know the name)
        l2 = int(subprocess.run(["getconf", "LEVEL2_CACHE_SIZE"], capture_output=True, text=True).stdout or 0)
    except (OSError, ValueError):
        l2 = 0
    l2 = l2 if l2 > 0 else 1 << 20  # the rule's own default
    need = _C._testing.cpu_split_min_rows()
    assert need in (4, 12)
    if _C.cpu_packed_gemm_isa() != "avx512":
        assert need == 4
    again = subprocess.run([sys.executable, "-c", "from cudnn_rnn import _C; print(_C._testing.cpu_split_min_rows())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert int(again) == need  # another process, another measurement: the same count
    for units in (362, 512):
        kernel = 4 * units * units * 4
        for rows in range(1, 40):
            by_rows = 4 * kernel <= l2 or (rows >= need and kernel <= 8 * l2)
            assert _C._testing.cpu_split(2 * rows, units, 4, 2) == ("rows" if by_rows else "units"), (units, rows, need)


@pytest.mark.parametrize("engine", ["packed-avx2", pytest.param("packed-avx512", marks=needs_avx512)], indirect=True)
@pytest.mark.parametrize("cell,kwargs,masked,width", [("lstm", {}, False, 48), ("lstm", {"go_backwards": True}, False, 48),
                                                      ("lstm", {"num_layers": 2}, False, 48), ("lstm", {}, True, 48),
                                                      ("lstm", {}, False, 1), ("lstm", {}, True, 3),
                                                      ("simple_rnn", {"go_backwards": True}, False, 48),
                                                      ("gru", {"go_backwards": True}, False, 48)])
def test_packed_weight_grads_match_float64(cell, kwargs, masked, width, threads, engine):
    """Where the large GEMMs run on the packed engine (CPUs other than Intel's), so do the weight
    gradients (from 2^20 multiply-adds): LSTM and SimpleRNN as one product over [x | h_prev],
    h_prev re-indexed from processing order to the input's (go_backwards reverses it; a second
    layer reads its input sequence-major), the masked
    LSTM over its real rows only with the bias's row; float32 held to the float64 run like every
    other engine's. With 1-3 input features (a time series) the input's panel is shared with
    h_prev's, and its gradient goes to BLAS's matrix-vector product."""
    batch, steps, units = 32, 20, 64
    layer = LAYERS[cell](width, units, return_sequences=True, return_state=True, dtype=torch.float64, **kwargs)
    with torch.no_grad():
        for p in layer.parameters():
            p.uniform_(-0.1, 0.1)
    layer32 = copy.deepcopy(layer).float()
    x = torch.randn(batch, steps, width, dtype=torch.float64)
    mask = (torch.arange(steps) < torch.randint(1, steps + 1, (batch, 1))) if masked else None
    threads(2)
    out64, grads64 = _run(layer, x, mask)
    out32, grads32 = _run(layer32, x.float(), mask)
    for a, b in zip(out32 + list(grads32), out64 + list(grads64)):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("engine", ["packed-avx2", pytest.param("packed-avx512", marks=needs_avx512)], indirect=True)
@pytest.mark.parametrize("kwargs,masked", [({}, False), ({"go_backwards": True}, True), ({"num_layers": 2}, False)])
def test_few_rows_weight_grads_match_float64(kwargs, masked, threads, engine):
    """Batches of 1-2 (T x B rows few beside the product): the weight gradients come out of the
    packed kernel as [width, N] directly (D packed, [x | h_prev] gathered as the transposed
    operand); units not a multiple of 16, held to the float64 run."""
    batch, steps, units, width = 2, 20, 100, 60
    layer = LAYERS["lstm"](width, units, return_sequences=True, return_state=True, dtype=torch.float64, **kwargs)
    with torch.no_grad():
        for p in layer.parameters():
            p.uniform_(-0.1, 0.1)
    layer32 = copy.deepcopy(layer).float()
    x = torch.randn(batch, steps, width, dtype=torch.float64)
    mask = torch.tensor([[True] * steps, [True] * 13 + [False] * 7]) if masked else None
    threads(2)
    out64, grads64 = _run(layer, x, mask)
    out32, grads32 = _run(layer32, x.float(), mask)
    for a, b in zip(out32 + list(grads32), out64 + list(grads64)):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


_GEMM_PATH_RUN = """
import sys, torch, cudnn_rnn
torch.set_num_threads(2)
results = []
for cls in (cudnn_rnn.LSTM, cudnn_rnn.GRU):
    torch.manual_seed(0)
    layer = cls(24, 100, return_sequences=True)
    x = torch.randn(64, 6, 24, requires_grad=True)
    mask = torch.rand(64, 6) > 0.3
    y = layer(x, mask=mask)
    grads = torch.autograd.grad((y * torch.randn_like(y)).sum(), [x, *layer.parameters()])
    results += [y.detach(), *grads]
torch.save(results, sys.argv[1])
"""


def _run_gemm_path(tmp_path, value):
    import os
    import subprocess
    import sys
    out = tmp_path / f"{value or 'default'}.pt"
    env = {**os.environ, "CUDNN_RNN_CPU_GEMM": value}
    run = subprocess.run([sys.executable, "-c", _GEMM_PATH_RUN, str(out)], env=env, capture_output=True,
                         text=True, timeout=300)
    return run, out


def test_gemm_engine_from_the_environment(tmp_path):
    """CUDNN_RNN_CPU_GEMM picks the float32 GEMM engine for the process (read once): each one
    this machine can run agrees with the others, and they differ in the last bits (else the
    switch did nothing)."""
    runs = {v: _run_gemm_path(tmp_path, v) for v in _engines()}
    for value, (run, _) in runs.items():
        assert run.returncode == 0, f"{value}: {run.stderr}"
    results = {v: torch.load(out, weights_only=True) for v, (_, out) in runs.items()}
    for value, got in results.items():
        for a, b in zip(got, results["blas"]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{value} vs blas: {m}")
        if value != "blas":
            assert any(not torch.equal(a, b) for a, b in zip(got, results["blas"])), value


def test_gemm_engine_from_the_environment_is_checked(tmp_path):
    run, _ = _run_gemm_path(tmp_path, "fast")
    assert run.returncode != 0
    assert "CUDNN_RNN_CPU_GEMM must be 'packed', 'brgemm' or 'blas'; got 'fast'" in run.stderr


def test_buffer_pool_reuses_and_frees():
    _C.empty_cpu_cache()
    assert _C.cpu_cache_info()[0] == 0
    # GRU: its input projection is hoisted out of the time loop ([T, B, 3u]: 4.9 MB, pooled).
    layer = cudnn_rnn.GRU(64, 64, return_sequences=True)
    x = torch.randn(64, 100, 64)
    with torch.no_grad():
        first = layer(x)
    idle, limit = _C.cpu_cache_info()
    assert 0 < idle <= limit
    with torch.no_grad():
        second = layer(x)
    assert _C.cpu_cache_info()[0] <= idle  # served from the pool, not grown
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    cudnn_rnn.empty_cpu_cache()
    assert _C.cpu_cache_info()[0] == 0


def _run_with_cache_env(value):
    import os
    import subprocess
    import sys
    code = ("import torch, cudnn_rnn\nfrom cudnn_rnn import _C\n"
            "with torch.no_grad():\n    cudnn_rnn.GRU(64, 64)(torch.randn(64, 100, 64))\n"
            "print(_C.cpu_cache_info())\n")
    env = {**os.environ, "CUDNN_RNN_CPU_CACHE_MB": value}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_buffer_pool_limit_from_the_environment():
    off = _run_with_cache_env("0")
    assert off.returncode == 0, off.stderr
    assert off.stdout.strip() == "(0, 0)"  # disabled: nothing kept
    for value in ("lots", "12abc", "-1"):
        bad = _run_with_cache_env(value)
        assert bad.returncode != 0
        assert f"CUDNN_RNN_CPU_CACHE_MB must be a non-negative number of MiB; got {value}" in bad.stderr


@pytest.mark.parametrize("engine", [e for e in _engine_builds() if e.startswith("packed")], indirect=True)
@pytest.mark.parametrize("batch,time", [(1, 1), (3, 2), (6, 1)])
def test_streaming_shapes_match_float64(batch, time, engine, threads):
    """A streaming call (a few rows, one or two steps, states passed in): the input projection of
    one row tile splits its columns across threads (K x N >= 2^16 here), the step its units.
    float32 held to the float64 run, masked and not."""
    threads(2)
    torch.manual_seed(7)
    wide = LAYERS["lstm"](700, 96, return_sequences=True, return_state=True, dtype=torch.float64)
    with torch.no_grad():
        for p in wide.parameters():
            p.uniform_(-0.1, 0.1)
    wide32 = copy.deepcopy(wide).float()
    x = torch.randn(batch, time, 700, dtype=torch.float64)
    h, c = torch.randn(batch, 96, dtype=torch.float64), torch.randn(batch, 96, dtype=torch.float64)
    mask = torch.ones(batch, time, dtype=torch.bool)
    mask[0, -1] = False
    for m in (None, mask):
        with torch.no_grad():
            want = wide(x, mask=m, initial_state=[h, c])
            got = wide32(x.float(), mask=m, initial_state=[h.float(), c.float()])
        for a, b in zip(got, want):
            torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


def test_set_cpu_plan_forces_and_restores():
    # The split of 2 threads, whatever torch runs with here (one thread never splits).
    split = _C._testing.cpu_split
    cudnn_rnn.set_cpu_plan(split="units")
    try:
        assert split(32, 64, 4, 2) == "units"
        cudnn_rnn.set_cpu_plan(split="rows", gemm="blas")
        assert split(32, 4096, 4, 2) == "rows" and _C.cpu_gemm_engine() == "blas"
    finally:
        cudnn_rnn.set_cpu_plan(gemm="auto", split="auto")
    assert _C.cpu_split(1, 64, 4) == "units"
    with pytest.raises(ValueError, match="split must be 'units', 'rows' or 'auto'; got 'diagonal'"):
        cudnn_rnn.set_cpu_plan(split="diagonal")
    with pytest.raises(ValueError, match="CUDNN_RNN_CPU_GEMM must be 'packed', 'brgemm' or 'blas'; got 'fast'"):
        cudnn_rnn.set_cpu_plan(gemm="fast")
    with pytest.raises(TypeError, match="split must be a str or None"):
        cudnn_rnn.set_cpu_plan(split=2)


def test_explain_names_the_cpu_plan():
    plan = cudnn_rnn.explain(cudnn_rnn.LSTM(8, 64), mask=torch.ones(64, 3)).plan
    assert plan[0].startswith("float32 products on the ") and plan[0].endswith(" engine")
    assert cudnn_rnn.explain(cudnn_rnn.GRU(8, 16, reset_after=False)).plan[1].startswith("row loops")
    assert cudnn_rnn.explain(cudnn_rnn.LSTM(8, 16, dtype=torch.float64)).plan[0] == "float64 products (BLAS)"


@pytest.fixture
def machine_default():
    def use(name):
        _C._testing.override_machine_default(name)
    yield use
    _C._testing.override_machine_default("")


@needs_packed
def test_intel_rule_runs_small_calls_on_the_packed_kernel(machine_default):
    """On Intel (csrc/cpu/gemm_engine.h) GEMMs of K x N >= 2^18 run BLAS
    from 8 rows (the forward recurrent products: 8 rows a step over more than one step), the
    packed kernel for fewer rows or one step; below 2^18 the packed kernel."""
    machine_default("blas_from_size")
    plan = lambda units, batch, time: _C.cpu_forward_plan("lstm", units, "float32", batch=batch, time=time)
    assert [plan(256, b, 50)[0] for b in (1, 4, 7, 8, 128)] == ["packed"] * 3 + ["blas"] * 2
    assert plan(256, 128, 1)[0] == "packed" and plan(255, 128, 50)[0] == "packed"
    assert _C.cpu_gemm_engine(256, 1024) == "blas" and _C.cpu_gemm_engine(255, 1024) == "packed"
    assert _C.cpu_gemm_engine(256, 1024, 7) == "packed" and _C.cpu_gemm_engine(256, 1024, 8) == "blas"
    assert plan(256, 4, 50)[1] and plan(256, 8, 50)[1]  # the forward's rows apart on the packed kernel and BLAS
    layer = cudnn_rnn.LSTM(8, 256)
    assert cudnn_rnn.explain(layer).plan[0] == ("float32 products on the blas engine (packed for one-step calls and "
                                                "batches under 8)")
    assert cudnn_rnn.explain(layer, mask=torch.ones(4, 10)).plan[0] == "float32 products on the packed engine"
    machine_default("packed")
    assert plan(1024, 128, 50)[0] == "packed" and _C.cpu_gemm_engine() == "packed"
    machine_default("blas")
    assert plan(64, 1, 1)[0] == "blas"
    with pytest.raises(ValueError, match="machine must be 'packed', 'blas' or 'blas_from_size'; got 'amd'"):
        machine_default("amd")


@needs_packed
@pytest.mark.parametrize("cell,units,kwargs", [("lstm", 256, {}), ("gru", 300, {}), ("simple_rnn", 512, {}),
                                               ("lstm", 256, {"num_layers": 2})])
@pytest.mark.parametrize("batch,time", [(3, 5), (8, 5), (5, 1)])
def test_intel_rule_mixes_engines_and_matches_float64(cell, units, kwargs, batch, time, machine_default, threads):
    """Where the Intel rule runs the forward recurrent products on the packed kernel and the
    backward's and the weight gradients on BLAS (fewer than 8 rows, or one step; the input
    projection and gradient, I x G*u >= 2^18 here, on either by their T x B rows, all of them or
    the real ones of a masked call), float32 training and inference stay within float32 rounding
    of the float64 run."""
    machine_default("blas_from_size")
    threads(2)
    torch.manual_seed(batch * 10 + time)
    layer = LAYERS[cell](units, units, return_sequences=True, return_state=True, dtype=torch.float64, **kwargs)
    with torch.no_grad():
        for p in layer.parameters():
            p.uniform_(-0.08, 0.08)
    layer32 = copy.deepcopy(layer).float()
    gates = GATES[cell] * units
    assert _C.cpu_forward_plan(cell, units, "float32", batch=batch, time=time)[0] == (
        "packed" if batch < 8 or time == 1 else "blas")
    assert _C.cpu_gemm_engine(gates, units) == "blas"  # the backward's recurrent products
    assert _C.cpu_gemm_engine(units, gates, batch * time) == ("packed" if batch * time < 8 else "blas")
    x = torch.randn(batch, time, units, dtype=torch.float64)
    mask = torch.ones(batch, time, dtype=torch.bool)
    mask[0, -1] = False
    mask[1:, :time // 2] = False  # leading padding: fewer real rows, listed
    for m in (None, mask):
        out64, grads64 = _run(layer, x, m)
        out32, grads32 = _run(layer32, x.float(), m)
        for a, b in zip(out32 + list(grads32), out64 + list(grads64)):
            torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)
        layer.eval(), layer32.eval()
        with torch.no_grad():
            for a, b in zip(layer32(x.float(), mask=m), layer(x, mask=m)):
                torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)
        layer.train(), layer32.train()
