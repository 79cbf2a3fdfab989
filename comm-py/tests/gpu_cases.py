"""What each rank of the GPU tests runs (launched by ranks.launch): torch CUDA tensors,
eager and under torch.cuda.graph, against host references computed from every rank's
seeded inputs; outputs poisoned (NaN) first; results compared bit for bit across ranks."""

import hashlib
import json
import os
import time
import warnings

import torch

import comm_rs

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
TOL = {"bf16": 1e-2, "f16": 2e-3, "f32": 1e-5}


def _setup(backend):
    comm = comm_rs.Communicator.from_env(backend)
    torch.cuda.set_device(comm.device)
    return comm


def _inputs(count, dtype, n, seed):
    """Every rank's input, made on the host from (seed, rank)."""
    out = []
    for r in range(n):
        g = torch.Generator().manual_seed(seed * 1000 + r)
        out.append((torch.rand(count, generator=g, dtype=torch.float64) * 8 - 4).to(DTYPES[dtype]))
    return out


def _reference(inputs, dtype):
    """Sum in rank order, in f32 for 16-bit types (f64 for the check of f32)."""
    acc = inputs[0].to(torch.float32 if dtype != "f32" else torch.float64)
    for x in inputs[1:]:
        acc = acc + x.to(acc.dtype)
    return acc


def _close(got, want, dtype, what):
    got64 = got.double().cpu()
    want64 = want.double()
    err = (got64 - want64).abs() / want64.abs().clamp(min=1.0)
    if got64.numel() and not (err.max().item() <= TOL[dtype] and torch.isfinite(got64).all()):
        i = int(err.argmax())
        raise AssertionError(f"{what}: element {i}: got {got64[i]}, want {want64[i]}")


def _same_on_every_rank(comm, t, what):
    """Compares a digest of `t`'s bytes across ranks (gathered as small f32 values, which
    every device backend carries exactly)."""
    raw = t.detach().contiguous().view(-1).cpu().view(torch.uint8)
    try:
        data = raw.numpy().tobytes()
    except Exception:  # torch without numpy
        data = bytes(raw.tolist())
    digest = hashlib.sha256(data).digest()
    mine = torch.tensor(list(digest[:16]), dtype=torch.float32, device="cuda")
    everyone = comm.all_gather(mine).view(comm.world_size, -1).cpu()
    for r in range(1, comm.world_size):
        assert torch.equal(everyone[r], everyone[0]), f"{what}: rank {r} differs from rank 0"


def eager(backend, seed=1):
    comm = _setup(backend)
    r, n, dev = comm.rank, comm.world_size, comm.device
    for dtype in DTYPES:
        for count in [1, 7, 4096, 21504, 1 << 20]:
            inputs = _inputs(count, dtype, n, seed)
            want = _reference(inputs, dtype)
            x = inputs[r].cuda()
            out = torch.full_like(x, float("nan"))
            comm.all_reduce(x, out=out)
            _close(out, want, dtype, f"{backend} all_reduce {dtype} x{count}")
            comm.all_reduce(x)  # in place
            torch.cuda.synchronize()
            assert torch.equal(x, out), f"{backend} in place {dtype} x{count}"
            _same_on_every_rank(comm, out, f"{backend} all_reduce {dtype} x{count}")
        count = 4096
        inputs = _inputs(count, dtype, n, seed + 1)
        got = comm.all_gather(inputs[r].cuda())
        assert torch.equal(got.cpu(), torch.cat(inputs)), f"{backend} all_gather {dtype}"
        big = _inputs(count * n, dtype, n, seed + 2)
        got = comm.reduce_scatter(big[r].cuda())
        _close(got, _reference(big, dtype)[r * count:(r + 1) * count], dtype, f"{backend} reduce_scatter {dtype}")
        x = inputs[r].cuda()
        comm.broadcast(x, n - 1)
        assert torch.equal(x.cpu(), inputs[n - 1]), f"{backend} broadcast {dtype}"
    torch.cuda.synchronize()
    comm.async_error()
    print(comm.explain(torch.zeros(21504, dtype=torch.bfloat16, device=dev)))
    comm.close()
    print(f"rank {r}: ok")


