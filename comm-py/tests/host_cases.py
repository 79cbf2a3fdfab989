"""What each rank of the host tests runs (launched by ranks.launch)."""

import os
import time

import numpy as np

import comm_rs
from reference import DTYPES, NUMPY, OPS, data, reduce

SIZES = [0, 1, 7, 1000, 20001]


def _kw(dtype):
    return {"dtype": "bf16"} if dtype == "bf16" else {}


def _equal(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype)
    if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
        bad = np.flatnonzero(got != want)[:5]
        raise AssertionError(f"{what}: differ at {bad}: got {got[bad]}, want {want[bad]}")


def collectives(backend):
    comm = comm_rs.Communicator.from_env(backend)
    r, n = comm.rank, comm.world_size
    assert comm.backend == backend, comm.backend
    assert comm.device is None
    for dtype in DTYPES:
        for count in SIZES:
            for op in OPS:
                inputs = [data(dtype, q, count, op) for q in range(n)]
                want = reduce(inputs, op, dtype)
                x = inputs[r].copy()
                assert comm.all_reduce(x, op, **_kw(dtype)) is x
                _equal(x, want, f"all_reduce {op} {dtype} x{count} in place")
                out = np.full(count, 0x55, dtype=NUMPY[dtype])
                comm.all_reduce(inputs[r], op, out=out, **_kw(dtype))
                _equal(out, want, f"all_reduce {op} {dtype} x{count}")
            inputs = [data(dtype, q, count, "sum") for q in range(n)]
            got = comm.all_gather(inputs[r], **_kw(dtype))
            _equal(got, np.concatenate(inputs), f"all_gather {dtype} x{count}")
            for op in ("sum", "max"):
                big = [data(dtype, q, count * n, op) for q in range(n)]
                got = comm.reduce_scatter(big[r], op=op, **_kw(dtype))
                want = reduce(big, op, dtype)[r * count : (r + 1) * count]
                _equal(got, want, f"reduce_scatter {op} {dtype} x{count}")
            root = n - 1
            x = inputs[r].copy()
            comm.broadcast(x, root, **_kw(dtype))
            _equal(x, inputs[root], f"broadcast {dtype} x{count}")
    comm.barrier()
    comm.async_error()
    assert "all_reduce" in comm.explain(np.zeros(10, np.float32))
    comm.close()
    try:
        comm.barrier()
    except comm_rs.Aborted:
        pass
    else:
        raise AssertionError("a closed communicator worked")
    print(f"rank {r}: ok")


class DlpackOnly:
    """An array seen only through __dlpack__."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def protocols():
    """DLPack, __array_interface__ views with an offset of rows, and the context manager."""
    with comm_rs.Communicator.from_env("bootstrap") as comm:
        r, n = comm.rank, comm.world_size
        x = np.arange(12, dtype=np.float32) + r
        comm.all_reduce(DlpackOnly(x))
        want = sum(np.arange(12, dtype=np.float32) + q for q in range(n))
        _equal(x, want.astype(np.float32), "dlpack")
        grid = np.zeros((4, 6), dtype=np.int64) + r
        comm.all_reduce(grid[1:3])  # contiguous rows inside a larger array
        assert (grid[1:3] == sum(range(n))).all() and (grid[0] == r).all() and (grid[3] == r).all()
    print(f"rank {r}: ok")


def _raises(kind, f, *args, **kw):
    try:
        f(*args, **kw)
    except kind as e:
        assert isinstance(e, comm_rs.CommError), type(e)
        return str(e)
    raise AssertionError(f"{f.__name__}{args} did not raise {kind.__name__}")


def bad_inputs():
    _raises(comm_rs.InvalidArgument, comm_rs.Communicator.from_env, "carrier-pigeon")
    comm = comm_rs.Communicator.from_env("bootstrap")
    r, n = comm.rank, comm.world_size
    x = np.ones(8, np.float32)
    # Refused on every rank alike, before anything is sent: the communicator stays usable.
    _raises(comm_rs.InvalidArgument, comm.all_reduce, x, "median")
    _raises(comm_rs.Unsupported, comm.all_reduce, np.ones(4, np.complex64))
    _raises(comm_rs.Unsupported, comm.all_reduce, np.ones(4, ">f4"))
    _raises(comm_rs.InvalidArgument, comm.all_reduce, np.ones((4, 4), np.float32)[:, 1])
    _raises(comm_rs.InvalidArgument, comm.all_reduce, [1.0, 2.0])
    ro = np.ones(8, np.float32)
    ro.flags.writeable = False
    _raises(comm_rs.InvalidArgument, comm.all_reduce, ro)
    _raises(comm_rs.InvalidArgument, comm.all_reduce, x, dtype="f64")
    _raises(comm_rs.InvalidArgument, comm.all_reduce, x, out=np.ones(9, np.float32))
    _raises(comm_rs.InvalidArgument, comm.broadcast, x, n)
    _raises(comm_rs.InvalidArgument, comm.reduce_scatter, np.ones(n * 3 + 1, np.float32))
    _raises(comm_rs.Unsupported, comm.all_reduce_residual_rmsnorm, x, x.copy(), x)
    # Ranks that disagree: every rank hears of it.
    _raises(comm_rs.Mismatch, comm.all_reduce, np.ones(8 + r, np.float32))
    _raises(comm_rs.Mismatch, comm.all_reduce, np.ones(8, np.float32 if r else np.float64))
    comm.all_reduce(x)
    assert (x == n).all(), x
    comm.close()
    print(f"rank {r}: ok")


def registered_unsupported(backend):
    """Host backends register no memory: empty() raises on every rank, before anything is
    allocated, and the communicator stays usable; bad shapes and dtypes are refused first."""
    comm = comm_rs.Communicator.from_env(backend)
    r, n = comm.rank, comm.world_size
    why = _raises(comm_rs.Unsupported, comm.empty, (4, 8), "f32")
    assert "regist" in why, why
    _raises(comm_rs.Unsupported, comm.empty, 16, dtype="bf16")
    _raises(comm_rs.InvalidArgument, comm.empty, 0)
    _raises(comm_rs.InvalidArgument, comm.empty, (3, 0))
    _raises(comm_rs.InvalidArgument, comm.empty, (2, -1))
    _raises(comm_rs.InvalidArgument, comm.empty, "big")
    _raises(comm_rs.Unsupported, comm.empty, 4, "complex64")
    x = np.ones(8, np.float32)
    comm.all_reduce(x)
    assert (x == n).all(), x
    comm.close()
    print(f"rank {r}: ok")


def peer_dies(backend, victim):
    comm = comm_rs.Communicator.from_env(backend)
    x = np.ones(1000, np.float32)
    comm.all_reduce(x)
    if comm.rank == victim:
        os._exit(0)
    start = time.monotonic()
    try:
        for _ in range(3):
            comm.all_reduce(x)
    except (comm_rs.Timeout, comm_rs.Bootstrap, comm_rs.Aborted) as e:
        print(f"rank {comm.rank}: {type(e).__name__} after {time.monotonic() - start:.1f} s: {e}")
        return
    raise AssertionError("all-reduces with a dead peer succeeded")
