"""The machine's peak, as the benchmarks state rates against it.

``fma_peak`` is the measured throughput of independent fused multiply-adds on all of torch's
threads at once, in the widest vectors the CPU runs (``cudnn_rnn._C.fma_peak``: AVX-512 or AVX2
FMA for float32, AVX512_BF16 dot products for bfloat16). ``torch.mm``'s rate is no peak on every
machine: MKL runs below the machine's peak on AMD CPUs (a 2048^3 float32 product at 211 GFLOP/s
on a 2-core AMD EPYC Zen 5 whose FMA throughput is 550-560), so the benchmarks give it only as a
second reference.
"""
from __future__ import annotations

import torch

import cudnn_rnn


def fma_peak(dtype: torch.dtype = torch.float32, seconds: float = 0.1, repeats: int = 5) -> float:
    """GFLOP/s of the CPU's multiply-adds in `dtype` (float32 or bfloat16; 0.0 where the CPU has no
    bfloat16 dot product), on torch's current thread count."""
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    return cudnn_rnn._C.fma_peak(name, seconds, repeats)


if __name__ == "__main__":
    for dt in (torch.float32, torch.bfloat16):
        print(f"{dt}: {fma_peak(dt):.0f} GFLOP/s on {torch.get_num_threads()} threads")
