"""Benchmark: cudnn_rnn.ConvLSTM2D against Keras 3's ConvLSTM2D (torch backend), same process,
same weights, same thread count.

    python -m benchmarks.conv_lstm [--quick] [--device cpu|cuda] [--threads N] [--json PATH]
                                   [--batch 8] [--time 10] [--size 32] [--channels 16] [--filters 32]

The default case is the issue's: B=8, T=10, 32x32x16 inputs, 32 filters, 3x3 kernels, padding
"same", return_sequences. Before timing, the two outputs are compared (float32, atol=rtol=1e-4;
a disagreement stops the run). Measured: "forward" (no_grad) and "forward+backward" (the
gradients of sum(output) w.r.t. the input and every weight), median and min-max of repeated
calls after warm-up (--quick: 1 warm-up, 3 timed). Ratios are Keras time / our time (>1: we are
faster). The machine (CPU model, ISA, ATen's dispatch level) is printed and written to the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import cudnn_rnn  # noqa: E402
from benchmarks.run import _machine, time_calls  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--time", type=int, default=10)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--channels", type=int, default=16)
    p.add_argument("--filters", type=int, default=32)
    return p.parse_args(argv)


def build(args):
    import keras

    if keras.backend.backend() != "torch":
        raise SystemExit("the Keras peer needs KERAS_BACKEND=torch")
    torch.manual_seed(0)
    ours = cudnn_rnn.ConvLSTM2D(args.channels, args.filters, 3, padding="same", return_sequences=True,
                                device=args.device)
    with torch.no_grad():
        for p in ours.parameters():
            p.uniform_(-0.1, 0.1)
    peer = keras.layers.ConvLSTM2D(args.filters, 3, padding="same", return_sequences=True)
    shape = (args.batch, args.time, args.size, args.size, args.channels)
    peer.build(shape)
    peer.set_weights([p.detach().cpu().numpy() for p in ours.parameters()])
    x = torch.randn(*shape, device=args.device)
    return ours, peer, x


def measure(args) -> dict:
    import keras

    # Keras's torch backend places layers on CUDA wherever a GPU is visible; the peer runs on the
    # benchmark's device, as ours does.
    with keras.device(args.device):
        return _measure(args)


def _measure(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    ours, peer, x = build(args)

    def ours_forward():
        with torch.no_grad():
            return ours(x)

    def peer_forward():
        with torch.no_grad():
            return peer(x, training=False)

    expected = peer_forward()
    got = ours_forward()
    torch.testing.assert_close(got, torch.as_tensor(np.asarray(expected.detach().cpu()), device=got.device),
                               atol=1e-4, rtol=1e-4, msg=lambda m: f"Keras's ConvLSTM2D disagrees with ours: {m}")

    xg = x.clone().requires_grad_(True)

    def ours_train():
        ours.zero_grad(set_to_none=True)
        xg.grad = None
        ours(xg).sum().backward()

    def peer_train():
        xg.grad = None
        for w in peer.trainable_weights:
            w.value.grad = None
        peer(xg, training=True).sum().backward()

    warmup, reps = (1, 3) if args.quick else (2, 7)
    rows = []
    for mode, ours_fn, peer_fn in (("forward", ours_forward, peer_forward),
                                   ("forward+backward", ours_train, peer_train)):
        times = {}
        for name, fn in (("cudnn_rnn", ours_fn), ("keras3", peer_fn)):
            samples = time_calls(fn, warmup, reps, args.device)
            times[name] = samples
            rows.append({"mode": mode, "implementation": name, "median_ms": 1e3 * statistics.median(samples),
                         "min_ms": 1e3 * min(samples), "max_ms": 1e3 * max(samples)})
        rows[-1]["peer_over_ours"] = statistics.median(times["keras3"]) / statistics.median(times["cudnn_rnn"])
    import keras

    return {"case": {k: getattr(args, k) for k in ("batch", "time", "size", "channels", "filters")},
            "device": args.device, "threads": torch.get_num_threads(), "quick": args.quick,
            "machine": _machine(torch.cuda.get_device_name() if args.device == "cuda" else "cpu"),
            "versions": {"torch": torch.__version__, "keras": keras.__version__, "cudnn_rnn": cudnn_rnn.__version__},
            "rows": rows}


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = measure(args)
    m = result["machine"]
    c = result["case"]
    print(f"ConvLSTM2D B={c['batch']} T={c['time']} {c['size']}x{c['size']}x{c['channels']} filters={c['filters']} "
          f"3x3 same; {result['device']}, {result['threads']} threads; cpu: {m['cpu']}; ISA {' '.join(m['isa_flags'])}; "
          f"ATen dispatches {m['aten_cpu_capability']}")
    print(f"{'mode':18s} {'implementation':15s} {'median ms':>10s} {'(min-max)':>20s} {'keras/ours':>10s}")
    for r in result["rows"]:
        ratio = f"{r['peer_over_ours']:.2f}x" if "peer_over_ours" in r else ""
        print(f"{r['mode']:18s} {r['implementation']:15s} {r['median_ms']:10.2f} "
              f"({r['min_ms']:8.2f}-{r['max_ms']:8.2f}) {ratio:>10s}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
