#!/usr/bin/env bash
# Usage: bash scripts/env.sh COMMAND...
#
# Does all the set-up a fresh machine needs, then runs COMMAND inside it:
#   1. a virtual environment with requirements-dev.txt, cached outside the clone (by default in
#      ~/.cache/cudnn_rnn/venv-<hash of requirements-dev.txt>; set CUDNN_RNN_VENV to choose);
#      with CUDNN_RNN_BENCH=1, requirements-bench.txt too (the benchmarks' TF Keras peer), in its
#      own ~/.cache/cudnn_rnn/venv-bench-<hash of both files>,
#   2. the native extension built in place (cudnn_rnn/_C*.so; incremental with ninja),
# and runs COMMAND from the repository root with that environment's python first on PATH.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
req_hash="$(sha256sum requirements-dev.txt | cut -c1-12)"
req_args=(-r requirements-dev.txt)
imports="torch, keras, h5py, pytest"
if [ "${CUDNN_RNN_BENCH:-}" = "1" ]; then
  req_hash="bench-$(cat requirements-dev.txt requirements-bench.txt | sha256sum | cut -c1-12)"
  req_args+=(-r requirements-bench.txt)
  imports="$imports, tensorflow, tf_keras"
fi
VENV="${CUDNN_RNN_VENV:-$HOME/.cache/cudnn_rnn/venv-$req_hash}"

if [ ! -f "$VENV/.installed-$req_hash" ]; then
  echo "[env] creating $VENV (first run: installs torch, a few GB)" >&2
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
  # pip's "Location ... is ignored" lines are noise from this machine's local wheel index. pip's
  # exit status decides; grep's does not (it fails whenever a quiet pip printed nothing).
  pip_install() {
    local status=0
    "$VENV/bin/python" -m pip install --quiet "$@" > "$VENV/pip.log" 2>&1 || status=$?
    grep -v "^WARNING: Location" "$VENV/pip.log" >&2 || true
    return "$status"
  }
  pip_install --upgrade pip || true
  pip_install "${req_args[@]}"
  # (KERAS_BACKEND: keras 3 otherwise imports the backend named in ~/.keras/keras.json, which may be
  # a tensorflow this environment does not have)
  KERAS_BACKEND=torch "$VENV/bin/python" -c "import $imports" >&2
  touch "$VENV/.installed-$req_hash"
fi

export PATH="$VENV/bin:$PATH"
# the in-place build is the package: make it importable from any script
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
echo "[env] building the extension (python setup.py build_ext --inplace)" >&2
if ! build_log="$(python setup.py build_ext --inplace 2>&1)"; then
  echo "$build_log" >&2
  echo "[env] build failed" >&2
  exit 1
fi
echo "$build_log" | sed -n '/cudnn_rnn build configuration:/,/TORCH_CUDA_ARCH_LIST\|backend: CppExtension/p' >&2

exec "$@"
