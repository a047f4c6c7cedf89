"""Kernel.ensure_smem sets the function's dynamic shared-memory attribute for any size it
has not set before, 48 KiB included (static arrays share those 48 KiB)."""

import pytest

cupy = pytest.importorskip("cupy")

from runtime.jit import Kernel  # noqa: E402


class _Function:
    ptr = 1234


def test_attribute_set_once_per_larger_size(monkeypatch):
    from cupy.cuda import driver

    calls = []
    monkeypatch.setattr(driver, "funcSetAttribute", lambda ptr, attr, n: calls.append((ptr, attr, n)))
    k = Kernel(_Function(), "k")
    k.ensure_smem(0)
    assert calls == []
    k.ensure_smem(48 * 1024)     # exactly 48 KiB: with any static array it needs the opt-in
    k.ensure_smem(48 * 1024)     # set already
    k.ensure_smem(1024)          # smaller than what is set
    k.ensure_smem(96 * 1024)
    attr = driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    assert calls == [(1234, attr, 48 * 1024), (1234, attr, 96 * 1024)]
