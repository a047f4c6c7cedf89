"""The zeroed arena: semaphores for single-launch split-K, zeroed once, never per launch.

A kernel that takes semaphores from the arena must leave them zero when it finishes
(serial split-K's last slice writes its tile's semaphore back to 0). So the arena is
zeroed only when it grows (a fresh `torch.zeros`), and every later launch finds it zero
without a memset.

There is one arena per (device, stream): kernels on one stream run in order, so they can
reuse the same semaphores, while two kernels in flight on different streams never share
one. The same holds for the fp32 partials workspace of split-K (no zeroing needed: the
first slice stores, it never adds to what was there).

A stream is known by its handle (`cuda_stream`). A handle reused by a new stream after the
old one was destroyed maps to the old arena, which is then idle: the old stream is gone.

Example:
    >>> arena = arena_for(torch.cuda.current_stream())          # doctest: +SKIP
    >>> sems = arena.semaphores(256)   # int32[256], all zero     # doctest: +SKIP
"""

from __future__ import annotations

import threading

import torch

from hostir.errors import ExecutionError

# Grow in whole steps so that a slowly growing tile count does not reallocate each time.
_SEM_GRANULE = 4096      # int32 semaphores
_PARTIAL_GRANULE = 1 << 20  # fp32 elements (4 MiB)


class ZeroedArena:
    """Semaphores (int32, zero between kernels) and fp32 scratch of one (device, stream)."""

    def __init__(self, device: torch.device, stream_handle: int):
        self.device = device
        self.stream_handle = stream_handle
        self._sems = torch.zeros(0, dtype=torch.int32, device=device)
        self._partials = torch.empty(0, dtype=torch.float32, device=device)
        self.grows = 0  # how many times the semaphores were (re)zeroed: tests read it
        self._retired: list[torch.Tensor] = []

    def semaphores(self, count: int) -> torch.Tensor:
        """`count` int32 semaphores, zero now and expected zero again after the kernel.

        Call with the arena's stream current: a new buffer is allocated (and zeroed) on it,
        so the caching allocator orders it with that stream's kernels.
        """
        if count > self._sems.numel():
            size = -(-count // _SEM_GRANULE) * _SEM_GRANULE
            # The old buffer may still be read by queued kernels of this stream (torch's
            # allocator orders that) and by CUDA graphs captured with its address, which
            # replay later: it is kept, never freed nor handed out again.
            self._retired.append(self._sems)
            self._sems = torch.zeros(size, dtype=torch.int32, device=self.device)
            self.grows += 1
        return self._sems[:count]

    def semaphore_ptr(self, count: int) -> int:
        """The address of `semaphores(count)`, without building a tensor view (the
        per-call path of the generated matmul)."""
        if count > self._sems.numel():
            self.semaphores(count)
        return self._sems.data_ptr()

    def partials(self, numel: int) -> torch.Tensor:
        """fp32 scratch of at least `numel` elements, contents undefined."""
        if numel > self._partials.numel():
            size = -(-numel // _PARTIAL_GRANULE) * _PARTIAL_GRANULE
            self._retired.append(self._partials)  # as above: captured graphs hold it
            self._partials = torch.empty(size, dtype=torch.float32, device=self.device)
        return self._partials[:numel]

    def partials_ptr(self, numel: int) -> int:
        """The address of `partials(numel)`, without building a tensor view."""
        if numel > self._partials.numel():
            self.partials(numel)
        return self._partials.data_ptr()

    def check_zeroed(self) -> None:
        """Raise unless every semaphore is zero. Synchronizes the arena's device."""
        torch.cuda.synchronize(self.device)
        nonzero = torch.count_nonzero(self._sems).item()
        if nonzero:
            first = torch.nonzero(self._sems)[:4].flatten().tolist()
            raise ExecutionError(
                f"zeroed arena of {self.device} stream {self.stream_handle:#x}: {nonzero} of "
                f"{self._sems.numel()} semaphores are not zero after the kernels finished "
                f"(first at {first}); a kernel did not give its semaphores back")

    @property
    def semaphore_buffer(self) -> torch.Tensor:
        return self._sems


_ARENAS: dict[tuple[int, int], ZeroedArena] = {}
_LOCK = threading.Lock()


def arena_for(stream: torch.cuda.Stream | None = None) -> ZeroedArena:
    """The arena of `stream` (the current stream by default) on its device."""
    if stream is None:
        stream = torch.cuda.current_stream()
    return arena_for_handle(stream.device.index, stream.cuda_stream)


def arena_for_handle(device_index: int, stream_handle: int) -> ZeroedArena:
    """The arena of the stream with raw handle `stream_handle` on a device (which must
    be that device's current stream if the arena is new or grows: see `semaphores`)."""
    key = (device_index, stream_handle)
    arena = _ARENAS.get(key)  # the common case, without the lock
    if arena is None:
        with _LOCK:
            arena = _ARENAS.get(key)
            if arena is None:
                arena = _ARENAS[key] = ZeroedArena(torch.device("cuda", device_index),
                                                   stream_handle)
    return arena


def check_all_zeroed() -> None:
    """`check_zeroed` on every arena of the process (HOSTIR_ENABLE=check_zeroed)."""
    for arena in list(_ARENAS.values()):
        arena.check_zeroed()