def _warm(comm, x, out=None):
    """Eager calls on a side stream first, as torch.cuda.graph asks (first calls build
    kernels and state that capture cannot): in place, and into `out` when given."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            comm.all_reduce(x)
            if out is not None:
                comm.all_reduce(x, out=out)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


def graph(backend, seed=2):
    comm = _setup(backend)
    r, n = comm.rank, comm.world_size
    x = torch.zeros(21504, dtype=torch.bfloat16, device="cuda")
    out = torch.zeros_like(x)
    _warm(comm, x)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        comm.all_reduce(x, out=out)
    for replay in range(3):
        inputs = _inputs(x.numel(), "bf16", n, seed + replay)
        x.copy_(inputs[r])
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _close(out, _reference(inputs, "bf16"), "bf16", f"{backend} graph replay {replay}")
        _same_on_every_rank(comm, out, f"{backend} graph replay {replay}")
    comm.async_error()
    comm.close()
    print(f"rank {r}: ok")


def step(backend, seed=3, calls=122, replays=20):
    """The seeds' verify step: 122 all-reduces of 3 x 7168 bf16, each followed by a small
    kernel (x *= 1 / world, exact for a power-of-two world), in one captured graph."""
    comm = _setup(backend)
    r, n = comm.rank, comm.world_size
    assert n & (n - 1) == 0, "the exact reference needs a power-of-two world"
    x = torch.zeros(3, 7168, dtype=torch.bfloat16, device="cuda")
    _warm(comm, x)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            comm.all_reduce(x)
            x.mul_(1.0 / n)
    inputs = _inputs(x.numel(), "bf16", n, seed)
    # After the first all-reduce every rank holds S = bf16(sum); each later one of n equal
    # tensors gives n * (S / n) = S exactly; the last kernel leaves S / n.
    want = (_reference(inputs, "bf16").to(torch.bfloat16).float() / n).to(torch.bfloat16)
    x.copy_(inputs[r].view(3, 7168))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(x.view(-1).cpu(), want), f"{backend} step differs from the reference"
    _same_on_every_rank(comm, x, f"{backend} step")
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / replays / calls * 1e6)
    comm.async_error()
    comm.close()
    print(json.dumps({"case": "step", "backend": backend, "rank": r, "world": n,
                      "us_per_call": sorted(times)[1]}))


def fused(backend, seed=4, rows=3, hidden=7168, eps=1e-6):
    comm = _setup(backend)
    r, n = comm.rank, comm.world_size
    inputs = _inputs(rows * hidden, "bf16", n, seed)
    residual0 = _inputs(rows * hidden, "bf16", 1, seed + 1)[0]
    weight = _inputs(hidden, "bf16", 1, seed + 2)[0]
    x = inputs[r].cuda()
    residual = residual0.cuda()
    out = torch.full_like(x, float("nan"))
    comm.all_reduce_residual_rmsnorm(x, residual, weight.cuda(), eps, out=out)
    torch.cuda.synchronize()
    a = _reference(inputs, "bf16").to(torch.bfloat16)
    res = (residual0.float() + a.float()).to(torch.bfloat16)
    rows_f = res.float().view(rows, hidden)
    norm = rows_f * torch.rsqrt(rows_f.pow(2).mean(dim=1, keepdim=True) + eps)
    want = (norm * weight.float()).to(torch.bfloat16).view(-1)
    assert torch.equal(residual.cpu(), res), f"{backend} fused: residual differs"
    _close(out, want.float(), "bf16", f"{backend} fused out")
    _same_on_every_rank(comm, out, f"{backend} fused")
    comm.close()
    print(f"rank {r}: ok")


def engine(backend):
    """The serving engines' slot: eager, and under graph capture through capture()."""
    slot = comm_rs.CustomAllreduce(backend=backend)
    torch.cuda.set_device(slot.comm.device)
    r, n = slot.comm.rank, slot.comm.world_size
    x = torch.full((4096,), float(r + 1), dtype=torch.bfloat16, device="cuda")
    assert slot.should_custom_ar(x)
    assert not slot.should_custom_ar(x.cpu())
    assert not slot.should_custom_ar(torch.zeros(3, dtype=torch.bfloat16, device="cuda"))
    out = slot.custom_all_reduce(x)
    torch.cuda.synchronize()
    assert (out == n * (n + 1) / 2).all(), out
    _warm(slot.comm, x.clone())
    g = torch.cuda.CUDAGraph()
    with slot.capture():
        assert slot.capturing
        with torch.cuda.graph(g):
            captured = slot.custom_all_reduce(x)
    x.fill_(2.0)
    g.replay()
    torch.cuda.synchronize()
    assert (captured == 2.0 * n).all(), captured
    slot.close()
    print(f"rank {r}: ok")


