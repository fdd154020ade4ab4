"""Benchmark: the LSTM (GRU, SimpleRNN) size grid and one-step streaming, against torch.nn.

    python -m benchmarks.grid [--cells lstm,gru,simple_rnn] [--H 64,128,...] [--B 1,8,...]
                              [--T 50] [--dtype float32|bfloat16] [--threads N] [--reps 7]
                              [--no-step] [--out FILE.json]

For each cell type, hidden size H and batch B (T steps, I = H, one layer, unidirectional, no
mask): "forward" (eval, no_grad) and "forward+backward" (the gradients of sum(output) with
respect to x and every weight), ours and torch.nn (our layer's ``to_torch()``: the same weights)
in the same process and thread count, the calls of the two interleaved so both see the same
machine. Each figure is the median of at least ``--reps`` timed calls, and of about a second of
them, after at least 0.25 s of warm-up; ratios are
torch.nn's time over ours (>1: we are faster). Before timing, the outputs are compared
(float32: 1e-4; bfloat16: 5e-2).

With --dtype bfloat16 each cell also times our float32 layer with the same weights (ratio
float32 time / bfloat16 time).

"step": one streaming step (T=1, B=1, no_grad, states passed in and returned) of our LSTM
against ``torch.nn.LSTMCell`` with the same weights.

The table also gives the machine's measured FMA peak in the run's dtype (benchmarks/peak.py:
vfmadd231ps for float32, vdpbf16ps for bfloat16, where the CPU has it) and each forward's achieved
rate as a fraction of it.
"""
from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
from typing import Dict, List

import torch

import cudnn_rnn
from .peak import fma_peak
from .run import machine_record, write_result

GATES = {"lstm": 4, "gru": 3, "simple_rnn": 1}
LAYERS = {"lstm": cudnn_rnn.LSTM, "gru": cudnn_rnn.GRU, "simple_rnn": cudnn_rnn.SimpleRNN}


def _median_pair(f_ours, f_peer, warmup: int, reps: int, warmup_s: float = 0.25, timed_s: float = 1.0):
    # At least `warmup` calls of each and `warmup_s` seconds: the first case of a process also
    # pays the thread pools' start, oneDNN's kernel generation and first-touch page faults (a
    # first cell timed after two calls read 0.76x where it reads 1.03x after the others).
    t_start = time.perf_counter()
    done = 0
    while done < warmup or time.perf_counter() < t_start + warmup_s:
        f_ours()
        f_peer()
        done += 1
    # Enough pairs for ~`timed_s` seconds of timed calls (short calls on a shared machine vary by
    # 15 % between runs of 20), at least `reps`.
    per_pair = (time.perf_counter() - t_start) / done
    reps = max(reps, min(400, int(timed_s / per_pair)))
    a, b = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        f_ours()
        a.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        f_peer()
        b.append(time.perf_counter() - t0)
    return statistics.median(a), statistics.median(b)


