"""Loading the native extension against the torch that is running.

The extension links against one torch's C++ ABI. Run under another torch (upgraded after the
build, or a wheel built in pip's isolated environment against whatever torch was newest there),
it fails to import with a linker message (`undefined symbol`, `libc10_cuda.so: cannot open
shared object file`), or imports and misbehaves. cudnn_rnn/_build.py (written by setup.py) records
the torch it was built against; load_extension compares it with the running one and turns either
failure into one ImportError that says what happened and what to run.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
import warnings
from typing import Optional

import torch


def _built_against() -> Optional[dict]:
    try:
        record = importlib.import_module("cudnn_rnn._build")  # written by setup.py; absent before a build
    except ImportError:
        return None
    return {k.lower(): v for k, v in vars(record).items() if k.isupper()}


def _base(version: str) -> str:
    return version.split("+")[0]


def rebuild_command(source: Optional[str]) -> str:
    where = source if source and os.path.isfile(os.path.join(source, "setup.py")) else "<the cudnn_rnn source directory>"
    return f"pip install --no-build-isolation --force-reinstall --no-deps {where}"


def _package_dir() -> str:
    return os.path.dirname(os.path.realpath(__file__))


def _shadowed_install() -> Optional[str]:
    """Where sys.path holds another cudnn_rnn with a built extension while this one is a source
    checkout without one (a pip-installed copy hidden by the checkout, e.g. when Python runs in the
    clone's root): that copy's directory, else None."""
    here = _package_dir()
    checkout = os.path.dirname(here)
    if not os.path.isfile(os.path.join(checkout, "setup.py")) or \
            importlib.machinery.PathFinder.find_spec("_C", [here]) is not None:
        return None  # not a checkout, or one with an extension of its own (that then failed to load)
    for entry in sys.path:
        if not isinstance(entry, str):
            continue
        root = os.path.realpath(entry or os.getcwd())
        if root == checkout or not os.path.isdir(os.path.join(root, "cudnn_rnn")):
            continue
        found = importlib.machinery.PathFinder.find_spec("_C", [os.path.join(root, "cudnn_rnn")])
        if found is not None and found.origin:
            return os.path.join(root, "cudnn_rnn")
    return None


def load_extension():
    """cudnn_rnn._C, checked against the running torch."""
    built = _built_against()
    running = torch.__version__
    try:
        ext = importlib.import_module("cudnn_rnn._C")
    except ImportError as e:
        installed = _shadowed_install() if built is None else None
        if installed is not None:
            raise ImportError(f"cudnn_rnn was imported from the source checkout {_package_dir()}, which has no built "
                              f"extension; it comes first on sys.path (as the current directory, or through "
                              f"PYTHONPATH) and hides the installed cudnn_rnn in {installed}. Run Python from "
                              f"another directory, or build the checkout in place: python setup.py build_ext "
                              f"--inplace (scripts/env.sh does this)") from e
        if built is None:
            raise ImportError(f"cudnn_rnn's native extension cannot be loaded ({e}). Build it against the torch "
                              f"you run ({running}): {rebuild_command(None)}") from e
        if built["torch"] != running:
            raise ImportError(f"cudnn_rnn was built against torch {built['torch']}, but torch {running} is running; "
                              f"its extension no longer fits ({e}). Rebuild it against this torch: "
                              f"{rebuild_command(built.get('source'))}") from e
        raise ImportError(f"cudnn_rnn's native extension cannot be loaded ({e}), though it was built against this "
                          f"torch ({running}); rebuild it: {rebuild_command(built.get('source'))}") from e
    if built is not None and _base(built["torch"]) != _base(running):
        warnings.warn(f"cudnn_rnn was built against torch {built['torch']} and torch {running} is running; if it "
                      f"misbehaves, rebuild it: {rebuild_command(built.get('source'))}", RuntimeWarning, stacklevel=3)
    return ext
