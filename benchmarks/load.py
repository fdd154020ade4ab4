"""Benchmark: how long load_keras takes on the shipped fixtures (valid Keras-written files).

    python -m benchmarks.load [--repeat N] [--json PATH]

Each fixture is loaded once to warm up (the first load also starts the parser helper), then N
times; the median and min are printed per file, with the sum of the medians. Run it at two
commits to compare (a change to the loader must not slow valid files down by more than 10 %).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fixtures", "data")
FILES = [("k3_sequential.keras", None), ("k3_functional.keras", None), ("k3_sequential.h5", None),
         ("k3_functional.h5", None), ("tfk_sequential.h5", None), ("tfk_functional.h5", None), ("tfk_cudnn.h5", None),
         ("tfk_nested.h5", None), ("tfk_sequential.keras", None), ("k3_sequential.weights.h5", "k3_sequential.keras"),
         ("tfk_sequential_weights.h5", "tfk_sequential.json")]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    from cudnn_rnn.keras import load_keras

    torch.set_num_threads(1)
    results = {}
    for name, arch in FILES:
        path = os.path.join(DATA, name)
        architecture = None
        if arch:
            architecture = os.path.join(DATA, arch)
            if arch.endswith(".json"):
                with open(architecture) as f:
                    architecture = f.read()
        load_keras(path, architecture=architecture)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            load_keras(path, architecture=architecture)
            times.append(time.perf_counter() - start)
        results[name] = {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3}
        print(f"{name:28s} median {results[name]['median_ms']:7.2f} ms   min {results[name]['min_ms']:7.2f} ms")
    total = sum(r["median_ms"] for r in results.values())
    print(f"{'sum of medians':28s}        {total:7.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
