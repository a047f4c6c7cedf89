"""Matmul epilogues (gelu_aux, dgelu) through the IR, the text form, the verifier, the
lowering (per stage and per ring row block) and the CPU interpreter."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from hostir import ir
from hostir.errors import LoweringError, ParseError, VerificationError
from hostir.parser import parse
from hostir.printer import print_program
from hostir.verify import verify
from lowering.patterns import allgather_matmul, matmul_reduce_scatter
from lowering.pipeline import lower
from runtime.device import CpuBackend
from runtime.interpreter import Interpreter


def t(name, shape, dtype="float32"):
    return ir.Tensor(name, shape, dtype)


@pytest.mark.parametrize("make,message", [
    (lambda: ir.Matmul(t("T2", (4, 5)), t("T0", (4, 3)), t("T1", (3, 5)), "gelu_aux",
                       t("T3", (4, 6))), "expected out's float32"),
    (lambda: ir.Matmul(t("T2", (4, 5)), t("T0", (4, 3)), t("T1", (3, 5)), "dgelu",
                       t("T3", (4, 5), "bfloat16")), "expected out's float32"),
    (lambda: ir.Matmul(t("T2", (4, 5)), t("T0", (4, 3)), t("T1", (3, 5)), "relu",
                       t("T3", (4, 5))), "unknown epilogue"),
    (lambda: ir.Matmul(t("T2", (4, 5)), t("T0", (4, 3)), t("T1", (3, 5)), "dgelu"), "aux"),
    (lambda: ir.Matmul(t("T2", (4, 5)), t("T0", (4, 3)), t("T1", (3, 5)), None,
                       t("T3", (4, 5))), "without an epilogue"),
    (lambda: ir.Matmul(t("T2", (4, 5)), t("T0", (4, 3)), t("T1", (3, 5)), "gelu_aux",
                       t("T2", (4, 5))), "of its own"),
])
def test_matmul_checks_its_epilogue(make, message):
    with pytest.raises(VerificationError, match=message):
        make()


def _program(epilogue, dtype="float32", m=6, k=5, n=8):
    """out (and a written pre-activation) from a @ b, no communication."""
    a, b = t("T0", (m, k), dtype), t("T1", (k, n), dtype)
    out, pre = t("T2", (m, n), dtype), t("T3", (m, n), dtype)
    if epilogue == "gelu_aux":
        return ir.Program((a, b), (out, pre), (ir.Allocate(out), ir.Allocate(pre),
                                               ir.Matmul(out, a, b, epilogue, pre)))
    return ir.Program((a, b, pre), (out,), (ir.Allocate(out), ir.Matmul(out, a, b, epilogue, pre)))


def test_golden_text_and_round_trip():
    text = print_program(_program("gelu_aux"))
    assert "  T2 = matmul(T0, T1, epilogue=gelu_aux, aux=T3)\n" in text
    assert print_program(parse(text)) == text
    text = print_program(_program("dgelu"))
    assert "  T2 = matmul(T0, T1, epilogue=dgelu, aux=T3)\n" in text
    assert print_program(parse(text)) == text


@pytest.mark.parametrize("edit,error,message", [
    (("epilogue=dgelu", "epilogue=gelu"), ParseError, "unknown epilogue 'gelu'"),
    (("aux=T3", "aux=T9"), ParseError, "tensor 'T9' is not defined"),
    ((", aux=T3", ""), ParseError, "expected ','"),
])
def test_parse_refuses_bad_epilogues(edit, error, message):
    text = print_program(_program("dgelu")).replace(*edit)
    with pytest.raises(error, match=message):
        parse(text)


def test_verify_refuses_a_pre_activation_written_into_an_input():
    p = _program("dgelu")
    mm = p.body[-1]
    bad = dataclasses.replace(p, body=(p.body[0], dataclasses.replace(mm, epilogue="gelu_aux")))
    with pytest.raises(VerificationError, match="pre-activation into the program input T3"):
        verify(bad)


def test_verify_refuses_an_undefined_aux():
    p = _program("gelu_aux")
    bad = dataclasses.replace(p, body=p.body[:1] + p.body[2:], outputs=p.outputs[:1])
    with pytest.raises(VerificationError, match="T3 is used before it is defined"):
        verify(bad)


def _selects(p):
    return {s.out.name: s for s in ir.walk(p.body) if isinstance(s, ir.Select)}


def _chain(name, selects):
    """(root, [(axis, index text) ...]) of a tensor defined by a chain of selects."""
    from hostir.printer import format_expr

    steps = []
    while name in selects:
        s = selects[name]
        steps.append((s.axis, format_expr(s.index)))
        name = s.input.name
    return name, steps[::-1]


@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
@pytest.mark.parametrize("epilogue", ["gelu_aux", "dgelu"])
@pytest.mark.parametrize("stages,world", [(1, 1), (2, 2), (2, 4)])
def test_every_gemm_gets_the_epilogue_on_out_rows(schedule, epilogue, stages, world):
    p = lower(allgather_matmul(16 * stages * world, 32, 16, stages, world, "bfloat16", epilogue),
              world, 2, schedule=schedule)
    assert print_program(parse(print_program(p))) == print_program(p)
    mms = [s for s in ir.walk(p.body) if isinstance(s, ir.Matmul)]
    assert len(mms) == (2 if schedule == "ring" else 1)  # the ring: own rows, then a loop
    selects = _selects(p)
    pre = p.outputs[1] if epilogue == "gelu_aux" else p.inputs[2]
    assert pre.shape == p.outputs[0].shape
    for mm in mms:
        assert mm.epilogue == epilogue
        out_root, out_steps = _chain(mm.out.name, selects)
        aux_root, aux_steps = _chain(mm.aux.name, selects)
        assert (out_root, aux_root) == (p.outputs[0].name, pre.name)
        assert out_steps == aux_steps  # the same rows of the pre-activation as of out


def test_reduce_scatter_refuses_an_epilogue():
    with pytest.raises(LoweringError, match="partial sum"):
        matmul_reduce_scatter(64, 32, 16, 2, 2, "float32", "gelu_aux")


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_cpu_interpreter_runs_both_epilogues(dtype, tol):
    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    a, b = torch.randn(6, 5, generator=g).to(dt), torch.randn(5, 8, generator=g).to(dt)
    out, pre = Interpreter(_program("gelu_aux", dtype), CpuBackend())(a, b)
    ref_pre = a.double() @ b.double()
    ref = F.gelu(ref_pre, approximate="tanh")
    err = lambda x, r: float((x.double() - r).norm() / r.norm())  # noqa: E731
    assert err(pre, ref_pre) < tol and err(out, ref) < tol
    dh = torch.randn(6, 5, generator=g).to(dt)
    (dpre,) = Interpreter(_program("dgelu", dtype), CpuBackend())(dh, b, pre)
    x = pre.double().requires_grad_()
    F.gelu(x, approximate="tanh").backward(dh.double() @ b.double())
    assert err(dpre, x.grad) < tol
