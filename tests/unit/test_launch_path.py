"""The per-call launch path without a GPU: the arena hands out pointers without views and
grows zeroed; Kernel.launch_raw passes the raw stream, sets shared memory once and prints
launch_params only when asked."""

import dataclasses

import pytest
import torch

from hostir.options import options, set_options
from runtime import jit
from runtime.workspace import ZeroedArena


def test_arena_pointers_match_the_views_and_grow_zeroed():
    arena = ZeroedArena(torch.device("cpu"), 0x1234)
    ptr = arena.semaphore_ptr(10)
    assert ptr == arena.semaphores(10).data_ptr() and arena.grows == 1
    assert arena.semaphore_ptr(5) == ptr and arena.grows == 1  # fits: no regrowth
    big = arena.semaphore_ptr(10_000)  # past the first granule: a fresh zeroed buffer
    assert arena.grows == 2 and big == arena.semaphores(10_000).data_ptr()
    assert int(torch.count_nonzero(arena.semaphore_buffer)) == 0
    p = arena.partials_ptr(100)
    assert p == arena.partials(100).data_ptr() == arena.partials_ptr(50)
    assert arena.partials_ptr(3 << 20) == arena.partials(3 << 20).data_ptr()


class _Function:
    ptr = 99

    def __init__(self):
        self.calls = []

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        self.calls.append((grid, block, args, shared_mem, stream))


def test_launch_raw_passes_the_raw_stream_and_dumps_only_when_asked(monkeypatch, capsys):
    pytest.importorskip("cupy")
    from cupy.cuda import driver

    smem = []
    monkeypatch.setattr(driver, "funcSetAttribute", lambda ptr, attr, n: smem.append(n))
    monkeypatch.setattr(jit, "_external_stream", lambda handle: ("stream", handle))
    fn = _Function()
    k = jit.Kernel(fn, "k")
    saved = options()
    try:
        set_options(dataclasses.replace(saved, dumps=frozenset()))
        k.launch_raw((2, 1, 1), (128, 1, 1), (1, 2), 64 * 1024, 0xABC)
        k.launch_raw((2, 1, 1), (128, 1, 1), (1, 2), 64 * 1024, 0xABC)
        assert capsys.readouterr().out == ""
        set_options(dataclasses.replace(saved, dumps=frozenset({"launch_params"})))
        k.launch_raw((3, 1, 1), (64, 1, 1), (), 0, 0xDEF)
        k.cluster = 2  # a kernel compiled with __cluster_dims__(2, 1, 1)
        k.launch_raw((4, 1, 1), (64, 1, 1), (), 0, 0xDEF)
        out = capsys.readouterr().out
    finally:
        set_options(saved)
    assert smem == [64 * 1024]  # the attribute once, for the larger size
    assert [c[4] for c in fn.calls] == [("stream", 0xABC)] * 2 + [("stream", 0xDEF)] * 2
    assert "launch k grid=(3, 1, 1) block=(64, 1, 1) smem=0 stream=0xdef" in out
    assert "launch k grid=(4, 1, 1) block=(64, 1, 1) cluster=2 smem=0 stream=0xdef" in out
