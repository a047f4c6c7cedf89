import pytest
from hypothesis import given, settings

from hostir.errors import ParseError
from hostir.parser import parse
from hostir.printer import print_program
from hostir.verify import verify

from .programs import lowered, programs

GOLDEN = """\
%HostIr {
  numberOfStreams = 2
  inputs:
    T0 : bfloat16[Stream(2), DIDx(2), 16, 32] mesh=[0, 1]
    T1 : bfloat16[32, 8]
  outputs: T2
  GetCurrentStream into Stream s0
  T3 = ALLOCATE(bfloat16[2, 2, 16, 32])
  T2 = ALLOCATE(bfloat16[2, 2, 16, 8])
  FOR k in range(0, 2):
    SetCurrentStream to Stream (k)
    Synchronize Stream s0
  FOR i in range(0, 2):
    SetCurrentStream to Stream (i % numberOfStreams)
    T4 = select(T0, axis=0, index=i)
    T5 = select(T3, axis=0, index=i)
    C0 = Communication(Allgather, team=[0, 1], in=T4, out=T5)
    Wait C0
    T6 = select(T2, axis=0, index=i)
    T6 = matmul(T5, T1)
    SetCurrentStream to Stream s0
    Synchronize Stream (i % numberOfStreams)
} // %HostIr
"""


def test_golden_lowered_program():
    assert print_program(lowered(m=64, k=32, n=8, dtype="bfloat16")) == GOLDEN


def test_records_do_not_print_themselves():
    """The IR module imports nothing of the printer: the text form is print_program's, and
    a Program's str() is the dataclass repr (no hidden import back into the printer)."""
    import ast
    import inspect

    from hostir import ir

    p = lowered()
    assert str(p) != print_program(p) and str(p).startswith("Program(")
    tree = ast.parse(inspect.getsource(ir))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m and m.startswith("hostir")} == {"hostir.errors"}


@pytest.mark.parametrize("stages,world,streams", [(1, 1, 1), (2, 2, 2), (4, 2, 3), (2, 4, 1), (8, 8, 4)])
def test_round_trip_of_lowered_programs(stages, world, streams):
    p = lowered(m=8 * 8 * 2, stages=stages, world=world, streams=streams)
    text = print_program(p)
    q = parse(text)
    assert print_program(q) == text
    assert q.inputs == p.inputs and q.outputs == p.outputs and q.body == p.body


@settings(max_examples=150, deadline=None)
@given(programs())
def test_round_trip_of_generated_programs(p):
    verify(p)
    text = print_program(p)
    q = parse(text)
    assert print_program(q) == text
    assert q == p


@pytest.mark.parametrize(
    "mutate,line,message",
    [
        (lambda t: t.replace("%HostIr {", "HostIr {"), 1, "first line"),
        (lambda t: t.replace("} // %HostIr", "}"), 23, "last line"),
        (lambda t: t.replace("index=i)", "index=j)", 1), 15, "j"),
        (lambda t: t.replace("Wait C0", "Wait T5"), 18, "expected a communication"),
        (lambda t: t.replace("Allgather", "Allscatter"), 17, "unknown communication"),
        (lambda t: t.replace("bfloat16[32, 8]", "bfloat17[32, 8]"), 5, "unknown dtype"),
        (lambda t: t.replace("T6 = matmul(T5, T1)", "T6 = matmul(T5, T1"), 20, "expected ')'"),
        (lambda t: t.replace("    Wait C0", "   Wait C0"), 18, "indentation"),
        (lambda t: t.replace("T6 = matmul(T5, T1)", "T6 = matmul(T5, T1) $"), 20, "unexpected character"),
        (lambda t: t.replace("T5 = select(T3, axis=0", "T5 = select(T3, axis=7"), 16, "axis 7"),
        (lambda t: t.replace("T4 = select", "T3 = select"), 15, "already defined"),
    ],
)
def test_parse_errors_name_line_and_column(mutate, line, message):
    text = mutate(GOLDEN)
    with pytest.raises(ParseError) as e:
        parse(text)
    assert e.value.line == line, str(e.value)
    assert e.value.column >= 1
    assert message in str(e.value)


def test_parse_error_column_points_at_the_token():
    text = GOLDEN.replace("Wait C0", "Wait C9")
    with pytest.raises(ParseError) as e:
        parse(text)
    assert (e.value.line, e.value.column) == (18, 10)


def test_a_pool_stream_indexed_by_a_bare_name_round_trips():
    from hostir import ir

    p = lowered()
    text = print_program(p)
    assert "SetCurrentStream to Stream (k)" in text   # not `Stream k`, a named stream
    q = parse(text)
    assert q.body == p.body and print_program(q) == text
    assert isinstance(q.body[3].body[0].stream, ir.PoolStream)


def test_add_parses_and_refuses_a_new_target():
    from hostir import ir

    text = GOLDEN.replace("    T6 = matmul(T5, T1)\n", "    T6 = matmul(T5, T1)\n    T6 = add(T6, T6)\n")
    q = parse(text)
    adds = [s for s in ir.walk(q.body) if isinstance(s, ir.Add)]
    assert len(adds) == 1 and adds[0].out.name == "T6" and print_program(q) == text
    with pytest.raises(ParseError, match="add writes into an existing tensor: 'T9' is not one"):
        parse(text.replace("T6 = add(T6, T6)", "T9 = add(T6, T6)"))
    with pytest.raises(ParseError, match="expected equal shapes"):
        parse(text.replace("T6 = add(T6, T6)", "T6 = add(T6, T5)"))