def grid_case(cell: str, H: int, B: int, T: int, dtype: torch.dtype, reps: int) -> Dict:
    torch.manual_seed(0)
    ours = LAYERS[cell](H, H, return_sequences=True).to(dtype)
    peer = ours.to_torch().to(dtype)
    x = torch.randn(B, T, H).to(dtype)
    with torch.no_grad():
        diff = (ours(x).float() - peer(x)[0].float()).abs().max().item()
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    if not diff <= tol:
        raise AssertionError(f"{cell} H={H} B={B}: ours and torch.nn differ by {diff}")
    xg = x.clone().requires_grad_(True)
    p_ours = [xg] + list(ours.parameters())
    p_peer = [xg] + list(peer.parameters())
    ours.eval(), peer.eval()

    def inf_ours():
        with torch.no_grad():
            ours(x)

    def inf_peer():
        with torch.no_grad():
            peer(x)

    def train_ours():
        torch.autograd.grad(ours(xg).sum(), p_ours)

    def train_peer():
        torch.autograd.grad(peer(xg)[0].sum(), p_peer)

    flops = 2.0 * T * B * 2 * H * GATES[cell] * H
    n = reps
    fo, fp = _median_pair(inf_ours, inf_peer, 2, n)
    to, tp = _median_pair(train_ours, train_peer, 2, n)
    row = {"cell": cell, "H": H, "B": B, "T": T, "dtype": str(dtype).replace("torch.", ""),
           "forward_ours_s": fo, "forward_torch_s": fp, "train_ours_s": to, "train_torch_s": tp,
           "forward_ratio": fp / fo, "train_ratio": tp / to, "forward_gflops": flops / fo / 1e9}
    if dtype != torch.float32:  # also our float32 layer (same weights), against this dtype's
        ours32 = copy.deepcopy(ours).float()
        x32, xg32 = x.float(), xg.detach().float().requires_grad_(True)
        p32 = [xg32] + list(ours32.parameters())

        def inf32():
            with torch.no_grad():
                ours32(x32)

        def train32():
            torch.autograd.grad(ours32(xg32).sum(), p32)

        f32, fo2 = _median_pair(inf32, inf_ours, 2, n)
        t32, to2 = _median_pair(train32, train_ours, 2, n)
        row.update(forward_ours_float32_s=f32, train_ours_float32_s=t32, forward_over_float32=f32 / fo2,
                   train_over_float32=t32 / to2)
    return row


def step_case(H: int, dtype: torch.dtype, reps: int) -> Dict:
    """One streaming step: T=1, B=1, no_grad, (h, c) passed in."""
    torch.manual_seed(0)
    ours = cudnn_rnn.LSTM(H, H, return_state=True).to(dtype).eval()
    cell = torch.nn.LSTMCell(H, H).to(dtype).eval()
    t = ours.to_torch()
    with torch.no_grad():
        cell.weight_ih.copy_(t.weight_ih_l0)
        cell.weight_hh.copy_(t.weight_hh_l0)
        cell.bias_ih.copy_(t.bias_ih_l0)
        cell.bias_hh.copy_(t.bias_hh_l0)
    x = torch.randn(1, 1, H).to(dtype)
    h = torch.randn(1, H).to(dtype)
    c = torch.randn(1, H).to(dtype)
    with torch.no_grad():
        _, h1, c1 = ours(x, initial_state=[h, c])
        h2, c2 = cell(x[:, 0], (h, c))
    diff = max((h1 - h2).abs().max().item(), (c1 - c2).abs().max().item())
    if not diff <= 1e-4:
        raise AssertionError(f"step H={H}: ours and LSTMCell differ by {diff}")

    def f_ours():
        with torch.no_grad():
            ours(x, initial_state=[h, c])

    def f_peer():
        with torch.no_grad():
            cell(x[:, 0], (h, c))

    fo, fp = _median_pair(f_ours, f_peer, 50, max(reps, 2000))
    return {"cell": "lstm_step", "H": H, "B": 1, "T": 1, "dtype": str(dtype).replace("torch.", ""),
            "forward_ours_s": fo, "forward_torch_s": fp, "forward_ratio": fp / fo}


