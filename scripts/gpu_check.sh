#!/usr/bin/env bash
# Usage: bash scripts/gpu_check.sh [OUTDIR]   (default: gpu-check/)
#
# The checks that need an NVIDIA GPU, for a machine that already has a CUDA build of torch
# (PYTHON, default python3; no environment is created and nothing is downloaded):
#   1. the extension built in place for this GPU's architecture (FORCE_CUDA=1),
#   2. tests/test_cuda.py (cuDNN against the CPU path and torch.nn, the generic CUDA kernels,
#      CUDA graphs, torch.compile, ConvLSTM),
#   3. the GPU benchmark against torch.nn (python -m benchmarks.run --device cuda --quick),
#   4. the whole suite with the GPU visible (modules whose peers are not installed are reported,
#      not fatal).
# Logs and results go to OUTDIR; the exit status is the CUDA tests'.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-gpu-check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" KERAS_BACKEND=torch

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), torch.cuda.get_device_name(), torch.cuda.get_device_capability())"
  lscpu | grep -m1 'Model name'; } 2>&1 | tee "$OUT/machine.txt"

arch="$("$PY" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")"
export FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$arch}" MAX_JOBS="${MAX_JOBS:-$(nproc)}"
start=$SECONDS
if ! "$PY" setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
  tail -80 "$OUT/build.log"
  echo "[gpu_check] build failed (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"
  exit 1
fi
echo "[gpu_check] built in $((SECONDS - start)) s for sm_${arch/./}"
"$PY" -c "import cudnn_rnn, json; print(json.dumps(cudnn_rnn.build_info())); print('libstdc++:', [l.split()[-1] for l in open('/proc/self/maps') if 'libstdc++' in l][:1])" | tee -a "$OUT/machine.txt"

start=$SECONDS
"$PY" -m pytest -q -rfEs -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/test_cuda.log"
status=${PIPESTATUS[0]}
echo "[gpu_check] CUDA tests: exit $status in $((SECONDS - start)) s"

if [ "${GPU_CHECK_BENCH:-1}" = "1" ]; then
  start=$SECONDS
  timeout "${GPU_CHECK_BENCH_LIMIT:-150}" "$PY" -m benchmarks.run --device cuda --quick --peers torch \
    --out "$OUT" 2>&1 | tee "$OUT/bench.log"
  echo "[gpu_check] benchmark: exit ${PIPESTATUS[0]} in $((SECONDS - start)) s"
fi

if [ "${GPU_CHECK_SUITE:-1}" = "1" ]; then
  start=$SECONDS
  workers=()
  "$PY" -c "import xdist" 2>/dev/null && workers=(-n "$(( $(nproc) > 12 ? 12 : $(nproc) ))")
  timeout "${GPU_CHECK_SUITE_LIMIT:-240}" "$PY" -m pytest -q -rfE -p no:cacheprovider "${workers[@]}" \
    --continue-on-collection-errors --ignore=tests/test_cuda.py tests > "$OUT/suite.log" 2>&1
  echo "[gpu_check] suite: exit $? in $((SECONDS - start)) s"
  grep -E "^(FAILED|ERROR)" "$OUT/suite.log" | head -40
  tail -3 "$OUT/suite.log"
fi
exit "$status"
