"""What a Python call costs next to the same Rust call, and what graph replays cost.

For each backend, one rank (a world of one: the host's cost, not the peers'), a 42 KB bf16
all-reduce on torch's current stream, out of place (a world of one copies the input) and in
place (where a world of one has nothing to do: the call's bare cost): the host time per
eager call (calls enqueued back to back, nothing waited for), the time per call back to back
including the GPU, and the time per call of a CUDA graph of 100 calls replayed. Medians of
3 runs. `allreduce-perf --ranks 1` gives the Rust figures alike (host_us, back_to_back_us,
and time with --graph).

    python bench/overhead.py [--backends nccl,ipc,symm-cuda,auto] [--json FILE]
"""

import argparse
import json
import statistics
import time

import torch

import comm_rs


def warm(comm, x):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(10):
            comm.all_reduce(x)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


def measure(backend, count, calls, per_graph, replays, in_place):
    comm = comm_rs.Communicator.from_env(backend)
    torch.cuda.set_device(comm.device)
    x = torch.ones(count, dtype=torch.bfloat16, device="cuda")
    y = None if in_place else torch.empty_like(x)
    warm(comm, x)
    host, b2b = [], []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            comm.all_reduce(x, out=y)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) / calls * 1e6)
        b2b.append((t2 - t0) / calls * 1e6)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(per_graph):
            comm.all_reduce(x, out=y)
    graph = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
        graph.append((time.perf_counter() - t0) / replays / per_graph * 1e6)
    comm.async_error()
    comm.close()
    return {
        "backend": backend,
        "bytes": count * 2,
        "in_place": in_place,
        "host_us": statistics.median(host),
        "b2b_us": statistics.median(b2b),
        "graph_us": statistics.median(graph),
        "runs": {"host_us": host, "b2b_us": b2b, "graph_us": graph},
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="nccl,ipc,symm-cuda,auto")
    p.add_argument("--count", type=int, default=21504, help="bf16 elements (3 x 7168)")
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--json")
    args = p.parse_args()
    rows = []
    for in_place in (False, True):
        for backend in args.backends.split(","):
            try:
                rows.append(measure(backend, args.count, args.calls, 100, 20, in_place))
            except comm_rs.CommError as e:
                rows.append({"backend": backend, "in_place": in_place, "error": str(e)})
            r = rows[-1]
            where = "in place" if in_place else "out of place"
            if "error" in r:
                print(f"{backend:10} {where:12} error: {r['error']}")
            else:
                print(f"{backend:10} {where:12} host {r['host_us']:6.2f} us  b2b {r['b2b_us']:6.2f} "
                      f"us  graph {r['graph_us']:6.2f} us per call ({r['bytes']} B bf16)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
