"""The benchmark's PNG: per mode (forward, forward+backward), the median time of every
implementation on every case (log scale, min-max as error bars) and the fraction of the
measured GEMM peak it reached. Implementations that cannot express a case are marked n/a."""
from __future__ import annotations

from typing import Dict, List

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODES = ("forward", "forward+backward")
# Legend order; implementations not listed here follow in the order they appear.
ORDER = ("cudnn_rnn", "torch.nn", "torch.nn padded", "torch.nn packed", "keras3 (torch)", "tf_keras")


def plot(report: Dict, path: str) -> None:
    rows: List[Dict] = report["rows"]
    cases = []
    for r in rows:
        key = (r["workload"], r["cell"])
        if key not in cases:
            cases.append(key)
    seen = [r["implementation"] for r in rows]
    impls = [name for name in ORDER if name in seen]
    impls += [name for name in dict.fromkeys(seen) if name not in impls]
    colors = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(impls)}
    by_key = {(r["workload"], r["cell"], r["mode"], r["implementation"]): r for r in rows}

    width = 0.8 / max(1, len(impls))
    fig, axes = plt.subplots(4, 1, figsize=(max(8, 0.85 * len(cases) + 2), 16), squeeze=False)
    for m, mode in enumerate(MODES):
        ax_t, ax_f = axes[2 * m][0], axes[2 * m + 1][0]
        for i, impl in enumerate(impls):
            xs, ts, lo, hi, fs, na_xs = [], [], [], [], [], []
            for c, (wl, cell) in enumerate(cases):
                r = by_key.get((wl, cell, mode, impl))
                if r is None:
                    continue
                x = c + (i - (len(impls) - 1) / 2) * width
                if r["status"] != "ok":
                    na_xs.append(x)
                    continue
                t = r["time_ms"]
                xs.append(x), ts.append(t["median"]), lo.append(t["median"] - t["min"]), hi.append(t["max"] - t["median"])
                fs.append(r["fraction_of_peak"])
            ax_t.bar(xs, ts, width, yerr=[lo, hi], color=colors[impl], label=impl, capsize=1.5, error_kw={"lw": 0.6})
            ax_f.bar(xs, fs, width, color=colors[impl], label=impl)
            for x in na_xs:
                for ax in (ax_t, ax_f):
                    ax.text(x, 0.02, "n/a", rotation=90, ha="center", va="bottom", fontsize=6,
                            transform=ax.get_xaxis_transform(), color=colors[impl])
        labels = [f"{wl}\n{cell}" for wl, cell in cases]
        for ax in (ax_t, ax_f):
            ax.set_xticks(range(len(cases)))
            ax.set_xticklabels(labels, fontsize=7)
            ax.set_xlim(-0.6, len(cases) - 0.4)
            ax.grid(axis="y", alpha=0.3)
        ax_t.set_yscale("log")
        ax_t.set_ylabel("median time per call (ms, log)")
        ax_t.set_title(f"{mode}: time (lower is better)")
        source = "FMA throughput" if report["gemm"].get("peak") == "fma" else "torch.mm"
        ax_f.set_ylabel(f"fraction of measured peak ({source})")
        ax_f.set_title(f"{mode}: achieved GEMM FLOP rate / peak ({report['gemm']['gflops']:.0f} GFLOP/s, {source})")
    axes[0][0].legend(fontsize=8, ncol=len(impls))
    where = report["device_name"]
    fig.suptitle(f"cudnn_rnn vs peers on {where} ({report['threads']} thread(s)){' [smoke]' if report['smoke'] else ''}"
                 f"{' [quick]' if report['quick'] else ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
