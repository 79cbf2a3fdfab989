"""comm_rs on the GPU with torch: ranks as processes sharing the machine's GPUs (ipc,
symm-cuda and auto; NCCL refuses two ranks on one GPU, so it runs a world of one where
the GPUs are fewer than two). Skipped, and reported so, without torch or a GPU."""

import os

import pytest

from ranks import check, launch

torch = pytest.importorskip("torch", reason="needs torch")
if not torch.cuda.is_available():
    pytest.skip("skipped: no GPU", allow_module_level=True)

GPUS = torch.cuda.device_count()
CASES = [("ipc", 2), ("symm-cuda", 2), ("auto", 2), ("nccl", 2 if GPUS >= 2 else 1)]


@pytest.mark.parametrize("backend,world", CASES)
def test_eager_graph_step_fused_and_engine_slot(backend, world):
    ranks = launch(world, "gpu_cases", "suite", backend, timeout=int(os.environ.get("GPU_CASE_TIMEOUT", "150")))
    for r in ranks:
        print(r)
    check(ranks)
