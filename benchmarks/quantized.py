"""Benchmark: int8 inference (cudnn_rnn.quantize_dynamic) against our float32 and torch.ao's
dynamic quantization, in the same process.

    python -m benchmarks.quantized [--H 512,1024] [--B 1,8,32] [--T 50] [--threads N] [--reps 7]
                                   [--out FILE.json]

For each hidden size H and batch B (LSTM, one layer, I = H, T steps, eval, no_grad): the median
time of our float32 layer, of the same layer quantized, and of torch.nn.LSTM with the same weights
quantized by torch.ao.quantization.quantize_dynamic (fbgemm). Before timing, the error of both
quantized models against the float32 output is measured and reported.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import warnings

import torch

import cudnn_rnn
from .run import machine_record, time_calls, write_result


class _Output(torch.nn.Module):
    """torch.nn.LSTM's output alone (torch.ao quantizes children, not the top-level module)."""

    def __init__(self, lstm):
        super().__init__()
        self.lstm = lstm

    def forward(self, x):
        return self.lstm(x)[0]


def _median(f, reps: int) -> float:
    return statistics.median(time_calls(f, 1, reps, "cpu"))


def case(H: int, B: int, T: int, reps: int):
    torch.manual_seed(0)
    ours = cudnn_rnn.LSTM(H, H, return_sequences=True).eval()
    quantized = cudnn_rnn.quantize_dynamic(ours)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notice
        theirs = torch.ao.quantization.quantize_dynamic(_Output(ours.to_torch()).eval(), {torch.nn.LSTM},
                                                        dtype=torch.qint8)
    x = torch.randn(B, T, H)
    with torch.no_grad():
        want = ours(x)
        err_ours = (quantized(x) - want).abs().max().item()
        err_theirs = (theirs(x) - want).abs().max().item()
        f32 = _median(lambda: ours(x), reps)
        q = _median(lambda: quantized(x), reps)
        ao = _median(lambda: theirs(x), reps)
    return {"H": H, "B": B, "T": T, "float32_s": f32, "int8_s": q, "torch_ao_int8_s": ao,
            "int8_over_float32": f32 / q, "torch_ao_over_int8": ao / q, "error_int8": err_ours,
            "error_torch_ao": err_theirs}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--H", default="512,1024")
    p.add_argument("--B", default="1,8,32")
    p.add_argument("--T", type=int, default=50)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    machine = machine_record(args.threads)
    machine["int8_kernel"] = cudnn_rnn._C.cpu_int8_gemm_isa() if cudnn_rnn.int8_available() else "none (float32)"
    rows = []
    for H in [int(h) for h in args.H.split(",")]:
        for B in [int(b) for b in args.B.split(",")]:
            r = case(H, B, args.T, args.reps)
            rows.append(r)
            print(f"H={H} B={B}: float32 {r['float32_s'] * 1e3:.2f} ms, int8 {r['int8_s'] * 1e3:.2f} ms "
                  f"({r['int8_over_float32']:.2f}x), torch.ao int8 {r['torch_ao_int8_s'] * 1e3:.2f} ms; "
                  f"max error int8 {r['error_int8']:.1e}, torch.ao {r['error_torch_ao']:.1e}", file=sys.stderr)
    print(f"{machine['cpu']}, {args.threads} threads, int8 kernel: {machine['int8_kernel']}; torch {torch.__version__}")
    print("| H | B | float32 ms | int8 ms | int8 / float32 speed-up | torch.ao int8 ms | error int8 | error torch.ao |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['H']} | {r['B']} | {r['float32_s'] * 1e3:.2f} | {r['int8_s'] * 1e3:.2f} | "
              f"{r['int8_over_float32']:.2f}x | {r['torch_ao_int8_s'] * 1e3:.2f} | {r['error_int8']:.1e} | "
              f"{r['error_torch_ao']:.1e} |")
    return write_result(machine, rows, args.out)


if __name__ == "__main__":
    main()
