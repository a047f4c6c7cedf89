import dataclasses

import pytest

from hostir import ir
from hostir.errors import VerificationError

P = ir.ParallelType
MESH = ir.DeviceMesh((0, 1))


def t(name, shape, dtype="float32", par=(), mesh=None):
    return ir.Tensor(name, shape, dtype, par, mesh)


def test_statements_are_frozen_and_slotted():
    a = t("T0", (2, 3))
    s = ir.Allocate(a)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.out = a
    assert not hasattr(s, "__dict__")


@pytest.mark.parametrize("make,message", [
    (lambda: t("0bad", (1,)), "invalid name"),
    (lambda: t("rank", (1,)), "reserved"),
    (lambda: t("T0", (0, 2)), "positive ints"),
    (lambda: t("T0", (2,), "float8"), "dtype"),
    (lambda: t("T0", (2, 2), par=(P.DIDx,)), "1 parallel types for 2 axes"),
    (lambda: t("T0", (2, 2), par=(P.DIDx, P.Serial)), "no mesh"),
    (lambda: t("T0", (3, 2), par=(P.DIDx, P.Serial), mesh=MESH), "expected the mesh size 2"),
    (lambda: t("T0", (2, 2), par=(P.DIDx, P.DIDx), mesh=MESH), "at most one"),
    (lambda: ir.DeviceMesh((0, 0)), "repeat"),
    (lambda: ir.Allocate(t("T0", (2, 2), par=(P.DIDx, P.Serial), mesh=MESH)), "local"),
    (lambda: ir.Select(t("T1", (3,)), t("T0", (2, 3)), 1, 0), "without axis 1"),
    (lambda: ir.Select(t("T1", (3,)), t("T0", (2, 3)), 2, 0), "out of range"),
    (lambda: ir.Matmul(t("T2", (4, 5)), t("T0", (4, 3)), t("T1", (2, 5))), "contraction extents differ"),
    (lambda: ir.Matmul(t("T2", (4, 6)), t("T0", (4, 3)), t("T1", (3, 5))), "expected out [4, 5]"),
    (lambda: ir.Matmul(t("T2", (4, 5)), t("T0", (4, 3)), t("T1", (3, 5), "float16")), "dtypes differ"),
    (lambda: ir.Communication(ir.CommHandle("C0"), ir.CommunicationType.Allgather, (0, 1),
                              t("T0", (1, 4)), t("T1", (3, 4))), "expected out [2, 4]"),
    (lambda: ir.Communication(ir.CommHandle("C0"), ir.CommunicationType.ReduceScatter, (0, 1),
                              t("T0", (3, 4)), t("T1", (1, 4))), "not divisible"),
    (lambda: ir.Communication(ir.CommHandle("C0"), ir.CommunicationType.SendRecv, (0, 1),
                              t("T0", (3, 4)), t("T1", (3, 4))), "needs send_peer"),
    (lambda: ir.Communication(ir.CommHandle("C0"), ir.CommunicationType.Broadcast, (0, 1),
                              t("T0", (3, 4)), t("T1", (3, 4)), root=5), "root 5"),
    (lambda: ir.Communication(ir.CommHandle("C0"), ir.CommunicationType.Allreduce, (0, 1),
                              t("T0", (3, 4)), t("T1", (3, 4)), reduce_op="avg"), "reduce op"),
    (lambda: ir.Add(t("T2", (4, 5)), t("T0", (4, 5)), t("T1", (5, 4))), "expected equal shapes"),
    (lambda: ir.Add(t("T2", (4, 5)), t("T0", (4, 5)), t("T1", (4, 5), "bfloat16")), "dtypes differ"),
    (lambda: ir.Add(t("T2", (4, 5)), t("T0", (4, 5)), "T1"), "b must be a Tensor"),
    (lambda: ir.LaunchKernel("k", (), (1, 1, 1), (2048, 1, 1)), "more than 1024"),
    (lambda: ir.LaunchKernel("k", (), (0, 1, 1), (32, 1, 1)), "positive"),
    (lambda: ir.ForLoop(ir.IndexVar("i"), 3, 1, ()), "empty range"),
    (lambda: ir.BinOp("**", ir.Const(1), ir.Const(2)), "unknown operator"),
    (lambda: ir.Program((), (), (), 0), "numberOfStreams"),
])
def test_construction_checks(make, message):
    with pytest.raises(VerificationError, match=None) as e:
        make()
    assert message in str(e.value)


def test_local_shape_of_a_sharded_tensor():
    a = t("T0", (4, 2, 8, 16), par=(P.Stream, P.DIDx, P.Serial, P.Serial), mesh=MESH)
    assert a.local_shape == (4, 1, 8, 16)
    assert ir.select_type("T1", a, 0).local_shape == (1, 8, 16)


@pytest.mark.parametrize("expr,env,value", [
    (ir.BinOp("%", ir.Var("i"), ir.Var("numberOfStreams")), {"i": 5, "numberOfStreams": 3}, 2),
    (ir.BinOp("%", ir.BinOp("-", ir.Var("rank"), ir.Const(1)), ir.Const(4)), {"rank": 0}, 3),
    (ir.BinOp("//", ir.Const(7), ir.Const(2)), {}, 3),
    (ir.BinOp("*", ir.Const(7), ir.Var("i")), {"i": 3}, 21),
])
def test_index_expressions(expr, env, value):
    assert ir.evaluate(expr, env) == value
    assert ir.compile_index(expr)(env) == value


def _exprs():
    from hypothesis import strategies as st

    leaves = st.one_of(st.integers(-20, 20).map(ir.Const),
                       st.sampled_from(["i", "j", "rank", "worldSize"]).map(ir.Var))
    return st.recursive(leaves, lambda sub: st.builds(
        ir.BinOp, st.sampled_from(ir.BINARY_OPS), sub, sub), max_leaves=12)


def test_compiled_index_expressions_equal_the_evaluator():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=300, deadline=None)
    @given(_exprs(), st.fixed_dictionaries({n: st.integers(-9, 9) for n in
                                            ("i", "j", "rank", "worldSize")}))
    def check(expr, env):
        try:
            want = ir.evaluate(expr, env)
        except ZeroDivisionError:
            with pytest.raises(ZeroDivisionError):
                ir.compile_index(expr)(env)
            return
        assert ir.compile_index(expr)(env) == want

    check()


def test_a_communication_without_a_root_takes_its_teams_first_rank():
    a, b = t("T0", (4, 8)), t("T1", (4, 8))
    c = ir.Communication(ir.CommHandle("C0"), ir.CommunicationType.Allreduce, (3, 1), a, b)
    assert c.root == 3
    with pytest.raises(VerificationError, match="root 0 is not in team"):
        ir.Communication(ir.CommHandle("C0"), ir.CommunicationType.Broadcast, (3, 1), a, b, root=0)


def test_select_from_text_derives_the_selected_type():
    src = t("T0", (2, 3, 4))
    s = ir.Select.from_text("T1", src, 1, "rank")
    assert s.out == t("T1", (2, 4)) and s.index == ir.Var("rank")
    with pytest.raises(VerificationError, match="axis 3 out of range for T0 of rank 3"):
        ir.Select.from_text("T1", src, 3, 0)
