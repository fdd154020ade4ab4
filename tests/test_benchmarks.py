"""The benchmark suite (python -m benchmarks.run) at smoke sizes: it writes the table, JSON and PNG
it promises, and its correctness guard refuses a peer that computes something else."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from benchmarks import peers, run
from benchmarks.workloads import WORKLOADS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("forward", "forward+backward")


def expected_rows():
    """(workload, cell, mode, implementation) -> status, for the torch and keras3 peers."""
    out = {}
    for w in WORKLOADS:
        for cell in w.cells:
            torch_nn = ["torch.nn padded", "torch.nn packed"] if w.lengths else ["torch.nn"]
            keras_only = (cell == "gru" and not w.reset_after) or w.recurrent_dropout > 0
            for mode in MODES:
                out[(w.name, cell, mode, "cudnn_rnn")] = "ok"
                for name in torch_nn:
                    out[(w.name, cell, mode, name)] = "n/a" if keras_only else "ok"
                out[(w.name, cell, mode, "keras3 (torch)")] = "ok"
    return out


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    report = run.main(["--smoke", "--peers", "torch,keras3", "--out", str(out)])
    return out, report


def test_json_has_one_row_per_case_mode_and_implementation(smoke_run):
    out, report = smoke_run
    with open(out / "cpu.json") as f:
        saved = json.load(f)
    assert saved["rows"] == json.loads(json.dumps(report["rows"]))
    keys = [(r["workload"], r["cell"], r["mode"], r["implementation"]) for r in saved["rows"]]
    assert len(keys) == len(set(keys)), "duplicate rows"
    assert {k: r["status"] for k, r in zip(keys, saved["rows"])} == expected_rows()
    assert saved["peers"] == {"torch": "in-process", "keras3": "in-process"}


def test_rows_have_positive_times_and_ratios(smoke_run):
    _, report = smoke_run
    assert report["gemm"]["gflops"] > 0
    # On the CPU the peak is the measured FMA throughput; torch.mm's rate is kept beside it.
    assert report["gemm"]["peak"] == "fma" and report["gemm"]["gflops"] == report["gemm"]["fma_gflops"]
    assert report["gemm"]["mm_gflops"] > 0
    ours = {}
    for r in report["rows"]:
        if r["status"] != "ok":
            assert r["note"].startswith("cannot express"), r
            continue
        t = r["time_ms"]
        assert 0 < t["min"] <= t["median"] <= t["max"], r
        assert r["gflop"] > 0 and r["gflops"] > 0 and r["fraction_of_peak"] > 0, r
        key = (r["workload"], r["cell"], r["mode"])
        if r["implementation"] == "cudnn_rnn":
            assert r["peer_over_ours"] is None
            ours[key] = t["median"]
        else:
            assert r["peer_over_ours"] == pytest.approx(t["median"] / ours[key]), r


def test_flops_count_real_steps_only(smoke_run):
    _, report = smoke_run
    rows = {(r["workload"], r["cell"], r["mode"], r["implementation"]): r for r in report["rows"]}
    fixed = rows[("fastrnns", "lstm", "forward", "cudnn_rnn")]
    w = report["workloads"]["fastrnns"]
    assert fixed["gflop"] * 1e9 == pytest.approx(2 * w["T"] * w["B"] * (w["I"] + w["H"]) * 4 * w["H"])
    assert rows[("fastrnns", "lstm", "forward+backward", "cudnn_rnn")]["gflop"] == pytest.approx(3 * fixed["gflop"])
    variable = rows[("variable-length", "lstm", "forward", "cudnn_rnn")]
    assert variable["gflop"] < fixed["gflop"]  # same shapes, shorter sequences


def test_png_is_written(smoke_run):
    out, _ = smoke_run
    with open(out / "cpu.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(out / "cpu.png") > 10_000


def test_guard_refuses_a_peer_that_disagrees(tmp_path, monkeypatch):
    real = peers.Keras3.output
    monkeypatch.setattr(peers.Keras3, "output", lambda self: real(self) + 1e-3)
    with pytest.raises(peers.PeerMismatch, match="keras3"):
        run.main(["--smoke", "--only", "fastrnns/lstm", "--peers", "keras3", "--out", str(tmp_path)])
    assert not (tmp_path / "cpu.json").exists()


def test_guard_on_packed_sequences_ignores_only_the_padding(tmp_path, monkeypatch):
    real = peers.TorchNNPacked.output

    def perturb(where):
        def output(self):
            y = real(self).clone()
            y[where(self.inputs.mask.cpu())] += 1.0
            return y
        return output

    args = ["--smoke", "--only", "variable-length/lstm", "--peers", "torch", "--out", str(tmp_path)]
    monkeypatch.setattr(peers.TorchNNPacked, "output", perturb(lambda mask: ~mask))
    run.main(args)  # the padded steps are not compared
    monkeypatch.setattr(peers.TorchNNPacked, "output", perturb(lambda mask: mask))
    with pytest.raises(peers.PeerMismatch, match="torch.nn packed"):
        run.main(args)


def test_cli_rejects_an_unknown_peer():
    with pytest.raises(SystemExit):
        run.parse_args(["--peers", "torch,mxnet"])


def test_tf_keras_peer_in_a_fresh_process(tmp_path):
    # A subprocess: TensorFlow is imported by the benchmark itself, after torch, as in real runs.
    # Where tf_keras is not installed (the dev venv; requirements-bench.txt adds it), the peer
    # must say why in the run's peer list instead of failing.
    env = {**os.environ, "KERAS_BACKEND": "torch", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--smoke", "--only", "keras-only",
                           "--peers", "torch,keras3,tf_keras", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "cpu.json") as f:
        result = json.load(f)
    tf_rows = [r for r in result["rows"] if r["implementation"] == "tf_keras"]
    if importlib.util.find_spec("tf_keras") is None:
        assert result["peers"]["tf_keras"].startswith("unavailable") and "not installed" in result["peers"]["tf_keras"]
        assert tf_rows == [] and "peer tf_keras: unavailable" in proc.stdout
    else:
        assert [r["mode"] for r in tf_rows] == list(MODES)
        assert all(r["status"] == "ok" and r["time_ms"]["median"] > 0 for r in tf_rows)


def test_report_names_the_machine(smoke_run):
    """Timings are only comparable on the same machine: the report says which CPU, the ISA
    level ATen dispatches to, and which engine ran our float32 GEMMs."""
    import torch

    import cudnn_rnn

    _, report = smoke_run
    machine = report["machine"]
    assert machine["cpu"] and machine["aten_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine["cudnn_rnn_cpu_gemm"] == cudnn_rnn._C.cpu_gemm_engine() in ("packed", "brgemm", "blas")
    assert machine["cudnn_rnn_cpu_loops"] == cudnn_rnn._C.cpu_loops_isa() in ("avx512", "avx2", "baseline")
    # The packed kernel's build follows the cell loops' instruction set (cpu/packed_gemm.h).
    packed = machine["cudnn_rnn_cpu_packed_build"]
    assert packed == cudnn_rnn._C.cpu_packed_gemm_isa() in ("avx512", "avx2", "none")
    assert (packed == "avx512") == (machine["cudnn_rnn_cpu_loops"] == "avx512")
    assert machine["cudnn_rnn_cpu_bf16_gemms"] is cudnn_rnn._C.cpu_bf16_gemms()


@pytest.mark.keras
def test_conv_lstm_benchmark_runs_at_smoke_size(tmp_path):
    from benchmarks import conv_lstm

    out = tmp_path / "conv.json"
    result = conv_lstm.main(["--quick", "--batch", "2", "--time", "2", "--size", "6", "--channels", "2",
                             "--filters", "3", "--json", str(out)])
    assert [(r["mode"], r["implementation"]) for r in result["rows"]] == [
        ("forward", "cudnn_rnn"), ("forward", "keras3"), ("forward+backward", "cudnn_rnn"),
        ("forward+backward", "keras3")]
    assert all(r["median_ms"] > 0 for r in result["rows"]) and json.loads(out.read_text())["case"]["size"] == 6


@pytest.mark.keras
def test_conv_lstm_benchmark_guard_stops_on_a_wrong_peer(monkeypatch):
    from benchmarks import conv_lstm

    real_build = conv_lstm.build

    def wrong_peer(args):
        ours, peer, x = real_build(args)
        peer.set_weights([w * 1.01 for w in peer.get_weights()])
        return ours, peer, x

    monkeypatch.setattr(conv_lstm, "build", wrong_peer)
    with pytest.raises(AssertionError, match="Keras's ConvLSTM2D disagrees with ours"):
        conv_lstm.main(["--quick", "--batch", "2", "--time", "2", "--size", "6", "--channels", "2", "--filters", "3"])


def test_grid_smoke(tmp_path):
    """benchmarks/grid.py on a tiny grid: every cell type checked against torch.nn before timing,
    the one-step case against torch.nn.LSTMCell, ratios positive, the machine and peak named."""
    from benchmarks import grid

    out = tmp_path / "grid.json"
    result = grid.main(["--cells", "lstm,gru,simple_rnn", "--H", "8,16", "--B", "1,3", "--T", "4", "--reps", "1",
                        "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert len([r for r in rows if r["cell"] != "lstm_step"]) == 3 * 2 * 2
    assert all(r["forward_ratio"] > 0 for r in rows)
    assert {r["H"] for r in rows if r["cell"] == "lstm_step"} == {128, 256, 512}
    assert result["machine"]["fma_peak_gflops_float32"] > 0 and result["machine"]["cpu"]


def test_quantized_smoke(tmp_path):
    """benchmarks/quantized.py on one tiny case: both quantized models' errors measured, times
    positive."""
    from benchmarks import quantized

    out = tmp_path / "q.json"
    result = quantized.main(["--H", "16", "--B", "2", "--T", "3", "--reps", "1", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["int8_s"] > 0 and row["float32_s"] > 0 and row["torch_ao_int8_s"] > 0
    assert 0 <= row["error_int8"] < 0.1 and row["error_torch_ao"] > 0
    assert result["machine"]["int8_kernel"] in ("avx512_vnni", "none (float32)")
