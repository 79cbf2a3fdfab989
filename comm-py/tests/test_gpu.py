"""comm_rs on the GPU with torch: ranks as processes sharing the machine's GPUs (ipc,
symm-cuda and auto; NCCL refuses two ranks on one GPU, so it runs a world of one where
the GPUs are fewer than two). Each backend runs gpu_cases.suite: eager collectives, a
captured all-reduce replayed, the seeds' step (122 captured calls with a kernel between),
tensors in registered memory (Communicator.empty), the fused all-reduce + RMSNorm, the
engines' slot.

Under pytest: skipped, and reported so, without torch or a GPU. As a script (the device
suite, where pytest may be missing): runs every case, prints PASS/FAIL per case, and exits
non-zero when one failed or when there is no torch or GPU to run them on.
"""

import os
import sys

from ranks import launch

TIMEOUT = int(os.environ.get("GPU_CASE_TIMEOUT", "150"))


def gpus():
    """GPUs torch sees; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cases(n_gpus):
    return [("ipc", 2), ("symm-cuda", 2), ("auto", 2), ("nccl", 2 if n_gpus >= 2 else 1)]


def run(backend, world):
    """Every rank's exit status and output, for one backend."""
    return launch(world, "gpu_cases", "suite", backend, timeout=TIMEOUT)


try:
    import pytest
except ImportError:
    pytest = None

if pytest is not None and __name__ != "__main__":
    from ranks import check

    _gpus = gpus()
    if _gpus is None:
        pytest.skip("skipped: needs torch", allow_module_level=True)
    if _gpus == 0:
        pytest.skip("skipped: no GPU", allow_module_level=True)

    @pytest.mark.parametrize("backend,world", cases(_gpus))
    def test_eager_graph_step_fused_and_engine_slot(backend, world):
        ranks = run(backend, world)
        for r in ranks:
            print(r)
        check(ranks)


if __name__ == "__main__":
    n = gpus()
    if not n:
        print("no torch" if n is None else "no GPU", "- nothing run: FAIL")
        sys.exit(1)
    failed = 0
    for backend, world in cases(n):
        ranks = run(backend, world)
        ok = all(r.code == 0 for r in ranks)
        failed += not ok
        print(f"=== {backend} x{world}: {'PASS' if ok else 'FAIL'}")
        for r in ranks:
            print(repr(r) if not ok else r.out.strip())
    sys.exit(1 if failed else 0)
