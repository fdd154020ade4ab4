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


# -- the documentation itself -------------------------------------------------------------------
import doctest  # noqa: E402
import inspect  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import cudnn_rnn  # noqa: E402
import cudnn_rnn.keras  # noqa: E402
import cudnn_rnn.onnx  # noqa: E402

PUBLIC = [getattr(cudnn_rnn, name) for name in cudnn_rnn.__all__ if name != "ops"] + [
    cudnn_rnn.keras.load_converted, cudnn_rnn.keras.recurrent_layers, cudnn_rnn.onnx.export]
LAYERS = [cudnn_rnn.LSTM, cudnn_rnn.GRU, cudnn_rnn.SimpleRNN, cudnn_rnn.Bidirectional, cudnn_rnn.ConvLSTM1D,
          cudnn_rnn.ConvLSTM2D, cudnn_rnn.ConvLSTM3D, cudnn_rnn.Int8Linear]
ARG = re.compile(r"^        (\*{0,2}\w+)(?: \(|:)", re.M)


def _arg_entries(doc):
    """{name: its whole entry} of a docstring's Args section, in order."""
    section = doc.split("\n    Args:\n", 1)[1] if "\n    Args:\n" in doc else ""
    section = re.split(r"\n\s*\n", section, maxsplit=1)[0]
    entries, current = {}, None
    for line in section.splitlines():
        match = ARG.match(line)
        if match:
            current = match.group(1)
            entries[current] = line.strip()
        elif current:
            entries[current] += " " + line.strip()
    return entries


@pytest.mark.parametrize("obj", PUBLIC, ids=lambda o: o.__name__)
def test_public_api_is_documented_in_torch_nn_style(obj):
    """Args with types and defaults naming exactly the signature's parameters, an Example, and a
    Shape section on layers: what help() shows is the reference."""
    doc = obj.__doc__ or ""
    if inspect.isclass(obj) and issubclass(obj, Exception):
        assert len(doc) > 80, obj.__name__
        return
    signature = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    params = {("**" if p.kind == p.VAR_KEYWORD else "") + n: p for n, p in signature.parameters.items() if n != "self"}
    entries = _arg_entries(doc)
    if obj is not cudnn_rnn.Explanation:
        assert list(entries) == list(params), f"{obj.__name__}: Args must list {list(params)}; has {list(entries)}"
    for name, entry in entries.items():
        head = entry.split(":", 1)[0]
        if name.startswith("*"):
            continue
        assert re.match(r"\*{0,2}\w+ \(.+\)$", head), f"{obj.__name__}.{name}: no type"
        if params[name].default is not inspect.Parameter.empty and "optional" not in head:
            assert "Default:" in entry, f"{obj.__name__}.{name}: no Default"
    if obj in LAYERS:
        assert "\n    Shape:\n" in doc, obj.__name__
    if obj not in (cudnn_rnn.cudnn_algorithm, cudnn_rnn.cudnn_fallback_count, cudnn_rnn.int8_available,
                   cudnn_rnn.keras.load_converted, cudnn_rnn.Explanation):
        assert "\n    Example:\n" in doc, f"{obj.__name__}: no Example"


@pytest.mark.parametrize("obj", PUBLIC, ids=lambda o: o.__name__)
def test_docstring_examples_run(obj, tmp_path, monkeypatch):
    """In a scratch folder holding the repository's examples/ (what the examples read); what
    they write stays there."""
    os.symlink(os.path.join(ROOT, "examples"), tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    finder, runner = doctest.DocTestFinder(recurse=False), doctest.DocTestRunner(
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(obj, obj.__name__, globs={"torch": torch, "cudnn_rnn": cudnn_rnn}):
        runner.run(test)
    assert runner.failures == 0, f"{obj.__name__}: {runner.failures} example(s) failed (output above)"
    cudnn_rnn.set_cpu_plan(gemm="auto", split="auto")


def test_readme_is_the_short_front_door_and_its_code_runs(monkeypatch):
    monkeypatch.chdir(ROOT)
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert len(readme.encode()) <= 10_240, f"README.md is {len(readme.encode())} bytes; the rest belongs in docs/"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        assert target.startswith("http") or os.path.exists(os.path.join(ROOT, target)), target
    for block in re.findall(r"```python\n(.*?)```", readme, re.S):
        exec(compile(block, "README.md", "exec"), {})


def test_documentation_site_builds_with_warnings_as_errors(tmp_path):
    """mkdocs --strict: every page in the navigation, every link and anchor between pages
    resolves, and every docstring the reference pages render parses."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=ROOT)
    # (not -q: mkdocs then drops the warnings that --strict counts, and nothing could fail)
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "WARNING" not in out.stderr, out.stdout[-3000:] + out.stderr[-3000:]
    page = (tmp_path / "site" / "reference" / "layers" / "index.html").read_text()
    assert "recurrent_activation" in page and "Shape" in page  # the docstrings were rendered


def test_results_page_is_generated_from_the_committed_json():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "benchmark_tables.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, "docs/guides/results.md is stale: run scripts/benchmark_tables.py\n" + out.stderr


def test_testing_page_lists_every_test_module():
    page = open(os.path.join(ROOT, "docs", "guides", "testing.md"), encoding="utf-8").read()
    modules = sorted(n for n in os.listdir(os.path.join(ROOT, "tests")) if n.startswith("test_") and n.endswith(".py"))
    missing = [m for m in modules if f"`tests/{m}`" not in page]
    assert not missing, f"docs/guides/testing.md has no row for {missing}"
