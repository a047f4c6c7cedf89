import dataclasses

import pytest

from hostir import ir
from hostir.errors import VerificationError
from hostir.verify import verify

from .programs import lowered


def loop_of(p):
    """The stage loop (the last FOR; the first one makes the workers wait on s0)."""
    return [s for s in p.body if isinstance(s, ir.ForLoop)][-1]


def with_loop_body(p, body):
    loop = loop_of(p)
    new = dataclasses.replace(loop, body=tuple(body))
    return dataclasses.replace(p, body=tuple(new if s is loop else s for s in p.body))


def test_lowered_program_verifies():
    verify(lowered())


def test_use_before_definition():
    p = lowered()
    body = list(loop_of(p).body)
    mm = next(s for s in body if isinstance(s, ir.Matmul))
    body.remove(mm)
    body.insert(2, mm)
    with pytest.raises(VerificationError, match="used before it is defined"):
        verify(with_loop_body(p, body))


def test_wait_without_communication():
    p = lowered()
    body = [s for s in loop_of(p).body if not isinstance(s, ir.Communication)]
    with pytest.raises(VerificationError):
        verify(with_loop_body(p, body))


def test_communication_never_waited():
    p = lowered()
    body = [s for s in loop_of(p).body if not isinstance(s, ir.Wait)]
    with pytest.raises(VerificationError, match="never waited"):
        verify(with_loop_body(p, body))


def test_double_wait():
    p = lowered()
    body = list(loop_of(p).body)
    w = next(s for s in body if isinstance(s, ir.Wait))
    body.insert(body.index(w), w)
    with pytest.raises(VerificationError, match="still in flight"):
        verify(with_loop_body(p, body))


def test_for_index_used_outside_its_loop():
    p = lowered()
    src = p.inputs[0]
    outside = ir.Select(ir.select_type("T99", src, 0), src, 0, "i")
    q = dataclasses.replace(p, body=p.body + (outside,))
    with pytest.raises(VerificationError, match="not a FOR index in scope"):
        verify(q)


def test_value_of_a_loop_body_used_after_the_loop():
    p = lowered()
    loop = loop_of(p)
    t5 = next(s.out for s in loop.body if isinstance(s, ir.Select) and s.out.name == "T5")
    q = dataclasses.replace(p, body=p.body + (ir.Select(ir.select_type("T99", t5, 0), t5, 0, 0),))
    with pytest.raises(VerificationError, match="used before it is defined"):
        verify(q)


def test_wrong_value_kind():
    p = lowered()
    # T1 used with another type than it was declared with
    body = list(loop_of(p).body)
    mm = next(s for s in body if isinstance(s, ir.Matmul))
    b2 = ir.Tensor("T1", (32, 16), "float32", (), ir.DeviceMesh((0,)))
    body[body.index(mm)] = ir.Matmul(mm.out, mm.a, b2)
    with pytest.raises(VerificationError, match="was defined as"):
        verify(with_loop_body(p, body))


def test_worker_stream_never_joined():
    p = lowered()
    body = list(loop_of(p).body)[:-1]  # drop the final Synchronize
    with pytest.raises(VerificationError, match="not joined"):
        verify(with_loop_body(p, body))


def test_program_must_end_on_the_user_stream():
    p = lowered()
    body = list(loop_of(p).body)[:-2]  # drop SetCurrentStream s0 + Synchronize
    with pytest.raises(VerificationError):
        verify(with_loop_body(p, body))


def test_worker_stream_before_get_current_stream():
    p = lowered()
    q = dataclasses.replace(p, body=tuple(s for s in p.body if not isinstance(s, ir.GetCurrentStream)))
    with pytest.raises(VerificationError):
        verify(q)


def test_matmul_into_an_input():
    p = lowered(stages=1)
    a, b = p.inputs
    bad = ir.Matmul(b, ir.Tensor("T50", (32, 32), "float32"), b)
    q = dataclasses.replace(p, body=(ir.Allocate(ir.Tensor("T50", (32, 32), "float32")),) + p.body + (bad,))
    with pytest.raises(VerificationError, match="program input"):
        verify(q)


def test_redefinition():
    p = lowered()
    alloc = next(s for s in p.body if isinstance(s, ir.Allocate))
    q = dataclasses.replace(p, body=p.body[:2] + (alloc,) + p.body[2:])
    with pytest.raises(VerificationError, match="defined twice"):
        verify(q)


def test_add_into_a_program_input_is_refused():
    p = lowered()
    b = p.inputs[1]
    body = list(loop_of(p).body) + [ir.Add(b, b, b)]
    with pytest.raises(VerificationError, match="add writes into the program input T1"):
        verify(with_loop_body(p, body))


def test_an_error_quotes_a_long_statement_only_in_part():
    from hostir.parser import parse

    team = ", ".join(map(str, range(5000)))
    text = ("%HostIr {\n  numberOfStreams = 1\n  inputs:\n    T0 : float32[4]\n  outputs: T0\n"
            f"  C0 = Communication(Allreduce, team=[{team}], in=T0, out=T0, op=sum)\n"
            "  Wait C0\n} // %HostIr\n")
    with pytest.raises(VerificationError, match="communication writes into the program input") as e:
        parse(text)
    assert len(str(e.value)) < 500 and "characters)" in str(e.value)


def test_a_statement_without_a_rule_is_checked_by_its_text_form(monkeypatch):
    """A new statement needs no verifier rule: what it reads, writes and defines comes
    from the slots of its text form, and its worker stream must be joined."""
    from typing import ClassVar

    @dataclasses.dataclass(frozen=True, slots=True)
    class Fill:
        TEXT: ClassVar[tuple] = ("{out:written} = fill({value:int}, like={like:tensor})",)
        out: ir.Tensor
        like: ir.Tensor
        value: int

    monkeypatch.setattr(ir, "STATEMENT_TYPES", ir.STATEMENT_TYPES + (Fill,))
    a, b = ir.Tensor("T0", (2, 3), "float32"), ir.Tensor("T1", (2, 3), "float32")
    user = ir.StreamValue("s0")
    ok = ir.Program((a,), (b,), (ir.Allocate(b), Fill(b, a, 1)))
    verify(ok)
    with pytest.raises(VerificationError, match="Fill writes into the program input T0"):
        verify(ir.Program((a,), (b,), (ir.Allocate(b), Fill(a, a, 1))))
    with pytest.raises(VerificationError, match="used before it is defined"):
        verify(ir.Program((a,), (b,), (Fill(b, a, 1), ir.Allocate(b))))
    worker = ir.PoolStream(0)
    with pytest.raises(VerificationError, match="never joined"):
        verify(ir.Program((a,), (b,), (ir.GetCurrentStream(user), ir.Allocate(b),
                                       ir.SetCurrentStream(worker), Fill(b, a, 1),
                                       ir.SetCurrentStream(user))))