def geomean(values: List[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def format_grid(rows: List[Dict], cell: str) -> str:
    rows = [r for r in rows if r["cell"] == cell]
    if not rows:
        return ""
    Hs = sorted({r["H"] for r in rows})
    Bs = sorted({r["B"] for r in rows})
    lines = [f"{cell} ({rows[0]['dtype']}, T={rows[0]['T']}): torch.nn time / ours, forward / forward+backward",
             "| H \\ B | " + " | ".join(str(b) for b in Bs) + " |", "|---" * (len(Bs) + 1) + "|"]
    for H in Hs:
        cells = []
        for B in Bs:
            r = next((r for r in rows if r["H"] == H and r["B"] == B), None)
            cells.append("" if r is None else f"{r['forward_ratio']:.2f} / {r['train_ratio']:.2f}")
        lines.append(f"| {H} | " + " | ".join(cells) + " |")
    lines.append(f"geometric mean: forward {geomean([r['forward_ratio'] for r in rows]):.2f}x, "
                 f"forward+backward {geomean([r['train_ratio'] for r in rows]):.2f}x; "
                 f"lowest: forward {min(r['forward_ratio'] for r in rows):.2f}x, "
                 f"forward+backward {min(r['train_ratio'] for r in rows):.2f}x")
    return "\n".join(lines)


def main(argv=None) -> Dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", default="lstm", help="comma-separated subset of lstm,gru,simple_rnn")
    p.add_argument("--H", default="64,128,256,512,1024")
    p.add_argument("--B", default="1,8,32,128")
    p.add_argument("--T", type=int, default=50)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--no-step", action="store_true", help="skip the one-step streaming case")
    p.add_argument("--out", help="write the rows and the machine description here (JSON)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    peak32 = fma_peak(dtype=torch.float32)
    peak = fma_peak(dtype=dtype) if dtype != torch.float32 else peak32
    peak_dtype = args.dtype if peak else "float32"  # no bfloat16 dot product: the float32 peak
    peak = peak or peak32
    rows = []
    for cell in args.cells.split(","):
        for H in [int(h) for h in args.H.split(",")]:
            for B in [int(b) for b in args.B.split(",")]:
                r = grid_case(cell, H, B, args.T, dtype, args.reps)
                r["forward_of_peak"] = r["forward_gflops"] / peak
                rows.append(r)
                if "forward_over_float32" in r:
                    print(f"{cell} H={H} B={B}: {args.dtype} against our float32: forward "
                          f"{r['forward_over_float32']:.2f}x, forward+backward {r['train_over_float32']:.2f}x",
                          file=sys.stderr, flush=True)
                print(f"{cell} H={H} B={B}: forward {r['forward_ratio']:.2f}x "
                      f"({r['forward_ours_s'] * 1e3:.3f} ms, {r['forward_of_peak']:.0%} of the {peak_dtype} FMA peak), "
                      f"forward+backward {r['train_ratio']:.2f}x ({r['train_ours_s'] * 1e3:.3f} ms)",
                      file=sys.stderr, flush=True)
    if not args.no_step:
        for H in (128, 256, 512):
            r = step_case(H, torch.float32, args.reps)
            rows.append(r)
            print(f"step H={H}: ours {r['forward_ours_s'] * 1e6:.1f} us, LSTMCell {r['forward_torch_s'] * 1e6:.1f} us "
                  f"({r['forward_ratio']:.2f}x)", file=sys.stderr, flush=True)
    machine = machine_record(args.threads)
    machine["fma_peak_gflops_float32"] = peak32
    machine["forward_of_peak_dtype"] = peak_dtype
    if peak_dtype != "float32":
        machine[f"fma_peak_gflops_{peak_dtype}"] = peak
    print(f"{machine['cpu']}, {args.threads} threads, ISA {' '.join(machine['isa_flags'])}; "
          f"float32 FMA peak {peak32:.0f} GFLOP/s"
          + (f", {peak_dtype} {peak:.0f} GFLOP/s" if peak_dtype != "float32" else "")
          + f"; torch {torch.__version__}")
    for cell in args.cells.split(","):
        print(format_grid(rows, cell))
        ours32 = [r for r in rows if r["cell"] == cell and "forward_over_float32" in r]
        if ours32:
            print(f"{cell} {args.dtype} against our float32 (time of float32 / {args.dtype}): forward "
                  + ", ".join(f"H={r['H']} B={r['B']} {r['forward_over_float32']:.2f}x" for r in ours32)
                  + "; forward+backward "
                  + ", ".join(f"H={r['H']} B={r['B']} {r['train_over_float32']:.2f}x" for r in ours32))
    for r in rows:
        if r["cell"] == "lstm_step":
            print(f"one step H={r['H']}: ours {r['forward_ours_s'] * 1e6:.1f} us, torch.nn.LSTMCell "
                  f"{r['forward_torch_s'] * 1e6:.1f} us ({r['forward_ratio']:.2f}x)")
    return write_result(machine, rows, args.out)


if __name__ == "__main__":
    main()
