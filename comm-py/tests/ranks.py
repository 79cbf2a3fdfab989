"""Runs a test's ranks as processes, the way torchrun starts them.

``launch(n, module, case, *args)`` starts ``n`` Python processes with torchrun's variables
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` on a free port), each running ``module.case(*args)`` (the module is a
file of this folder), and returns their exit codes and outputs. Every rank has a bound;
one still running at the end is killed and reported.
"""

import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rank:
    def __init__(self, rank, code, out, err, seconds):
        self.rank, self.code, self.out, self.err, self.seconds = rank, code, out, err, seconds

    def __repr__(self):
        return f"rank {self.rank}: exit {self.code} after {self.seconds:.1f} s\n{self.out}\n{self.err}"


def launch(n, module, case, *args, timeout=120, env=None):
    port = free_port()
    procs = []
    started = time.monotonic()
    for rank in range(n):
        e = dict(os.environ)
        e.update(
            RANK=str(rank),
            WORLD_SIZE=str(n),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(n),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            COMM_TIMEOUT_SECS=e.get("COMM_TIMEOUT_SECS", "20"),
        )
        e.update(env or {})
        code = (
            f"import sys; sys.path.insert(0, {HERE!r}); import {module}; "
            f"{module}.{case}(*{list(args)!r})"
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    ranks = []
    for rank, p in enumerate(procs):
        left = max(1.0, timeout - (time.monotonic() - started))
        try:
            out, err = p.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            err += f"\n[killed after {timeout} s]"
        ranks.append(Rank(rank, p.returncode, out, err, time.monotonic() - started))
    return ranks


def check(ranks):
    """Asserts that every rank exited 0, showing every rank's output otherwise."""
    assert all(r.code == 0 for r in ranks), "\n".join(map(repr, ranks))
