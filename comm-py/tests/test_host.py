"""comm_rs on host backends, ranks as processes: every collective, dtype and op against
a numpy reference, bad inputs, and a peer that dies."""

import pytest

from ranks import check, launch

BACKENDS = ["bootstrap", "symm", "auto"]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("backend", BACKENDS)
def test_collectives_match_the_reference(backend, world):
    check(launch(world, "host_cases", "collectives", backend, timeout=300))


def test_dlpack_array_interface_and_context_manager():
    check(launch(2, "host_cases", "protocols"))


@pytest.mark.parametrize("world", [2, 4])
def test_bad_inputs_raise_on_every_rank(world):
    check(launch(world, "host_cases", "bad_inputs"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_registered_memory_is_unsupported_on_host_backends(backend):
    check(launch(2, "host_cases", "registered_unsupported", backend))


@pytest.mark.parametrize("backend", ["bootstrap", "symm"])
@pytest.mark.parametrize("victim", [0, 1])
def test_a_peer_that_dies_raises_within_the_timeout(backend, victim):
    bound = 5
    ranks = launch(
        3, "host_cases", "peer_dies", backend, victim, timeout=60,
        env={"COMM_TIMEOUT_SECS": str(bound)},
    )
    check(ranks)
    for r in ranks:
        if r.rank != victim:
            assert "after" in r.out, r
            # The bound, plus the time to start three processes.
            assert r.seconds < bound + 20, r


def test_module_surface():
    import comm_rs

    names = comm_rs.Communicator.backends()
    for name in ["local", "bootstrap", "symm", "symm-cuda", "ipc", "nccl", "auto"]:
        assert name in names, names
    assert callable(comm_rs.Communicator.empty) and comm_rs.RegisteredMemory
    for exc in ["Unsupported", "InvalidArgument", "Mismatch", "Timeout", "Aborted",
                "Bootstrap", "NoDevice", "LibraryMissing", "Backend", "Io"]:
        assert issubclass(getattr(comm_rs, exc), comm_rs.CommError)
    assert issubclass(comm_rs.CommError, RuntimeError)


def test_a_single_process_is_a_world_of_one(monkeypatch):
    import numpy as np

    import comm_rs

    for var in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"]:
        monkeypatch.delenv(var, raising=False)
    for backend in ["local", "bootstrap", "auto"]:
        with comm_rs.Communicator.from_env(backend) as comm:
            assert (comm.rank, comm.world_size) == (0, 1)
            x = np.arange(5, dtype=np.float64)
            comm.all_reduce(x, "max")
            assert (x == np.arange(5)).all()