def test_comment_lines_before_the_header_are_skipped():
    """The TP layers' dumps put a `// which pass` line above each program."""
    text = print_program(lowered())
    assert print_program(parse("// column-parallel linear: forward\n// two\n" + text)) == text
    bad = "// a comment\n" + text.replace("Wait C0", "Wait C9", 1)
    line = 1 + text.split("\n").index(next(ln for ln in text.split("\n") if "Wait C0" in ln)) + 1
    with pytest.raises(ParseError) as e:
        parse(bad)
    assert e.value.line == line  # counted in the whole text, comments included
    with pytest.raises(ParseError, match="on the first line"):
        parse("// only a comment\n")


# --------------------------------------------------------------------------- the text-form table

def test_every_statement_declares_a_text_form_over_its_own_fields():
    import dataclasses

    from hostir import ir
    from hostir.printer import SLOT_FORMAT

    assert set(SLOT_FORMAT) == set(ir.SLOT_KINDS)
    used = set()
    for cls in ir.STATEMENT_TYPES:
        fields = {f.name for f in dataclasses.fields(cls)}
        texts = [p.text if isinstance(p, ir.OptionalText) else p for p in cls.TEXT]
        slots = [slot for text in texts for slot in ir.SLOT.findall(text)]
        assert slots, cls.__name__
        for field, kind in slots:
            assert field in fields, (cls.__name__, field)
            assert kind in ir.SLOT_KINDS, (cls.__name__, kind)
            used.add(kind)
    assert used == set(ir.SLOT_KINDS)  # every kind is exercised by a real statement


def test_a_new_statement_needs_only_its_record():
    """A statement the printer and parser have never heard of: its record's TEXT is enough
    for both (what docs/ARCHITECTURE.md promises whoever adds a statement)."""
    import dataclasses
    from typing import ClassVar

    from hostir import ir
    from hostir.parser import _Line, _Parser, _compile_form
    from hostir.printer import format_statement

    @dataclasses.dataclass(frozen=True, slots=True)
    class Fill:
        TEXT: ClassVar[tuple] = ("{out:written} = fill({value:int}, over={team:int_list}",
                                 ir.OptionalText(", on={stream:stream}"), ")")
        out: ir.Tensor
        value: int
        team: tuple
        stream: object = None

    t = ir.Tensor("T0", (2, 3), "float32")
    for s, text in [
        (Fill(t, -4, (0, 1)), "T0 = fill(-4, over=[0, 1])"),
        (Fill(t, 7, (2,), ir.PoolStream(ir.BinOp("%", ir.Var("rank"), ir.Const(2)))),
         "T0 = fill(7, over=[2], on=Stream (rank % 2))"),
    ]:
        assert format_statement(s) == text
        p = _Parser()
        p.values["T0"] = t
        line = _Line(text, 1, 0)
        values, defines = p.read(line, _compile_form(Fill))
        line.end()
        assert Fill(**values) == s and defines == []


def test_communications_of_every_kind_round_trip():
    text = """%HostIr {
  numberOfStreams = 1
  inputs:
    T0 : float32[4, 8]
  outputs: T1, T2, T3
  T1 = ALLOCATE(float32[4, 8])
  T2 = ALLOCATE(float32[2, 8])
  T3 = ALLOCATE(float32[8, 8])
  C0 = Communication(Broadcast, team=[1, 2], in=T0, out=T1, root=2)
  Wait C0
  C1 = Communication(ReduceScatter, team=[1, 2], in=T0, out=T2, op=max)
  Wait C1
  C2 = Communication(Allreduce, team=[1, 2], in=T0, out=T1, op=min)
  Wait C2
  C3 = Communication(Allgather, team=[1, 2], in=T0, out=T3)
  Wait C3
} // %HostIr
"""
    q = parse(text)
    assert print_program(q) == text
    bcast, rs, ar, ag = (s for s in q.body if type(s).__name__ == "Communication")
    assert (bcast.root, rs.reduce_op, ar.reduce_op) == (2, "max", "min")
    assert ag.root == 1  # no root in the text: the team's first rank
    with pytest.raises(ParseError, match="root 0 is not in team") as e:
        parse(text.replace("root=2", "root=0"))
    assert (e.value.line, e.value.column) == (9, 3)  # a construction check: the statement


@pytest.mark.parametrize("mutate,message", [
    (lambda t: t.replace("T6 = matmul(T5, T1)", "T6 = frobnicate(T5, T1)"), "unknown operation 'frobnicate'"),
    (lambda t: t.replace("Wait C0", "Await C0"), "unknown statement"),
    (lambda t: t.replace("in=T4", "inn=T4"), "expected 'in'"),
    (lambda t: t.replace("Stream s0", "Stream rank", 1), "reserved"),
])
def test_statements_the_table_does_not_know_are_parse_errors(mutate, message):
    with pytest.raises(ParseError, match=message):
        parse(mutate(GOLDEN))
