"""Benchmark: cudnn_rnn against its peers, in the same process and thread count.

    python -m benchmarks.run [--quick] [--device cpu|cuda] [--threads N] [--out DIR]
                             [--only SUBSTRING] [--peers torch,keras3,tf_keras] [--dtype float32|bfloat16]

Workloads (benchmarks/workloads.py): fastrnns' default (T=100, 1 layer, I=H=512, B=64), the same
with 2 layers and bidirectional, PTB-large, small-batch latency, Keras-typical with a mask,
variable lengths U[30, 100) and a Keras-only GRU (reset_after=False, recurrent_dropout), with
LSTM and GRU everywhere and SimpleRNN on Keras-typical.

Peers (benchmarks/peers.py): torch.nn (padded, and PackedSequence on padded workloads), Keras 3
on the torch backend, TF Keras (tf_keras on tensorflow-cpu, where installed: pip install -r
requirements-bench.txt). Before anything is timed, each peer's inference output on the case's
inputs is compared with ours (float32: atol=rtol=1e-4; bfloat16: 5e-2; only the real steps where a peer pads
differently): a peer that disagrees stops the run with an error. A peer that cannot express a
case gets an "n/a" row saying why.

Measured, per case and implementation: "forward", inference (eval mode, no_grad), and
"forward+backward", a training step without optimizer (the gradients of sum(output) w.r.t. the
input and every weight); warm-up calls (the correctness guard's call counts as the first forward
one), then the median and spread (min-max) of repeated calls (time.perf_counter on CPU; CUDA
events around each call on CUDA; under --quick, 1 warm-up and 3 timed calls, 2 for the Keras
peers). Each time is also expressed as an achieved GEMM FLOP rate (forward: 2 * steps *
(In + H) * G * H per layer and direction, steps = T*B or the sum of the lengths; forward+backward:
3x) as a fraction of the machine's peak, measured in the same run: on the CPU its FMA throughput
on all threads (benchmarks/peak.py), with the best of several 2048^3 torch.mm in the run's dtype
(before and after the cases) as a second reference; on CUDA that torch.mm rate. On CUDA, TF32 is switched off for both sides (full
float32). Ratios are peer time / our time (>1: we are faster). Outputs: a table on stdout, <out>/<device>.json and <out>/<device>.png.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

import cudnn_rnn

from . import peers as peers_mod
from .peak import fma_peak
from .workloads import Workload, as_dict, build_ours, gemm_flops, make_inputs, select

MODES = ("forward", "forward+backward")
PEER_KEYS = ("torch", "keras3", "tf_keras")
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
ATOL = RTOL = 1e-4
# bfloat16 (--dtype bfloat16, torch.nn the only peer): two implementations round differently, so
# the guard only tells a different function (O(1) apart) from a different rounding (O(1e-2)).
ATOL_BF16 = RTOL_BF16 = 5e-2


# -- timing -------------------------------------------------------------------------------------
def time_calls(fn: Callable[[], object], warmup: int, reps: int, device: str) -> List[float]:
    """Seconds per call of `fn` for `reps` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return samples


