"""CPU benchmark: cudnn_rnn against torch.nn in the same process and thread count.

    python -m benchmarks.run [--quick] [--threads N] [--device cpu|cuda] [--json PATH]

Workload: fastrnns' default, T=100, layers=1, I=512, H=512, B=64 (batch-major input for both).
Forward is inference (eval, no_grad); forward+backward is a training step without optimizer
(the gradient of sum(output) w.r.t. input and weights). Reported: median and spread (min-max)
of the repeated timings after warm-up, and torch time / our time (>1 means we are faster).
On CUDA, times come from CUDA events around each repetition (the work is queued, then timed on
the device), and both sides run on cuDNN when the configuration allows (cudnn_rnn.explain).
"""
import argparse
import json
import statistics
import time

import torch

import cudnn_rnn

WORKLOADS = {"fastrnns": dict(T=100, layers=1, I=512, H=512, B=64)}


def _time(fn, warmup, reps, device):
    for _ in range(warmup):
        fn()
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
    return statistics.median(samples), min(samples), max(samples)


def _pair(cell, w):
    """(ours, torch.nn) computing the same function with the same weights."""
    cls = {"lstm": cudnn_rnn.LSTM, "gru": cudnn_rnn.GRU}[cell]
    ours = cls(w["I"], w["H"], num_layers=w["layers"], return_sequences=True)
    return ours, ours.to_torch()


def bench(cell, name, w, warmup, reps, device="cpu"):
    torch.manual_seed(0)
    ours, ref = _pair(cell, w)
    ours, ref = ours.to(device), ref.to(device)
    x = torch.randn(w["B"], w["T"], w["I"], device=device)
    rows = []
    for mode in ("forward", "forward+backward"):
        if mode == "forward":
            ours.eval(), ref.eval()

            def run_ours():
                with torch.no_grad():
                    ours(x)

            def run_ref():
                with torch.no_grad():
                    ref(x)
        else:
            ours.train(), ref.train()
            xg = x.clone().requires_grad_(True)

            def run_ours():
                ours(xg).sum().backward()

            def run_ref():
                ref(xg)[0].sum().backward()
        t_ours = _time(run_ours, warmup, reps, device)
        t_ref = _time(run_ref, warmup, reps, device)
        rows.append(dict(workload=name, cell=cell, mode=mode, ours_ms=[t * 1e3 for t in t_ours],
                         torch_ms=[t * 1e3 for t in t_ref], speedup=t_ref[0] / t_ours[0]))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU")
    torch.set_num_threads(args.threads)
    warmup, reps = (1, 3) if args.quick else (3, 10)
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{torch.get_num_threads()} thread(s)"
    print(f"torch {torch.__version__}, {where}, cudnn_rnn {cudnn_rnn.__version__}, build {cudnn_rnn.build_info()}")
    print(f"{'workload':10s} {'cell':5s} {'mode':17s} {'ours ms (min-max)':>24s} {'torch.nn ms (min-max)':>24s} {'torch/ours':>10s}")
    results = []
    for name, w in WORKLOADS.items():
        for cell in ("lstm", "gru"):
            for r in bench(cell, name, w, warmup, reps, args.device):
                o, t = r["ours_ms"], r["torch_ms"]
                print(f"{name:10s} {cell:5s} {r['mode']:17s} {o[0]:9.1f} ({o[1]:6.1f}-{o[2]:6.1f}) "
                      f"{t[0]:9.1f} ({t[1]:6.1f}-{t[2]:6.1f}) {r['speedup']:9.2f}x", flush=True)
                results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "threads": args.threads, "torch": torch.__version__, "results": results},
                      f, indent=2)
    return results


if __name__ == "__main__":
    main()
