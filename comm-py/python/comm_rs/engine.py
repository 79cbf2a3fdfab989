"""The custom all-reduce slot of serving engines (SGLang, vLLM), with no dependency on them.

Both engines ask their custom all-reduce object the same questions: ``should_custom_ar(t)``
(may this tensor take the custom path?), ``custom_all_reduce(t)`` (the reduced tensor, or
``None`` to fall back), a ``capture()`` context entered around CUDA-graph capture, and
``close()``. ``CustomAllreduce`` answers them over a ``Communicator``.
"""

from contextlib import contextmanager

from ._comm_rs import Communicator

# Element types the device backends reduce (torch dtype names).
_DTYPES = ("torch.bfloat16", "torch.float16", "torch.float32")


class CustomAllreduce:
    """A serving engine's custom all-reduce over a ``Communicator``.

    ``max_size`` bounds the bytes per call taken (larger ones fall back to the engine's
    own path, as the engines' own custom all-reduce does); ``comm`` is an existing
    communicator, else one is made with ``Communicator.from_env(backend, device)``.
    """

    def __init__(self, comm=None, *, backend="auto", device=None, max_size=8 * 1024 * 1024):
        self.comm = comm if comm is not None else Communicator.from_env(backend, device)
        self.max_size = max_size
        self.disabled = self.comm.world_size == 1 or self.comm.device is None
        self._capturing = False

    def should_custom_ar(self, inp) -> bool:
        """True when ``inp`` takes this path: a contiguous CUDA tensor of a reduced dtype,
        a multiple of 16 bytes and at most ``max_size``."""
        if self.disabled or not inp.is_cuda or not inp.is_contiguous():
            return False
        if str(inp.dtype) not in _DTYPES:
            return False
        size = inp.numel() * inp.element_size()
        return size % 16 == 0 and size <= self.max_size

    def custom_all_reduce(self, input):
        """The sum over ranks of ``input``, in a new tensor, on the current stream
        (captured when called under ``torch.cuda.graph``); ``None`` when disabled."""
        if self.disabled:
            return None
        out = input.new_empty(input.shape)
        self.comm.all_reduce(input, out=out)
        return out

    def all_reduce(self, input):
        """``input`` reduced over ranks in place (for engines that call it so)."""
        return self.comm.all_reduce(input)

    @contextmanager
    def capture(self):
        """Graph-capture context. Captured calls need no registration of graph buffers
        afterwards here: the backends read a captured call's tensors at replay where they
        are (NCCL) or copy them into memory they own (ipc, symm-cuda), so this only marks
        the capture for ``capturing``."""
        self._capturing = True
        try:
            yield
        finally:
            self._capturing = False

    @property
    def capturing(self) -> bool:
        return self._capturing

    def close(self):
        """Frees the communicator (collective: every rank closes)."""
        self.disabled = True
        self.comm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
