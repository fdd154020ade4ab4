"""The checkpoint fuzzer (tests/fuzz_checkpoints.py) at a CI budget: every mutant of a real
Keras-written file must load and run, or raise ConversionError, in bounded time and memory,
never reading outside the file. `python -m tests.fuzz_checkpoints --long` runs it for 30 min."""
import os

import pytest

pytest.importorskip("hypothesis")

from fuzz_checkpoints import fuzz  # noqa: E402

BUDGET_S = float(os.environ.get("CUDNN_RNN_FUZZ_SECONDS", "75"))


def test_mutants_load_or_refuse_cleanly():
    lines = []
    counts, failures = fuzz(BUDGET_S, seed=int(os.environ.get("CUDNN_RNN_FUZZ_SEED", "20261123")), log=lines.append)
    total = sum(counts.values())
    assert total >= 100, f"the fuzzer ran only {total} mutants: {lines[-3:]}"
    # both outcomes must occur, or the mutations are too weak (or too strong) to test anything
    assert counts.get("clean", 0) > 0 and counts.get("refused", 0) > 0, counts
    assert not failures, "\n".join(failures[:20])
