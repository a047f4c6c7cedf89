"""A program input read only as a GEMM's B may be a transposed view (``w.t()``): the
layers' backward passes hand the weight over that way instead of copying its transpose."""

from __future__ import annotations

import pytest
import torch

from hostir import ir
from hostir.errors import InputMismatchError
from lowering.patterns import allgather_matmul, matmul_reduce_scatter
from lowering.pipeline import lower
from runtime.device import CpuBackend
from runtime.interpreter import Interpreter, transposable_inputs


def t(name, shape, dtype="float32"):
    return ir.Tensor(name, shape, dtype)


def _program():
    """c = a @ b; d = a + a2 (a is read otherwise, b only as the GEMM's B)."""
    a, b, a2 = t("T0", (4, 3)), t("T1", (3, 5)), t("T2", (4, 3))
    c, d = t("T3", (4, 5)), t("T4", (4, 3))
    return ir.Program((a, b, a2), (c, d), (ir.Allocate(c), ir.Matmul(c, a, b),
                                           ir.Allocate(d), ir.Add(d, a, a2)))


def test_only_inputs_read_as_b_are_transposable():
    assert transposable_inputs(_program()) == {"T1"}
    # The lowered programs: B of AllGather+GEMM and of GEMM+ReduceScatter, both schedules.
    for schedule in ("pipelined", "ring"):
        ag = lower(allgather_matmul(16, 8, 4, 2, 2), 2, 2, 0, schedule=schedule)
        rs = lower(matmul_reduce_scatter(16, 8, 4, 2, 2), 2, 2, 0, schedule=schedule)
        assert transposable_inputs(ag) == {ag.inputs[1].name}
        assert transposable_inputs(rs) == {rs.inputs[1].name}
    # An epilogue GEMM (cuBLASLt) takes contiguous rows: its B is not transposable.
    dg = lower(allgather_matmul(16, 8, 4, 1, 2, epilogue="dgelu"), 2, 2, 0, schedule="ring")
    assert transposable_inputs(dg) == set()


def test_transposed_view_runs_and_equals_the_contiguous_input():
    g = torch.Generator().manual_seed(0)
    a, a2 = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    w = torch.randn(5, 3, generator=g)  # the stored weight; the program reads w^T [3, 5]
    run = Interpreter(_program(), CpuBackend())
    c, d = run(a, w.t(), a2)
    c_ref, d_ref = Interpreter(_program(), CpuBackend())(a, w.t().contiguous(), a2)
    torch.testing.assert_close(c, a @ w.t())
    torch.testing.assert_close(c, c_ref)  # the same math; BLAS may order sums differently
    assert torch.equal(d, d_ref)


@pytest.mark.parametrize("which,make,message", [
    (0, lambda a: a.t().contiguous().t(), "input T0: expected a contiguous tensor, got strides"),
    (1, lambda b: torch.randn(3, 10)[:, ::2], "input T1: expected a contiguous tensor or a "
                                              "transposed view (w.t()), got strides (10, 2)"),
])
def test_other_layouts_are_refused(which, make, message):
    g = torch.Generator().manual_seed(1)
    args = [torch.randn(4, 3, generator=g), torch.randn(3, 5, generator=g),
            torch.randn(4, 3, generator=g)]
    args[which] = make(args[which])
    with pytest.raises(InputMismatchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Interpreter(_program(), CpuBackend())(*args)
