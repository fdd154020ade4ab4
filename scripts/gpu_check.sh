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
# With GPU_CHECK_CPU=1 the host CPU's benchmarks run meanwhile on its first two cores (taskset;
# the GPU steps take the others): the float32 LSTM grid at ATen's default and AVX2 levels, the
# same grid at H=256-512 with CUDNN_RNN_CPU_GEMM=packed (the engine rule's A/B), the bfloat16
# grid, int8 and ConvLSTM2D against Keras (Keras on the CPU), 2 threads, each into OUTDIR/cpu/.
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

cpu_pid=
if [ "${GPU_CHECK_CPU:-0}" = "1" ] && command -v taskset > /dev/null && [ "$(nproc)" -ge 4 ]; then
  mkdir -p "$OUT/cpu"
  avx2=(env ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2)
  cpu() { KERAS_TORCH_DEVICE=cpu timeout "${GPU_CHECK_CPU_LIMIT:-200}" taskset -c 0,1 "$@"; }
  { cpu "$PY" -m benchmarks.grid --threads 2 --reps 5 --out "$OUT/cpu/grid.json"
    cpu "${avx2[@]}" "$PY" -m benchmarks.grid --threads 2 --reps 5 --out "$OUT/cpu/grid-avx2.json"
    cpu env CUDNN_RNN_CPU_GEMM=packed "$PY" -m benchmarks.grid --H 256,512 --B 8,32,128 --threads 2 --reps 5 \
      --no-step --out "$OUT/cpu/grid-packed.json"
    cpu "$PY" -m benchmarks.grid --dtype bfloat16 --H 256,512,1024 --B 8,32,128 --threads 2 --reps 5 --no-step \
      --out "$OUT/cpu/grid-bf16.json"
    cpu "$PY" -m benchmarks.quantized --threads 2 --out "$OUT/cpu/int8.json"
    cpu "$PY" -m benchmarks.conv_lstm --threads 2 --json "$OUT/cpu/convlstm.json"
    cpu "${avx2[@]}" "$PY" -m benchmarks.conv_lstm --threads 2 --json "$OUT/cpu/convlstm-avx2.json"
  } > "$OUT/cpu/bench.log" 2>&1 &
  cpu_pid=$!
  gpu_cores=(taskset -c "2-$(( $(nproc) - 1 ))")
else
  gpu_cores=()
fi

start=$SECONDS
"${gpu_cores[@]}" "$PY" -m pytest -q -rfEs -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/test_cuda.log"
status=${PIPESTATUS[0]}
echo "[gpu_check] CUDA tests: exit $status in $((SECONDS - start)) s"

if [ "${GPU_CHECK_BENCH:-1}" = "1" ]; then
  start=$SECONDS
  timeout "${GPU_CHECK_BENCH_LIMIT:-150}" "${gpu_cores[@]}" "$PY" -m benchmarks.run --device cuda --quick --peers torch \
    --out "$OUT" 2>&1 | tee "$OUT/bench.log"
  echo "[gpu_check] benchmark: exit ${PIPESTATUS[0]} in $((SECONDS - start)) s"
fi

if [ -n "$cpu_pid" ]; then
  wait "$cpu_pid"
  echo "[gpu_check] CPU benchmarks: exit $? (logs in $OUT/cpu)"
  grep -E "geometric mean|against our float32 \(|^\| (512|1024) \||keras/ours|forward" "$OUT/cpu/bench.log" | head -40
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
