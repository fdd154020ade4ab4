"""Where a call of the cuDNN path spends its time, against torch.nn, on one GPU.

For small (latency), Keras-typical masked and fastrnns LSTM shapes: the time per call (CUDA
events over many calls; the host's time per call beside it) for each cuDNN I/O layout
(CUDNN_RNN_CUDNN_LAYOUT, one process each) and algorithm, and a profiler table of the kernels and
runtime calls of one small call, ours and torch.nn's.

    python -m benchmarks.cuda_profile [--out DIR] [--profile]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

CASES = [  # name, B, T, I, H, masked
    ("latency", 1, 50, 128, 128, False),
    ("keras-typical", 32, 100, 64, 64, True),
    ("fastrnns", 64, 100, 512, 512, False),
]
LAYOUTS = ["batch", "seq"]


def _inputs(B, T, I, masked, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, I, generator=g).cuda()
    mask = None
    if masked:
        lengths = torch.randint(1, T + 1, (B,), generator=g)
        mask = (torch.arange(T)[None, :] < lengths[:, None]).cuda()
    return x, mask


def _time(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    host = (time.perf_counter() - t0) / reps * 1e3
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps, host


def _ours(I, H):
    import cudnn_rnn

    torch.manual_seed(0)
    return cudnn_rnn.LSTM(I, H, return_sequences=True).cuda()


def _torch(I, H):
    torch.manual_seed(0)
    return torch.nn.LSTM(I, H, batch_first=True).cuda()


def measure(layout):
    """One process's rows (its CUDNN_RNN_CUDNN_LAYOUT is `layout`)."""
    import cudnn_rnn

    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for name, B, T, I, H, masked in CASES:
        x, mask = _inputs(B, T, I, masked)
        ours, ref = _ours(I, H), _torch(I, H)
        reps = 50 if H < 512 else 20
        for algo in ("auto", "standard"):
            cudnn_rnn.set_cudnn_algorithm(algo)
            before = cudnn_rnn.cudnn_fallback_count()
            with torch.no_grad():
                fwd = _time(lambda: ours(x, mask=mask), reps)

            def train():
                ours(x, mask=mask).sum().backward()

            both = _time(train, reps)
            rows.append(dict(case=name, impl="cudnn_rnn", layout=layout, algo=algo, forward_ms=fwd[0],
                             forward_host_ms=fwd[1], train_ms=both[0], train_host_ms=both[1],
                             fallbacks=cudnn_rnn.cudnn_fallback_count() - before))
        if layout == LAYOUTS[0]:
            with torch.no_grad():
                fwd = _time(lambda: ref(x), reps)

            def train_ref():
                ref(x)[0].sum().backward()

            both = _time(train_ref, reps)
            rows.append(dict(case=name, impl="torch.nn" + (" padded" if masked else ""), layout="-", algo="-",
                             forward_ms=fwd[0], forward_host_ms=fwd[1], train_ms=both[0], train_host_ms=both[1]))
    cudnn_rnn.set_cudnn_algorithm("auto")
    return rows


def profile_table():
    """Kernels and runtime calls of 10 small no-grad calls, ours then torch.nn's."""
    from torch.profiler import ProfilerActivity, profile

    name, B, T, I, H, _ = CASES[0]
    x, _ = _inputs(B, T, I, False)
    out = []
    for label, m in (("cudnn_rnn", _ours(I, H)), ("torch.nn", _torch(I, H))):
        with torch.no_grad():
            for _ in range(3):
                m(x)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    m(x)
                torch.cuda.synchronize()
        out.append(f"== {label}, {name} (B={B}, T={T}, H={H}), 10 no-grad calls ==")
        out.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
        out.append(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15))
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(measure(a.child)))
        return
    rows = []
    for layout in LAYOUTS:
        env = dict(os.environ, CUDNN_RNN_CUDNN_LAYOUT=layout)
        r = subprocess.run([sys.executable, "-m", "benchmarks.cuda_profile", "--child", layout], env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"[{layout}] failed:\n{r.stderr[-3000:]}")
            continue
        rows += json.loads(r.stdout.strip().splitlines()[-1])
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          "full float32; ms per call (GPU events; host ms beside)")
    print(f"{'case':14} {'impl':18} {'layout':7} {'algo':9} {'fwd':>8} {'(host)':>8} {'fwd+bwd':>8} {'(host)':>8}")
    for r in rows:
        print(f"{r['case']:14} {r['impl']:18} {r['layout']:7} {r['algo']:9} {r['forward_ms']:8.3f} "
              f"{r['forward_host_ms']:8.3f} {r['train_ms']:8.3f} {r['train_host_ms']:8.3f}"
              + (f"  fallbacks {r['fallbacks']}" if r.get("fallbacks") else ""))
    table = profile_table() if a.profile else ""
    print(table)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "cuda_profile.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           cudnn=torch.backends.cudnn.version(), rows=rows), f, indent=1)
        with open(os.path.join(a.out, "cuda_profile.txt"), "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