def registered(backend, seed=5, rows=3, hidden=7168):
    """Communicator.empty: tensors in registered memory, all-reduced out of place, in place
    and a row of one, eager and captured, against the reference; close() frees them, warns
    of one still alive, and later calls on it raise. ipc and auto must register; nccl (a
    world of one where NCCL has no symmetric windows) and symm-cuda (a heap in host memory)
    may refuse, which is printed as skipped."""
    comm = _setup(backend)
    r, n = comm.rank, comm.world_size
    try:
        x = comm.empty((rows, hidden), dtype=torch.bfloat16)
    except comm_rs.Unsupported as e:
        if backend in ("ipc", "auto"):
            raise
        print(f"rank {r}: registered memory skipped: {backend} registers none here: {e}")
        comm.close()
        return
    out = comm.empty(rows * hidden, dtype="bf16")
    assert x.shape == (rows, hidden) and x.dtype == torch.bfloat16 and x.is_contiguous()
    assert x.device == torch.device("cuda", comm.device) and out.shape == (rows * hidden,)
    count = rows * hidden

    inputs = _inputs(count, "bf16", n, seed)
    want = _reference(inputs, "bf16")
    x.copy_(inputs[r].view(rows, hidden))
    out.fill_(float("nan"))
    assert comm.all_reduce(x, out=out) is out
    torch.cuda.synchronize()
    _close(out, want, "bf16", f"{backend} registered all_reduce")
    assert torch.equal(x.view(-1).cpu(), inputs[r]), f"{backend} registered: input changed"
    comm.all_reduce(x)
    torch.cuda.synchronize()
    _close(x.view(-1), want, "bf16", f"{backend} registered all_reduce in place")
    _same_on_every_rank(comm, x, f"{backend} registered in place")

    # One row: a view inside the buffer; the other rows stay as they were.
    inputs = _inputs(count, "bf16", n, seed + 1)
    x.copy_(inputs[r].view(rows, hidden))
    comm.all_reduce(x[1])
    torch.cuda.synchronize()
    row = slice(hidden, 2 * hidden)
    _close(x[1], _reference(inputs, "bf16")[row], "bf16", f"{backend} registered row")
    assert torch.equal(x[0].cpu(), inputs[r][:hidden]), f"{backend} registered: row 0 written"
    assert torch.equal(x[2].cpu(), inputs[r][2 * hidden:]), f"{backend} registered: row 2 written"

    _warm(comm, x, out)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        comm.all_reduce(x, out=out)
        comm.all_reduce(x)
    for replay in range(3):
        inputs = _inputs(count, "bf16", n, seed + 2 + replay)
        want = _reference(inputs, "bf16")
        x.copy_(inputs[r].view(rows, hidden))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _close(out, want, "bf16", f"{backend} registered graph replay {replay}")
        _close(x.view(-1), want, "bf16", f"{backend} registered graph replay {replay} in place")
        _same_on_every_rank(comm, out, f"{backend} registered graph replay {replay}")
    comm.async_error()

    del g, out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        comm.close()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)], (
        f"{backend}: close() did not warn of the live tensor: {[str(w.message) for w in caught]}"
    )
    try:
        comm.all_reduce(x)
    except comm_rs.Aborted:
        pass
    else:
        raise AssertionError(f"{backend}: all_reduce on a closed communicator did not raise")
    del x
    print(f"rank {r}: ok")


def suite(backend):
    """Every case above on one backend, each on a communicator of its own."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    eager(backend)
    graph(backend)
    step(backend)
    registered(backend)
    if backend in ("ipc", "symm-cuda"):
        fused(backend)
    if world > 1:
        engine(backend)
