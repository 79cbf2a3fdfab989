#!/usr/bin/env bash
# device-run.sh: every GPU check and benchmark of comm-ipc in one go, on the device machine.
#
# Expects a bundle folder (default gpu-bundle-ipc/) holding this script and the programs
# ipc_bench, ipc_check, allreduce-perf and kernels (built by comm-ipc/scripts/bundle).
# Logs go to $OUT (the device tool's output folder) or /tmp/ipc-out. Each step is bounded
# by `timeout`, so one hang cannot eat the lease. Usage:
#   bash gpu-bundle-ipc/device-run.sh [STEPS...]
# Steps: kernels, bench, bench-wide (256 threads x 32 blocks per rank), checkN (ipc_check under mpirun -np N), perf-ALGO (allreduce-perf
# --backend ipc --algo ALGO --check, 4 ranks); default: all but kernels (CI builds those).
set -uo pipefail
B=${BUNDLE:-gpu-bundle-ipc}
OUT=${OUT:-/tmp/ipc-out}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export COMM_KERNEL_CACHE=/tmp/comm-kernels
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
steps=${*:-bench check2 check4 check8 check1 perf-oneshot-pull perf-twoshot-pull perf-oneshot-push perf-twoshot-push}
status=0
step() { # name timeout cmd...
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" | tee -a "$OUT/summary.txt"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: rc=$rc in $((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
  [ "$rc" -eq 0 ] || status=1
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/summary.txt"
port=29600
for s in $steps; do
  port=$((port + 1))
  case $s in
    kernels) step kernels 200 "$B/kernels" --arch sm_80,sm_90,sm_100,sm_120 ;;
    bench) step bench 200 "$B/ipc_bench" --ranks 8 --iters 1000 --batch 20 ;;
    bench-wide) step bench-wide 200 "$B/ipc_bench" --ranks 8 --iters 1000 --batch 20 --threads 256 --max-blocks 32 ;;
    check[0-9]*)
      np=${s#check}
      extra=""; [ "$np" -ge 8 ] && extra="--quick"
      step "check-np$np" "${CHECK_LIMIT:-240}" mpirun --oversubscribe -np "$np" -x MASTER_PORT=$port \
        -x COMM_KERNEL_CACHE "$B/ipc_check" $extra ;;
    perf-*)
      algo=${s#perf-}
      step "$s" 120 mpirun --oversubscribe -np 4 -x MASTER_PORT=$port -x COMM_KERNEL_CACHE \
        -x COMM_IPC_VALIDATE=0 "$B/allreduce-perf" --backend ipc --algo "$algo" --check \
        --dtype bf16 --sizes 2:8M -f 8 -n 20 -w 5 ;;
    *) echo "unknown step $s"; status=2 ;;
  esac
done
echo "=== overall status $status" | tee -a "$OUT/summary.txt"
exit $status