def gemm_rate(device: str, n: int, reps: int, dtype: torch.dtype = torch.float32) -> float:
    """The best GEMM rate (GFLOP/s) of `reps` n x n x n torch.mm calls in dtype after one warm-up."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(device, dtype) for _ in range(2))
    out = torch.empty(n, n, device=device, dtype=dtype)
    best = min(time_calls(lambda: torch.mm(a, b, out=out), 1, reps, device))
    return 2.0 * n ** 3 / best / 1e9


# -- progress -----------------------------------------------------------------------------------
class Progress:
    """A one-line progress bar on stderr (a plain line per step where stderr is not a terminal)."""

    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.done, self.stream = max(1, total), 0, stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.t0 = time.perf_counter()

    def step(self, label: str, advance: int = 1) -> None:
        self.done = min(self.total, self.done + advance)
        frac = self.done / self.total
        bar = "#" * int(30 * frac) + "." * (30 - int(30 * frac))
        line = f"[{bar}] {self.done}/{self.total} {time.perf_counter() - self.t0:6.0f}s {label}"
        if self.tty:
            self.stream.write("\r\033[K" + line[:150])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


# -- the run ------------------------------------------------------------------------------------
def repetitions(quick: bool, smoke: bool, slow: bool, mode: str) -> Tuple[int, int]:
    """(warm-up calls, timed calls): slow peers (Keras' per-step loops) get fewer under --quick.
    In forward mode the correctness guard's call was the first warm-up, so one fewer is made."""
    if smoke:
        warmup, reps = 1, 2
    elif quick:
        warmup, reps = (1, 2) if slow else (1, 3)
    else:
        warmup, reps = (2, 5) if slow else (3, 10)
    return (warmup - 1 if mode == "forward" else warmup), reps


def _row(w: Workload, cell: str, mode: str, impl: str, **fields) -> Dict:
    return dict(workload=w.name, cell=cell, mode=mode, implementation=impl, **fields)


def run_case(w: Workload, cell: str, peer_classes, args, progress: Progress) -> List[Dict]:
    """All rows of one case: checks every peer against ours, then times each implementation."""
    case = f"{w.name}/{cell}"
    inputs = make_inputs(w, args.device)
    inputs.x = inputs.x.to(args.dtype)
    ours_layer = build_ours(w, cell, args.device).to(args.dtype)
    ours = peers_mod.Ours(ours_layer, w, cell, inputs)
    # In table order: ours, then each peer, built, or the reason it cannot express the case.
    entries: List = [ours]
    for cls in peer_classes:
        reason = cls.cannot_express(w, cell)
        entries.append((peers_mod.display_name(cls, w), reason) if reason else cls(ours_layer, w, cell, inputs))

    # The correctness guard: before timing, every peer must compute our function on these inputs.
    expected = ours.output()
    for impl in entries[1:]:
        if isinstance(impl, peers_mod.Implementation):
            low = args.dtype != torch.float32
            peers_mod.check_same(expected, impl, impl.output(), case, ATOL_BF16 if low else ATOL, RTOL_BF16 if low else RTOL)

    steps = inputs.real_steps
    rows = []
    for mode in MODES:
        flop = gemm_flops(w, cell, steps, mode)
        ours_median = None
        for impl in entries:
            if not isinstance(impl, peers_mod.Implementation):
                name, reason = impl
                rows.append(_row(w, cell, mode, name, status="n/a", note=reason))
                progress.step(f"{case} {mode} {name} n/a")
                continue
            progress.step(f"{case} {mode} {impl.name}", advance=0)
            warmup, reps = repetitions(args.quick, args.smoke, impl.slow, mode)
            impl.prepare(mode)
            fn = impl.infer if mode == "forward" else impl.train_step
            samples = time_calls(fn, warmup, reps, args.device)
            median = statistics.median(samples)
            if impl is ours:  # first in entries
                ours_median = median
            rows.append(_row(
                w, cell, mode, impl.name, status="ok", note=impl.note, reps=reps,
                time_ms={"median": median * 1e3, "min": min(samples) * 1e3, "max": max(samples) * 1e3},
                gflop=flop / 1e9, gflops=flop / median / 1e9,
                peer_over_ours=None if impl is ours else median / ours_median,
            ))
            progress.step(f"{case} {mode} {impl.name}")
    return rows


def format_table(rows: List[Dict]) -> str:
    head = (f"{'workload':16s} {'cell':10s} {'mode':16s} {'implementation':16s} {'median ms':>10s} "
            f"{'(min-max)':>20s} {'GFLOP/s':>8s} {'%peak':>6s} {'peer/ours':>9s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        prefix = f"{r['workload']:16s} {r['cell']:10s} {r['mode']:16s} {r['implementation']:16s}"
        if r["status"] != "ok":
            lines.append(f"{prefix} n/a ({r['note']})")
            continue
        t = r["time_ms"]
        ratio = "" if r["peer_over_ours"] is None else f"{r['peer_over_ours']:8.2f}x"
        note = f"  ({r['note']})" if r["note"] else ""
        lines.append(f"{prefix} {t['median']:10.2f} ({t['min']:8.2f}-{t['max']:8.2f}) {r['gflops']:8.1f} "
                     f"{100 * r['fraction_of_peak']:5.1f}% {ratio:>9s}{note}")
    return "\n".join(lines)


def _versions() -> Dict[str, Optional[str]]:
    out = {"python": platform.python_version(), "torch": torch.__version__, "cudnn_rnn": cudnn_rnn.__version__}
    for name in ("keras", "tensorflow", "tf_keras"):
        mod = sys.modules.get(name)
        out[name] = getattr(mod, "__version__", None) if mod else None
    return out


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


_ISA_FLAGS = ("avx2", "fma", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
              "amx_bf16")


def cpu_flags() -> set:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def machine_record(threads: int) -> Dict:
    """The CPU side of _machine with the thread count and the date: what benchmarks/grid.py and
    benchmarks/quantized.py store beside their rows."""
    machine = _machine("cpu")
    machine["threads"], machine["date"] = threads, time.strftime("%Y-%m-%d")
    return machine


def write_result(machine: Dict, rows: List[Dict], path: Optional[str]) -> Dict:
    """{"machine", "rows"}, written as JSON to path when given."""
    result = {"machine": machine, "rows": rows}
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _machine(device_name: str) -> Dict:
    """What the CPU timings depend on: the CPU and its vector ISA, what ATen dispatches to, the
    ISA limits set for oneDNN / ATen / MKL, and the engine of our own float32 GEMMs."""
    flags = cpu_flags()
    return {
        "cpu": _cpu_name(),
        "device": device_name,
        "isa_flags": [f for f in _ISA_FLAGS if f in flags],
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY"),
        "DNNL_MAX_CPU_ISA": os.environ.get("DNNL_MAX_CPU_ISA"),
        "MKL_ENABLE_INSTRUCTIONS": os.environ.get("MKL_ENABLE_INSTRUCTIONS"),
        "cudnn_rnn_cpu_gemm": cudnn_rnn._C.cpu_gemm_engine(),  # a fastrnns-sized GEMM's
        "cudnn_rnn_cpu_gemm_small": cudnn_rnn._C.cpu_gemm_engine(64, 256),  # a Keras-typical one's
        "cudnn_rnn_cpu_packed_build": cudnn_rnn._C.cpu_packed_gemm_isa(),  # the packed kernel's build
        "cudnn_rnn_cpu_loops": cudnn_rnn._C.cpu_loops_isa(),  # the activation and fused cell loops'
        "cudnn_rnn_cpu_bf16_gemms": cudnn_rnn._C.cpu_bf16_gemms(),  # bfloat16 calls' GEMMs in bfloat16
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (1 warm-up, 3 timed; 2 for Keras peers)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch and TF intra-op threads")
    parser.add_argument("--out", default=DEFAULT_OUT, help="writes <device>.json and <device>.png here (default %(default)s)")
    parser.add_argument("--only", help="run only the cases whose 'workload/cell' contains this substring")
    parser.add_argument("--peers", default=",".join(PEER_KEYS), help="comma-separated subset of %(default)s")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the layers' and inputs' dtype (bfloat16: torch.nn the only peer)")
    # Every workload shrunk to T=5, B=2, I=H=8 (for the tests); also CUDNN_RNN_BENCH_SMOKE=1.
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.smoke = args.smoke or os.environ.get("CUDNN_RNN_BENCH_SMOKE") == "1"
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    args.dtype = getattr(torch, args.dtype)
    unknown = sorted(set(args.peers) - set(PEER_KEYS))
    if unknown:
        parser.error(f"unknown peers {unknown}; choose from {list(PEER_KEYS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU")
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    return args


def main(argv=None) -> Dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        # Full float32 on both sides, so that the correctness guard's tolerance holds.
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False

    peer_status, selected = {}, []  # --peers name -> how it runs (or why it does not)
    for key in args.peers:
        cls = peers_mod.PEERS[key][0]
        if args.dtype != torch.float32 and key != "torch":
            peer_status[key] = "skipped: bfloat16 runs torch.nn only"
            continue
        if args.device == "cuda" and cls.cpu_only:
            peer_status[key] = "skipped: a CPU-only peer (run with --device cpu)"
            continue
        why_not = cls.available(args.threads)
        if why_not:
            peer_status[key] = f"unavailable: {why_not}"
            continue
        peer_status[key] = "in-process (tensorflow imported after torch and triton)" if key == "tf_keras" else "in-process"
        selected.append(key)

    device_name = torch.cuda.get_device_name() if args.device == "cuda" else _cpu_name()
    print(f"cudnn_rnn {cudnn_rnn.__version__}, torch {torch.__version__}, {device_name}, "
          f"{args.threads} thread(s), {str(args.dtype).replace('torch.', '')}{', smoke sizes' if args.smoke else ''}"
          f"{', quick' if args.quick else ''}")
    machine = _machine(device_name)
    limits = ", ".join(f"{k}={machine[k]}" for k in ("ATEN_CPU_CAPABILITY", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
                       if machine[k])
    print(f"cpu: {machine['cpu']}; ISA {' '.join(machine['isa_flags']) or '?'}; ATen dispatches "
          f"{machine['aten_cpu_capability']}{'; ' + limits if limits else ''}; our float32 GEMMs: "
          f"{machine['cudnn_rnn_cpu_gemm']} (small ones: {machine['cudnn_rnn_cpu_gemm_small']}; packed kernel "
          f"build: {machine['cudnn_rnn_cpu_packed_build']}); cell loops: "
          f"{machine['cudnn_rnn_cpu_loops']}; bfloat16 GEMMs: {'yes' if machine['cudnn_rnn_cpu_bf16_gemms'] else 'no'}")
    for key, status in peer_status.items():
        print(f"peer {key}: {status}")

    workloads = select(args.smoke)
    cases = [(w, cell) for w in workloads for cell in w.cells if args.only is None or args.only in f"{w.name}/{cell}"]
    if not cases:
        raise SystemExit(f"no case matches --only {args.only!r}")
    per_case = {w.name: peers_mod.peer_classes(w, selected) for w in workloads}
    total = sum(len(MODES) * (1 + len(per_case[w.name])) for w, _ in cases)

    # The GEMM peak is measured before and after the cases, and the better of the two is used:
    # on a shared machine one of them may be disturbed.
    gemm = {"n": 256 if args.smoke else 2048, "reps": 3 if args.smoke else 5}
    gemm["dtype"] = str(args.dtype).replace("torch.", "")
    gemm["start_gflops"] = gemm_rate(args.device, gemm["n"], gemm["reps"], args.dtype)

    t0 = time.perf_counter()
    progress = Progress(total)
    rows: List[Dict] = []
    try:
        for w, cell in cases:
            rows += run_case(w, cell, per_case[w.name], args, progress)
    finally:
        progress.close()
    elapsed = time.perf_counter() - t0
    gemm["end_gflops"] = gemm_rate(args.device, gemm["n"], gemm["reps"], args.dtype)
    gemm["mm_gflops"] = max(gemm["start_gflops"], gemm["end_gflops"])
    # On the CPU the peak is the measured FMA throughput (benchmarks/peak.py; bfloat16's where the
    # CPU multiplies bfloat16, else float32's, which a bfloat16 call then runs at); torch.mm's rate
    # is the second reference (MKL runs below the machine's peak on AMD CPUs). On CUDA: torch.mm.
    if args.device == "cpu":
        gemm["fma_gflops"] = fma_peak(args.dtype) or fma_peak(torch.float32)
        gemm["gflops"], gemm["peak"] = gemm["fma_gflops"], "fma"
    else:
        gemm["gflops"], gemm["peak"] = gemm["mm_gflops"], "torch.mm"
    for r in rows:
        if r["status"] == "ok":
            r["fraction_of_peak"] = r["gflops"] / gemm["gflops"]
    mm = (f"best of {gemm['reps']} {gemm['n']}^3 {gemm['dtype']} torch.mm, measured before and after the cases: "
          f"{gemm['start_gflops']:.1f} and {gemm['end_gflops']:.1f}")
    if gemm["peak"] == "fma":
        print(f"peak: {gemm['gflops']:.1f} GFLOP/s (measured FMA throughput, all threads); torch.mm: "
              f"{gemm['mm_gflops']:.1f} GFLOP/s ({mm})")
    else:
        print(f"GEMM peak: {gemm['gflops']:.1f} GFLOP/s ({mm})")

    print(format_table(rows))
    print(f"({elapsed:.0f} s; peer/ours > 1 means cudnn_rnn is faster; %peak counts the GEMM FLOPs only)")
    if any(r.get("fraction_of_peak", 0) > 1 for r in rows):
        print("warning: some results exceed the measured peak: the machine was probably busy while it was measured")
    report = dict(
        device=args.device, device_name=device_name, threads=args.threads, quick=args.quick, smoke=args.smoke,
        dtype=gemm["dtype"],
        machine=machine, versions=_versions(), build=cudnn_rnn.build_info(), gemm=gemm, peers=peer_status,
        tolerance={"atol": ATOL_BF16, "rtol": RTOL_BF16} if args.dtype != torch.float32 else {"atol": ATOL, "rtol": RTOL},
        elapsed_s=elapsed,
        workloads={w.name: as_dict(w) for w in workloads}, rows=rows,
    )
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, f"{args.device}.json")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1, default=str)
    from .plot import plot

    png_path = os.path.join(args.out, f"{args.device}.png")
    plot(report, png_path)
    print(f"wrote {json_path} and {png_path}")
    return report


if __name__ == "__main__":
    main()
