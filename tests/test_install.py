"""Installs that cannot silently break, tried in a second environment the project did not make:
a venv with the CPU-only torch 2.13.0 (the local wheel; cached in ~/.cache/cudnn_rnn, made from
nothing on a fresh machine).

- `pip install .` with pip's build isolation: the isolated build environment has no torch (it is
  not a build requirement on purpose), so setup.py stops with the command that builds against
  the user's torch, instead of building against whatever torch is newest on PyPI.
- An extension built against another torch (this repository's in-place build, torch 2.14.1)
  imported under torch 2.13: one ImportError naming both versions and the rebuild command, not a
  linker message.
"""
import os
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECOND_TORCH = "2.13.0"
VENV = os.path.join(os.path.expanduser("~"), ".cache", "cudnn_rnn", f"venv-torch{SECOND_TORCH}")


def _pip_env():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def second_torch():
    """A venv holding torch 2.13.0 (CPU) and nothing of this project."""
    python = os.path.join(VENV, "bin", "python")
    marker = os.path.join(VENV, ".ready")
    if not os.path.exists(marker):
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True, timeout=300)
        out = subprocess.run([python, "-m", "pip", "install", "--quiet", f"torch=={SECOND_TORCH}"], env=_pip_env(),
                             capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            pytest.fail(f"could not install torch {SECOND_TORCH} into {VENV}: {out.stderr[-2000:]}")
        open(marker, "w").close()
    version = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                             text=True, env=_pip_env(), check=True, timeout=300).stdout.strip()
    assert version.startswith(SECOND_TORCH), version
    return python


def _source_copy(tmp_path):
    """The tracked files of this checkout (no build outputs), as a user's clone would have them."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    dest = tmp_path / "src"
    for f in files:
        if f.startswith("tests/fixtures/data/") or f.startswith("docs/"):
            continue  # not needed to build
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), target)
    return dest


def test_isolated_pip_install_stops_with_the_right_command(second_torch, tmp_path):
    src = _source_copy(tmp_path)
    out = subprocess.run([second_torch, "-m", "pip", "install", str(src)], env=_pip_env(), capture_output=True,
                         text=True, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    assert "cudnn_rnn: building needs the torch you will run it with" in text, text[-3000:]
    assert "pip install --no-build-isolation ." in text
    # nothing half-installed
    check = subprocess.run([second_torch, "-c", "import cudnn_rnn"], env=_pip_env(), capture_output=True, text=True,
                           cwd=str(tmp_path), timeout=300)
    assert check.returncode != 0 and "No module named 'cudnn_rnn'" in check.stderr


def test_extension_built_for_another_torch_says_what_to_run(second_torch):
    built = torch.__version__
    assert not built.startswith(SECOND_TORCH), "this test needs the repository built against another torch"
    env = dict(_pip_env(), PYTHONPATH=ROOT)
    out = subprocess.run([second_torch, "-c", "import cudnn_rnn"], env=env, capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: cudnn_rnn was built against torch " + built), out.stderr[-2000:]
    assert f"but torch {SECOND_TORCH}" in last and "pip install --no-build-isolation --force-reinstall" in last


def test_a_source_checkout_hiding_the_installed_copy_says_so(tmp_path):
    """Python started in a clone's root after `pip install .`: the checkout (no built extension)
    comes first on sys.path and hides the installed package. One ImportError names both places
    and what to do, not "rebuild" (which would not help). This checkout, built in place, stands in
    for the installed copy."""
    src = _source_copy(tmp_path)
    env = dict(_pip_env(), PYTHONPATH=os.pathsep.join([str(src), ROOT]))
    out = subprocess.run([sys.executable, "-c", "import cudnn_rnn"], env=env, capture_output=True, text=True,
                         cwd=str(tmp_path), timeout=300)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: cudnn_rnn was imported from the source checkout {src / 'cudnn_rnn'}"), last
    assert f"hides the installed cudnn_rnn in {os.path.join(ROOT, 'cudnn_rnn')}" in last, last
    assert "python setup.py build_ext --inplace" in last
    # with nothing installed elsewhere, the checkout is told to build
    out = subprocess.run([sys.executable, "-c", "import cudnn_rnn"], env=dict(_pip_env(), PYTHONPATH=str(src)),
                         capture_output=True, text=True, cwd=str(tmp_path), timeout=300)
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode != 0 and last.startswith("ImportError: cudnn_rnn's native extension cannot be loaded"), last


def test_build_record_matches_the_running_torch():
    from cudnn_rnn import _build

    assert _build.TORCH == torch.__version__
    assert os.path.isfile(os.path.join(_build.SOURCE, "setup.py"))


def test_wheel_metadata_pins_the_torch_it_is_built_against(tmp_path):
    """The distribution's metadata (setup.py egg_info, no compile): Requires-Dist pins the running
    torch's release (its C++ ABI is the one the extension links against), an [onnx] extra, and a
    long description that is the short README."""
    out = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "-e", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (info,) = [p for p in tmp_path.iterdir() if p.name.endswith(".egg-info")]
    meta = (info / "PKG-INFO").read_text()
    assert f"Requires-Dist: torch=={torch.__version__.split('+')[0]}\n" in meta
    assert "Provides-Extra: onnx" in meta and 'Requires-Dist: onnxruntime; extra == "onnx"' in meta
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert len(readme.encode()) <= 10_240 and "Description-Content-Type: text/markdown" in meta
    assert readme.splitlines()[0] in meta and readme.strip().splitlines()[-1] in meta
