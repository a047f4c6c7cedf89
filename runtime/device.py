"""Device backends: where tensors live and how streams are ordered.

``CudaBackend`` keeps a pool of worker streams (used round-robin by ``PoolStream``
statements) and orders streams with events only: ``wait_stream`` records an event on the
waited stream and makes the waiting stream wait on it (``cudaStreamWaitEvent``); the host
never blocks. ``CpuBackend`` runs everything in program order, so its streams are tokens.
"""

from __future__ import annotations

import torch

from hostir.errors import ExecutionError

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

_CURRENT_STREAM = getattr(torch._C, "_cuda_getCurrentStream", None)


def current_stream(device_index: int) -> torch.cuda.Stream:
    """torch's current stream on a CUDA device, through torch's binding where this torch
    has it: ``torch.cuda.current_stream()`` resolves its device argument anew each call
    (6.7 µs a call without one on the GPU machines' hosts), and programs ask for the
    current stream at every call and collective."""
    if _CURRENT_STREAM is None:
        return torch.cuda.current_stream(device_index)
    stream_id, index, device_type = _CURRENT_STREAM(device_index)
    return torch.cuda.Stream(stream_id=stream_id, device_index=index, device_type=device_type)


def empty(shape, dtype: torch.dtype, device=None) -> torch.Tensor:
    """``torch.empty(shape, ...)`` with the sizes passed one by one, which torch's argument
    parser takes about 1 us faster than one tuple or torch.Size (per-call paths use it)."""
    if not shape:
        return torch.empty((), dtype=dtype, device=device)
    return torch.empty(*shape, dtype=dtype, device=device)


class CpuBackend:
    """Torch CPU tensors; work runs when issued, so stream ordering is implicit."""

    name = "cpu"

    def __init__(self):
        self.device = torch.device("cpu")

    def current_stream(self):
        return "cpu"

    def set_current_stream(self, stream) -> None:
        pass

    def worker(self, index: int, count: int):
        return f"cpu:{index % count}"

    def wait_stream(self, waiter, waited) -> None:
        pass

    def join_all(self, user, others=()) -> None:
        pass

    def allocate(self, shape, dtype: str) -> torch.Tensor:
        return empty(shape, DTYPES[dtype])

    def synchronize(self) -> None:
        pass


class CudaBackend:
    """Torch CUDA tensors on one device and a pool of worker streams."""

    name = "cuda"

    def __init__(self, device: torch.device | int | str | None = None):
        require_cuda("CudaBackend")
        self.device = torch.device("cuda", torch.cuda.current_device() if device is None
                                   else torch.device(device).index or 0)
        self._pool: list[torch.cuda.Stream] = []
        self._events: dict[int, torch.cuda.Event] = {}

    def current_stream(self) -> torch.cuda.Stream:
        return current_stream(self.device.index)

    def set_current_stream(self, stream: torch.cuda.Stream) -> None:
        torch.cuda.set_stream(stream)

    def worker(self, index: int, count: int) -> torch.cuda.Stream:
        """Worker stream ``index % count``; streams are created once and reused."""
        while len(self._pool) < count:
            self._pool.append(torch.cuda.Stream(self.device))
        return self._pool[index % count]

    def wait_stream(self, waiter: torch.cuda.Stream, waited: torch.cuda.Stream) -> None:
        # Event record + cudaStreamWaitEvent: orders the GPU work, never blocks the host.
        # One event per waited stream, reused: cudaStreamWaitEvent captures the event's
        # state when it is called, so re-recording it later cannot change this wait, and
        # creating an event per wait costs a driver call each time.
        if waiter == waited:
            return
        event = self._events.get(waited.cuda_stream)
        if event is None:
            event = self._events[waited.cuda_stream] = torch.cuda.Event()
        event.record(waited)
        event.wait(waiter)  # what waiter.wait_event(event) calls

    def allocate(self, shape, dtype: str) -> torch.Tensor:
        return empty(shape, DTYPES[dtype], self.device)

    def join_all(self, user: torch.cuda.Stream, others=()) -> None:
        """Order ``user`` after every worker (and ``others``): after a failed program, so
        that memory freed on the user's stream is not reused while a worker still uses it."""
        for s in [*self._pool, *others]:
            self.wait_stream(user, s)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


def require_cuda(what: str) -> None:
    """Refuse, with one clear line, to run CUDA work where no GPU is visible."""
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise ExecutionError(f"{what}: no CUDA device is visible (torch {torch.__version__}, "
                             f"CUDA build: {torch.version.cuda or 'no'}); use --device cpu")


def make_backend(device: str = "auto"):
    """``auto`` picks CUDA when a GPU is present, else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return CpuBackend()
    if device.startswith("cuda"):
        return CudaBackend(None if device == "cuda" else device)
    raise ExecutionError(f"unknown device {device!r}: expected auto, cpu or cuda[:N]")
