"""The parser and verifier under attack: random bytes and mutated valid programs give a
ParseError with a line and a column, or a VerificationError; never another exception."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostir.errors import ParseError, VerificationError
from hostir.parser import parse
from hostir.printer import print_program
from lowering.patterns import allgather_matmul, matmul_reduce_scatter
from lowering.pipeline import lower
from tests.unit.programs import lowered, programs

FUZZ = settings(max_examples=400, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
VALID = [print_program(lowered(stages=s, world=w, streams=n))
         for s, w, n in [(1, 1, 1), (2, 2, 2), (4, 2, 3)]] + [
    # the ring GEMM+ReduceScatter: SendRecv, add, nested FOR
    print_program(lower(matmul_reduce_scatter(64, 16, 8, 2, 4), 4, 2, schedule="ring"))] + [
    # matmul epilogues: a written pre-activation, a read one
    print_program(lower(allgather_matmul(64, 16, 8, 2, 2, "bfloat16", e), 2, 2, schedule=s))
    for e, s in [("gelu_aux", "ring"), ("dgelu", "pipelined")]]
# Tokens a mutation may swap in: the language's own words, and near misses.
TOKENS = ["FOR", "in", "range", "(", ")", "[", "]", ",", "=", ":", "%", "//", "+", "-", "*",
          "Stream", "DIDx", "ALLOCATE", "select", "matmul", "add", "Communication", "Wait",
          "Allgather", "SendRecv", "LaunchKernel", "Synchronize", "SetCurrentStream",
          "GetCurrentStream", "into", "to", "axis", "index", "team", "in", "out", "root", "op",
          "grid", "block", "smem", "scalars", "epilogue", "aux", "gelu_aux", "dgelu", "mesh", "float32", "bfloat16", "T0", "T1", "T3",
          "s0", "C0", "i", "numberOfStreams", "rank", "worldSize", "0", "1", "-1", "2",
          "99999999999999999999", "inputs", "outputs", "{", "}", "%HostIr", "\t", " ", ""]


def parses_or_refuses(text) -> None:
    try:
        parse(text)
    except ParseError as e:
        assert isinstance(e.line, int) and e.line >= 1, e
        assert isinstance(e.column, int) and e.column >= 1, e
        assert str(e).startswith(f"line {e.line}, column {e.column}: ")
    except VerificationError:
        pass


@st.composite
def mutated(draw, texts) -> str:
    text = draw(texts)
    lines = text.split("\n")
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, max(len(lines) - 1, 0)))
        how = draw(st.sampled_from(["delete", "duplicate", "swap", "token", "char", "indent",
                                    "truncate"]))
        if how == "delete" and len(lines) > 1:
            del lines[i]
        elif how == "duplicate":
            lines.insert(i, lines[i])
        elif how == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif how == "token":
            words = lines[i].split(" ")
            w = draw(st.integers(0, len(words) - 1))
            words[w] = draw(st.sampled_from(TOKENS))
            lines[i] = " ".join(words)
        elif how == "char" and lines[i]:
            c = draw(st.integers(0, len(lines[i]) - 1))
            new = draw(st.characters(codec="utf-8") | st.sampled_from(list("()[],=:%+-*/ 0129")))
            lines[i] = lines[i][:c] + new + lines[i][c + draw(st.integers(0, 1)):]
        elif how == "indent":
            lines[i] = " " * draw(st.integers(0, 8)) + lines[i].lstrip(" ")
        elif how == "truncate":
            lines[i] = lines[i][:draw(st.integers(0, len(lines[i])))]
    return "\n".join(lines)


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes(data):
    parses_or_refuses(data.decode("utf-8", errors="replace"))
    parses_or_refuses(data.decode("latin-1"))


@FUZZ
@given(st.text(max_size=400))
def test_random_text(text):
    parses_or_refuses(text)


@FUZZ
@given(st.lists(st.sampled_from(TOKENS[:-3] + ["\n", "  ", "\n  ", "\n    "]), max_size=60)
       .flatmap(lambda ws: st.sampled_from([" ", ""]).map(lambda sep: sep.join(ws)))
       .map(lambda s: "%HostIr {\n  numberOfStreams = 1\n  inputs:\n" + s + "\n} // %HostIr\n"))
def test_random_token_soup_inside_a_program(text):
    parses_or_refuses(text)


@FUZZ
@given(mutated(st.sampled_from(VALID)))
def test_mutated_lowered_programs(text):
    parses_or_refuses(text)


@FUZZ
@given(mutated(programs().map(print_program)))
def test_mutated_generated_programs(text):
    parses_or_refuses(text)


@pytest.mark.parametrize("text", [
    "%HostIr {\n  numberOfStreams = 99999999999999999999999\n  inputs:\n  outputs:\n} // %HostIr",
    "%HostIr {\n  numberOfStreams = -1\n  inputs:\n  outputs:\n} // %HostIr",
    "%HostIr {\n  numberOfStreams = 1\n  inputs:\n    T0 : float32[0]\n  outputs: T0\n} // %HostIr",
    "%HostIr {\n  numberOfStreams = 1\n  inputs:\n    T0 : float32[-3]\n  outputs: T0\n} // %HostIr",
    "\x00", "%HostIr {\r\n} // %HostIr", "%HostIr {\n} // %HostIr\n\n",
])
def test_edge_cases(text):
    parses_or_refuses(text)


_LOWERED = VALID[1]


@pytest.mark.parametrize("text,message", [
    (_LOWERED.replace("index=i)", "index=" + "(" * 5000 + "i" + ")" * 5000 + ")", 1),
     "nested too deep"),
    (_LOWERED.replace("index=i)", "index=" + "+".join(["i"] * 20000) + ")", 1),
     "index expression too long"),
    (_LOWERED.replace("numberOfStreams = 2", "numberOfStreams = " + "- " * 5000 + "2"),
     "expected an integer"),
    ("%HostIr {\n  numberOfStreams = 1\n  inputs:\n  outputs:\n"
     + "\n".join("  " * (d + 1) + f"FOR j{d} in range(0, 1):" for d in range(400))
     + "\n" + "  " * 401 + "GetCurrentStream into Stream s9\n} // %HostIr\n",
     "FOR nested too deep"),
])
def test_hostile_nesting_is_a_parse_error_not_a_recursion_error(text, message):
    # Each of these raised RecursionError before the parser bounded its nesting.
    with pytest.raises(ParseError, match=message):
        parse(text)


# --------------------------------------------------------------------------- bounds and time

def _program(body: str, inputs: str = "    T0 : float32[4, 8]\n", streams: str = "1") -> str:
    return ("%HostIr {\n  numberOfStreams = " + streams + "\n  inputs:\n" + inputs
            + "  outputs: T1\n  T1 = ALLOCATE(float32[4, 8])\n" + body + "} // %HostIr\n")


def _team(n: int) -> str:
    return ", ".join(map(str, range(n)))


@pytest.mark.parametrize("text,line,message", [
    # 5000 digits: Python's int() would raise a bare ValueError past 4300
    (_program("  T2 = ALLOCATE(float32[" + "7" * 5000 + "])\n"), 7, "int literal too long"),
    (_program("", streams="9" * 5000), 2, "int literal too long"),
    (_program("", inputs="    T0 : float32[" + "1" * 19 + "]\n"), 4, "int literal too long"),
    (_program("  T2 = ALLOCATE(float32[1099511627777])\n"), 7, "extent 1099511627777 out of range"),
    (_program("", inputs="    T0 : float32[Stream(5000), 8]\n"), 4, "stage count 5000 out of range"),
    (_program("", inputs="    T0 : float32[DIDx(70000), 8] mesh=[0]\n"), 4,
     "device count 70000 out of range"),
    (_program("", inputs="    T0 : float32[DIDx(2), 8] mesh=[" + _team(70000) + "]\n"), 4,
     "mesh too long"),
    (_program("", streams="2000"), 2, "numberOfStreams 2000 out of range"),
    (_program("", streams="0"), 2, "numberOfStreams 0 out of range"),
    (_program("  C0 = Communication(Allreduce, team=[" + _team(70000) + "], in=T0, out=T1, "
              "op=sum)\n  Wait C0\n"), 7, "team too long"),
    (_program("  FOR i in range(0, 2000000):\n    Wait C0\n"), 7, "iterations"),
    (_program("  T2 = ALLOCATE(float32[" + ", ".join(["1"] * 17) + "])\n"), 7, "too many axes"),
    (_program("  " + "x" * 300 + " = add(T1, T1)\n"), 7, "name literal too long"),
    (_program("  FOR i in range(0, 2):\n    T2 = select(T1, axis=0, index=i * 1.5)\n"), 8,
     "expected a name"),  # a float is no index
])
def test_sizes_and_counts_are_bounded(text, line, message):
    with pytest.raises(ParseError) as e:
        parse(text)
    assert e.value.line == line, str(e.value)[:200]
    assert e.value.column >= 1
    assert message in str(e.value), str(e.value)[:200]


def test_a_team_at_the_bound_parses():
    q = parse(_program("  C0 = Communication(Allreduce, team=[" + _team(65536) + "], in=T0, "
                       "out=T1, op=sum)\n  Wait C0\n"))
    assert len(q.body[1].team) == 65536


_MEGABYTE_LINES = {
    "a team of 150k members": "  C0 = Communication(Allreduce, team=[" + _team(150_000)
                              + "], in=T0, out=T1, op=sum)\n  Wait C0\n",
    "a team of 65536 members, valid": "  C0 = Communication(Allreduce, team=[" + _team(65536)
                                      + "], in=T0, out=T1, op=sum)\n  Wait C0\n",
    "launch args": "  LaunchKernel k(" + "T0, " * 250_000 + "T0) grid=(1, 1, 1) block=(1, 1, 1)"
                   " smem=0\n",
    "garbage after a statement": "  Wait C0 " + "T0 , " * 200_000 + "\n",
    "a long index expression": "  FOR i in range(0, 2):\n    T2 = select(T1, axis=0, index="
                               + "i + " * 250_000 + "1)\n",
    "a million digits": "  T2 = ALLOCATE(float32[" + "9" * 1_000_000 + "])\n",
    "a million spaces": "  Wait" + " " * 1_000_000 + "C0 x\n",
    "a nested line": "  FOR i in range(0, 2):\n    T2 = select(T1, axis=0, index="
                     + "(" * 500_000 + "\n",
}


@pytest.mark.parametrize("what", sorted(_MEGABYTE_LINES))
def test_a_megabyte_line_parses_or_fails_within_a_second(what):
    import time

    text = _program(_MEGABYTE_LINES[what])
    assert len(text) > 400_000
    start = time.perf_counter()
    try:
        parse(text)
    except ParseError as e:
        assert e.line >= 1 and e.column >= 1
    except VerificationError:
        pass
    assert time.perf_counter() - start < 1.0, what
