"""The product speaks of the product: no README line, docs page, docstring or comment narrates how
the project was made (working sessions, what a change moved from what to what); that history is
CHANGELOG.md's, by version. Results name their machine and date instead."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRODUCT = ["README.md", "docs", "cudnn_rnn", "csrc", "benchmarks", "examples", "scripts", "setup.py", "pyproject.toml"]
SUFFIXES = (".md", ".py", ".cpp", ".h", ".cu", ".cuh", ".sh", ".toml", ".txt")
HISTORY = re.compile(r"(?i)(?<!Inference)\bsessions?\b|\bstints?\b|\blast commit\b|\bthis change\b|\buntil then\b|"
                     r"\bpreviously\b|\bused to\b|\bmeasured again after\b|\bthe (?:session|commit) before\b|"
                     r"\b(?:an|the) earlier (?:session|machine|run)\b|\ba later (?:session|machine)\b")


def _files():
    for entry in PRODUCT:
        path = os.path.join(ROOT, entry)
        if os.path.isfile(path):
            yield path
        for folder, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "results")]
            for name in files:
                if name.endswith(SUFFIXES):
                    yield os.path.join(folder, name)


def test_no_development_history_in_the_product():
    found = []
    for path in _files():
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                if HISTORY.search(line):
                    found.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()[:120]}")
    assert not found, "history belongs in CHANGELOG.md:\n" + "\n".join(found[:30])


def test_the_history_check_catches_narration():
    for line in ("measured in this machine's fifth session", "the last commit's saves", "it used to wait",
                 "(a later session's machine)"):
        assert HISTORY.search(line), line
    for line in ("onnxruntime.InferenceSession(path)", "measured on 2026-11-24", "torch.nn time / ours"):
        assert not HISTORY.search(line), line
