"""comm_rs: collective communication for PyTorch programs, over the comm crates.

    comm = comm_rs.Communicator.from_env()      # torchrun's or mpirun's variables
    comm.all_reduce(x)                          # in place, on torch.cuda.current_stream()

Tensors are torch tensors (CUDA, or CPU for host backends), numpy arrays, or anything with
``__cuda_array_interface__``, ``__array_interface__`` or ``__dlpack__``. Errors are
exceptions named after the Rust error's variants, all subclasses of ``CommError``.
``CustomAllreduce`` plugs a communicator into a serving engine's custom all-reduce slot.
"""

from ._comm_rs import (
    Aborted,
    Backend,
    Bootstrap,
    CommError,
    Communicator,
    InvalidArgument,
    Io,
    LibraryMissing,
    Mismatch,
    NoDevice,
    RegisteredMemory,
    Timeout,
    Unsupported,
    __version__,
)
from .engine import CustomAllreduce

__all__ = [
    "Aborted",
    "Backend",
    "Bootstrap",
    "CommError",
    "Communicator",
    "CustomAllreduce",
    "InvalidArgument",
    "Io",
    "LibraryMissing",
    "Mismatch",
    "NoDevice",
    "RegisteredMemory",
    "Timeout",
    "Unsupported",
    "__version__",
]
