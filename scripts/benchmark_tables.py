"""Writes docs/guides/results.md: one table per committed benchmark result (docs/benchmarks-*.json),
with the machine (CPU model and instruction sets, or the GPU), the torch version and the date.

    python scripts/benchmark_tables.py          # rewrite the page
    python scripts/benchmark_tables.py --check  # exit 1 if the page is stale (tests/test_docs.py)

RESULTS lists every committed result with the date it was measured and what it is: files written
before the benchmarks recorded a date get it here. A result file that RESULTS does not list is an
error, so a new result cannot be committed without its page entry.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
PAGE = os.path.join(DOCS, "guides", "results.md")

# (file in docs/, date measured, machine when the file does not record it, what the run is)
RESULTS = [
    ("benchmarks-grid-cpu-intel-icelake.json", "2026-11-28", "Intel Xeon, family 6 model 106 (Ice Lake)",
     "LSTM size grid (T=50, I=H) and one step (T=1, B=1), `benchmarks.grid`"),
    ("benchmarks-grid-cpu-intel-icelake-avx2.json", "2026-11-28", "Intel Xeon, family 6 model 106 (Ice Lake)",
     "the same grid, `ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`"),
    ("benchmarks-grid-gru-simplernn-cpu-intel-icelake.json", "2026-11-28", "Intel Xeon, family 6 model 106 (Ice Lake)",
     "GRU and SimpleRNN size grid (T=50, I=H), `benchmarks.grid --cells gru,simple_rnn --no-step`"),
    ("benchmarks-grid-gru-simplernn-cpu-intel-icelake-avx2.json", "2026-11-28", "Intel Xeon, family 6 model 106 (Ice Lake)",
     "the same grid, `ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`"),
    ("benchmarks-grid-bf16-cpu-intel-icelake.json", "2026-11-28", "Intel Xeon, family 6 model 106 (Ice Lake)",
     "LSTM bfloat16 (computed in float32: no AVX512_BF16 or AMX), `benchmarks.grid --dtype bfloat16`"),
    ("benchmarks-int8-cpu-intel-icelake.json", "2026-11-28", "Intel Xeon, family 6 model 106 (Ice Lake)",
     "int8 inference (the AVX512_VNNI build), `benchmarks.quantized`"),
    ("benchmarks-int8-cpu-intel-icelake-avx2-novnni.json", "2026-11-28", "Intel Xeon, family 6 model 106 (Ice Lake)",
     "int8 inference at the AVX2 level (the plain AVX2 build: no AVX_VNNI on this CPU), `benchmarks.quantized`, `ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`"),
    ("benchmarks-cpu-intel-icelake-fastrnns.json", "2026-11-28", "Intel Xeon, family 6 model 106 (Ice Lake)",
     "fastrnns workloads, `benchmarks.run --only fastrnns --peers torch --quick`"),
    ("benchmarks-convlstm2d-cpu-intel-icelake-avx512.json", "2026-11-28", "Intel Xeon, family 6 model 106 (Ice Lake)", "ConvLSTM2D, `benchmarks.conv_lstm`"),
    ("benchmarks-convlstm2d-cpu-intel-icelake-avx2.json", "2026-11-28", "Intel Xeon, family 6 model 106 (Ice Lake)",
     "ConvLSTM2D, `benchmarks.conv_lstm`, `ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`"),
    ("benchmarks-cuda-h100.json", "2026-11-27", None,
     "all workloads, `--quick`, full float32 (the 2 host cores beside it ran CPU benchmarks)"),
    ("benchmarks-cuda-h200.json", "2026-11-26", None, "all workloads, `--quick`, full float32"),
    ("benchmarks-grid-cpu-intel-xeon.json", "2026-11-27", "Intel Xeon, family 6 model 207 (Emerald Rapids)",
     "LSTM size grid (T=50, I=H) and one step (T=1, B=1), `benchmarks.grid`, 2 threads pinned to 2 of the machine's 16 cores, other benchmarks on other cores"),
    ("benchmarks-grid-cpu-intel-xeon-avx2.json", "2026-11-27", "Intel Xeon, family 6 model 207 (Emerald Rapids)",
     "the same grid, `ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`, the packed kernel's AVX2 build for GEMMs of every size (what `CUDNN_RNN_CPU_GEMM=packed` runs), 2 threads pinned to 2 of the machine's 16 cores, other benchmarks on other cores"),
    ("benchmarks-grid-cpu-intel-xeon-small-packed.json", "2026-11-26",
     "Intel Xeon, family 6 model 207 (Emerald Rapids)",
     "LSTM at B=1-8, `CUDNN_RNN_CPU_GEMM=packed CUDNN_RNN_CPU_SPLIT=units`: the packed kernel the forward "
     "products of fewer than 8 rows and of one step run by default"),
    ("benchmarks-grid-bf16-cpu-intel-xeon.json", "2026-11-27", "Intel Xeon, family 6 model 207 (Emerald Rapids)",
     "LSTM bfloat16 grid (AMX, oneDNN's micro-kernel), `benchmarks.grid --dtype bfloat16`, 2 threads pinned to 2 of the machine's 16 cores, other benchmarks on other cores"),
    ("benchmarks-int8-cpu-intel-xeon.json", "2026-11-27", "Intel Xeon, family 6 model 207 (Emerald Rapids)",
     "int8 inference (the AVX512_VNNI build), `benchmarks.quantized`, 2 threads pinned to 2 of the machine's 16 cores, other benchmarks on other cores"),
    ("benchmarks-int8-cpu-intel-xeon-avx2.json", "2026-11-27", "Intel Xeon, family 6 model 207 (Emerald Rapids)",
     "int8 inference at the AVX2 level (the AVX_VNNI build), `benchmarks.quantized`, `ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`, 2 threads pinned to 2 of the machine's 16 cores, other benchmarks on other cores"),
    ("benchmarks-cpu-intel-xeon-fastrnns.json", "2026-11-27", "Intel Xeon, family 6 model 207 (Emerald Rapids)",
     "fastrnns workloads, `benchmarks.run --only fastrnns --peers torch --quick`, 2 threads pinned to 2 of the machine's 16 cores, other benchmarks on other cores"),
    ("benchmarks-grid-cpu-amd-zen5.json", "2026-11-26", "AMD EPYC Zen 5, family 26 model 2",
     "LSTM size grid (T=50, I=H) and one step (T=1, B=1), `benchmarks.grid`"),
    ("benchmarks-grid-cpu-amd-zen5-avx2.json", "2026-11-26", "AMD EPYC Zen 5, family 26 model 2",
     "the same grid, `ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`"),
    ("benchmarks-grid-bf16-cpu-amd-zen5.json", "2026-11-27", "AMD EPYC Zen 5, family 26 model 2",
     "LSTM bfloat16 grid (the AVX512_BF16 kernel), `benchmarks.grid --dtype bfloat16`"),
    ("benchmarks-int8-cpu-amd-zen5.json", "2026-11-26", "AMD EPYC Zen 5, family 26 model 2", "int8 inference, `benchmarks.quantized`"),
    ("benchmarks-int8-cpu-amd-zen5-avx2.json", "2026-11-27", "AMD EPYC Zen 5, family 26 model 2",
     "int8 inference at the AVX2 level (the AVX_VNNI build), `benchmarks.quantized`, `ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`"),
    ("benchmarks-int8-cpu-amd-zen5-avx2-novnni.json", "2026-11-27", "AMD EPYC Zen 5, family 26 model 2",
     "int8 inference on the AVX2 build (no VNNI), `benchmarks.quantized`, the AVX2 level and `CUDNN_RNN_CPU_INT8=avx2`"),
    ("benchmarks-cpu-amd-zen5-fastrnns.json", "2026-11-27", "AMD EPYC Zen 5, family 26 model 2",
     "fastrnns workloads, `benchmarks.run --only fastrnns --peers torch`"),
    ("benchmarks-convlstm2d-cpu-amd-zen5-avx512.json", "2026-11-27", "AMD EPYC Zen 5, family 26 model 2", "ConvLSTM2D, `benchmarks.conv_lstm`"),
    ("benchmarks-convlstm2d-cpu-amd-zen5-avx2.json", "2026-11-27", "AMD EPYC Zen 5, family 26 model 2",
     "ConvLSTM2D, `benchmarks.conv_lstm`, `ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`"),
    ("benchmarks-cpu-amd-zen4-fastrnns.json", "2026-11-29", "AMD EPYC Zen 4, family 25 model 17",
     "fastrnns workloads, `benchmarks.run --only fastrnns --peers torch`"),
    ("benchmarks-grid-lstm-cpu-amd-zen4.json", "2026-11-29", "AMD EPYC Zen 4, family 25 model 17",
     "LSTM size grid (T=50, I=H) and one step (T=1, B=1), `benchmarks.grid --cells lstm`"),
    ("benchmarks-grid-cpu-amd-zen4.json", "2026-11-26", "AMD EPYC Zen 4",
     "LSTM / GRU / SimpleRNN size grid (T=50, I=H) and one step (T=1, B=1), `benchmarks.grid`"),
    ("benchmarks-grid-cpu-amd-zen4-avx2.json", "2026-11-26", "AMD EPYC Zen 4",
     "the same grid, `ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`"),
    ("benchmarks-step-cpu-amd-zen4.json", "2026-11-26", "AMD EPYC Zen 4",
     "one step (T=1, B=1, no_grad) against torch.nn.LSTMCell, and the H=64, B=1 cell, `benchmarks.grid --H 64 --B 1`"),
    ("benchmarks-step-cpu-amd-zen4-avx2.json", "2026-11-26", "AMD EPYC Zen 4",
     "the same, `ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`"),
    ("benchmarks-grid-bf16-cpu-amd-zen4.json", "2026-11-26", "AMD EPYC Zen 4",
     "LSTM bfloat16 grid, `benchmarks.grid --dtype bfloat16`"),
    ("benchmarks-int8-cpu-amd-zen4.json", "2026-11-26", "AMD EPYC Zen 4", "int8 inference, `benchmarks.quantized`"),
    ("benchmarks-cpu-intel-avx512-fastrnns.json", "2026-11-24", None, "fastrnns workloads, 10 repetitions"),
    ("benchmarks-cpu-intel-avx2-fastrnns.json", "2026-11-24", None,
     "fastrnns workloads, 10 repetitions, `ATEN_CPU_CAPABILITY=avx2`"),
    ("benchmarks-cpu-intel-bf16-fastrnns.json", "2026-11-24", None, "fastrnns workloads in bfloat16 (AMX)"),
    ("benchmarks-cpu-intel-avx512-packed-fastrnns.json", "2026-11-24", None,
     "fastrnns workloads with `CUDNN_RNN_CPU_GEMM=packed`"),
    ("benchmarks-cpu-intel-avx512-loaded-fastrnns.json", "2026-11-24", None,
     "fastrnns workloads with a busy core beside the run"),
    ("benchmarks-cpu-intel-avx512-quick.json", "2026-11-23", None, "all workloads, `--quick`"),
    ("benchmarks-cpu-intel-avx2-quick.json", "2026-11-23", None, "all workloads, `--quick`, `ATEN_CPU_CAPABILITY=avx2`"),
    ("benchmarks-cpu-intel-bf16-quick.json", "2026-11-23", None, "all workloads, `--quick`, bfloat16"),
    ("benchmarks-convlstm2d-cpu-amd-zen4-avx512.json", "2026-11-26", None, "ConvLSTM2D, `benchmarks.conv_lstm`"),
    ("benchmarks-convlstm2d-cpu-amd-zen4-avx2.json", "2026-11-26", None,
     "ConvLSTM2D, `benchmarks.conv_lstm`, `ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`"),
    ("benchmarks-convlstm2d-cpu-intel-avx512.json", "2026-11-27", "Intel Xeon, family 6 model 207 (Emerald Rapids)",
     "ConvLSTM2D, `benchmarks.conv_lstm`, 2 threads pinned to 2 of the machine's 16 cores, other benchmarks on other cores"),
    ("benchmarks-convlstm2d-cpu-intel-avx2.json", "2026-11-27", "Intel Xeon, family 6 model 207 (Emerald Rapids)",
     "ConvLSTM2D, `benchmarks.conv_lstm`, `ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`, 2 threads pinned to 2 of the machine's 16 cores, other benchmarks on other cores"),
    ("benchmarks-cpu.json", "2026-11-22", "AMD EPYC Zen 3 (AVX2)", "all workloads, 10 repetitions, Keras 3 peer"),
    ("benchmarks-cpu-with-tf-keras.json", "2026-11-22", "AMD EPYC Zen 3 (AVX2)",
     "all workloads, TF Keras peer (`CUDNN_RNN_BENCH=1`)"),
]


def _machine(data: dict, fallback) -> str:
    m = data.get("machine") or {}
    if data.get("device") == "cuda" or data.get("device_name", "").startswith("NVIDIA"):
        name = data.get("device_name") or m.get("device")
        return f"{name} (host: {m.get('cpu', '?')})"
    flags = [f for f in m.get("isa_flags", []) if f.startswith(("avx512", "amx"))] or m.get("isa_flags", [])
    name = fallback or m.get("cpu", "?")
    return f"{name} ({', '.join(flags)})" if flags else name


def _details(data: dict) -> str:
    m, v = data.get("machine") or {}, data.get("versions") or {}
    parts = []
    if m.get("aten_cpu_capability"):
        parts.append(f"ATen level {m['aten_cpu_capability']}")
    if v.get("torch"):
        parts.append(f"torch {v['torch']}")
    if data.get("threads"):
        parts.append(f"{data['threads']} threads")
    if data.get("dtype"):
        parts.append(data["dtype"])
    return "; ".join(parts)


def _workload_table(data: dict) -> list:
    """benchmarks.run: ours in ms, each peer as peer time / ours."""
    cells, peers = defaultdict(dict), []
    for r in data["rows"]:
        key = (r["workload"], r["cell"], r["mode"])
        if r["implementation"] == "cudnn_rnn":
            cells[key]["ours"] = r["time_ms"]["median"] if r.get("time_ms") else None
        else:
            if r["implementation"] not in peers:
                peers.append(r["implementation"])
            cells[key][r["implementation"]] = r.get("peer_over_ours")
    lines = ["| workload | cell | mode | ours ms | " + " | ".join(f"{p} / ours" for p in peers) + " |",
             "|---|---|---|---|" + "---|" * len(peers)]
    for (w, c, mode), v in cells.items():
        ours = f"{v['ours']:.2f}" if v.get("ours") else "n/a"
        ratios = [f"{v[p]:.2f}" if isinstance(v.get(p), float) else ("n/a" if p in v else "") for p in peers]
        lines.append(f"| {w} | {c} | {mode} | {ours} | " + " | ".join(ratios) + " |")
    return lines


def _grid_table(data: dict) -> list:
    rows = data["rows"]
    bf16 = "forward_over_float32" in rows[0]
    head = "| cell | H | B | T | forward: torch.nn / ours | forward+backward: torch.nn / ours |"
    sep = "|---|---|---|---|---|---|"
    if bf16:
        head += " forward: our float32 / ours | forward+backward: our float32 / ours |"
        sep += "---|---|"
    lines = [head, sep]
    for r in rows:
        train = f"{r['train_ratio']:.2f}" if "train_ratio" in r else "-"
        line = f"| {r['cell']} | {r['H']} | {r['B']} | {r['T']} | {r['forward_ratio']:.2f} | {train} |"
        if bf16:
            line += f" {r['forward_over_float32']:.2f} | {r['train_over_float32']:.2f} |"
        lines.append(line)
    return lines


def _int8_table(data: dict) -> list:
    lines = ["| H | B | T | our float32 / our int8 | torch.ao int8 / ours | max error int8 | max error torch.ao |",
             "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(f"| {r['H']} | {r['B']} | {r['T']} | {r['int8_over_float32']:.2f} | {r['torch_ao_over_int8']:.2f} "
                     f"| {r['error_int8']:.1e} | {r['error_torch_ao']:.1e} |")
    return lines


def _conv_table(data: dict) -> list:
    lines = ["| mode | implementation | median ms | min-max ms |", "|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(f"| {r['mode']} | {r['implementation']} | {r['median_ms']:.1f} | "
                     f"{r['min_ms']:.1f}-{r['max_ms']:.1f} |")
    return lines


def _table(data: dict) -> list:
    first = data["rows"][0]
    if "workload" in first:
        return _workload_table(data)
    if "int8_over_float32" in first:
        return _int8_table(data)
    if "forward_ratio" in first:
        return _grid_table(data)
    return _conv_table(data)


def page() -> str:
    committed = {os.path.basename(p) for p in glob.glob(os.path.join(DOCS, "benchmarks-*.json"))}
    listed = {name for name, *_ in RESULTS}
    if committed != listed:
        raise SystemExit(f"scripts/benchmark_tables.py RESULTS must list every docs/benchmarks-*.json: "
                         f"unlisted {sorted(committed - listed)}, missing {sorted(listed - committed)}")
    out = ["# Results by machine", "",
           "Every committed benchmark result, newest first, as `scripts/benchmark_tables.py` renders it from",
           "the JSON in `docs/`. Ratios are the peer's time over ours (>1: cudnn_rnn is faster); what each",
           "workload is and how to reproduce a run: [Performance](performance.md).", ""]
    for name, date, machine, what in RESULTS:
        with open(os.path.join(DOCS, name)) as f:
            data = json.load(f)
        out += [f"## {_machine(data, machine)}, {date}: {what}", ""]
        details = _details(data)
        out += [f"`docs/{name}`" + (f"; {details}." if details else "."), ""]
        out += _table(data) + [""]
    return "\n".join(out).rstrip() + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/guides/results.md is stale")
    args = parser.parse_args(argv)
    text = page()
    if args.check:
        with open(PAGE, encoding="utf-8") as f:
            return 0 if f.read() == text else 1
    with open(PAGE, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(PAGE, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
