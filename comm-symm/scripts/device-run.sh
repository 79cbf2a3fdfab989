#!/usr/bin/env bash
# device-run.sh: every GPU check and benchmark of comm-symm's CUDA backing in one go, on
# the device machine. Expects a bundle folder (default gpu-bundle-symm/) holding this
# script and symm_check + symm_bench (built by comm-symm/scripts/bundle). Logs go to $OUT
# (the device tool's output folder) or /tmp/symm-out; each step is bounded by `timeout`.
#   bash gpu-bundle-symm/device-run.sh [STEPS...]
# Steps: bench (8 virtual ranks; the first run also fills the kernel cache), checkN
# (symm_check under mpirun -np N); default: bench check2 check4 check8.
set -uo pipefail
B=${BUNDLE:-gpu-bundle-symm}
OUT=${OUT:-/tmp/symm-out}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export COMM_KERNEL_CACHE=/tmp/comm-kernels COMM_SYMM_BACKING=${COMM_SYMM_BACKING:-auto}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
steps=${*:-bench check2 check4 check8}
status=0
step() { # name limit cmd...
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" | tee -a "$OUT/summary.txt"
  local t0=$SECONDS
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee -a "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: rc=$rc in $((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/summary.txt"
port=29700
for s in $steps; do
  port=$((port + 1))
  case $s in
    bench)
      # Same-process VMM import is the one path multi-process runs do not cover: if it
      # fails, measure with legacy IPC rather than nothing.
      step bench "${BENCH_LIMIT:-80}" "$B/symm_bench" --ranks 8 --iters 1000 --batch 20 \
        || step bench-ipc 60 "$B/symm_bench" --ranks 8 --iters 1000 --batch 20 --backing ipc ;;
    check[0-9]*)
      np=${s#check}
      case $np in 2) extra="--cycles 1000"; lim=60 ;; 4) extra="--quick --cycles 1000"; lim=75 ;; *) extra="--quick --cycles 200"; lim=100 ;; esac
      step "check-np$np" "${CHECK_LIMIT:-$lim}" mpirun --oversubscribe -np "$np" -x MASTER_PORT=$port \
        -x COMM_KERNEL_CACHE -x COMM_SYMM_BACKING "$B/symm_check" $extra ;;
    *) echo "unknown step $s"; status=2 ;;
  esac
done
echo "=== overall status $status" | tee -a "$OUT/summary.txt"
exit $status
