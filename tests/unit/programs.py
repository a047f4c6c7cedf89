"""Programs for the unit tests: the lowering's, and random ones for Hypothesis."""

from __future__ import annotations

from hypothesis import strategies as st

from hostir import ir
from lowering.patterns import allgather_matmul
from lowering.pipeline import lower


def lowered(m=64, k=32, n=16, stages=2, world=2, streams=2, dtype="float32") -> ir.Program:
    return lower(allgather_matmul(m, k, n, stages, world, dtype), world, streams)


@st.composite
def programs(draw) -> ir.Program:
    """Random well-formed programs: allocations, selects, collectives with their waits,
    matmuls (with or without a GELU epilogue), adds, kernel launches and FOR loops over worker streams."""
    d = draw(st.integers(1, 4))
    team = tuple(range(d))
    dtype = draw(st.sampled_from(["float32", "bfloat16", "float16"]))
    counter = iter(range(10_000))
    name = lambda p="T": f"{p}{next(counter)}"  # noqa: E731
    mesh = ir.DeviceMesh(team)
    k, n = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    stages, m = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    a = ir.Tensor(name(), (stages, d, m, k), dtype,
                  (ir.ParallelType.Stream, ir.ParallelType.DIDx, ir.ParallelType.Serial,
                   ir.ParallelType.Serial), mesh)
    b = ir.Tensor(name(), (k, n), dtype)
    user = ir.StreamValue(name("s"))
    body: list = [ir.GetCurrentStream(user)]
    tensors = [b]
    outputs = []
    extra_inputs: list = []
    for _ in range(draw(st.integers(0, 3))):
        t = ir.Tensor(name(), tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))), dtype)
        body.append(ir.Allocate(t))
        tensors.append(t)
        if draw(st.booleans()):
            outputs.append(t)
    g = ir.Tensor(name(), (stages, d, m, k), dtype)
    c = ir.Tensor(name(), (stages, d, m, n), dtype)
    body += [ir.Allocate(g), ir.Allocate(c)]
    outputs.append(c)
    idx = ir.IndexVar(name("i"))
    worker = ir.PoolStream(draw(st.sampled_from([
        ir.BinOp("%", ir.Var(idx.name), ir.Var("numberOfStreams")),
        ir.BinOp("%", ir.BinOp("+", ir.Var(idx.name), ir.Const(1)), ir.Var("numberOfStreams")),
    ])))
    a_i, g_i, c_i = (ir.select_type(name(), t, 0) for t in (a, g, c))
    h = ir.CommHandle(name("C"))
    loop: list = [ir.SetCurrentStream(worker), ir.Synchronize(user),
                  ir.Select(a_i, a, 0, idx.name), ir.Select(g_i, g, 0, idx.name)]
    kind = draw(st.sampled_from(["Allgather", "SendRecv", "Allreduce"]))
    if kind == "Allgather":
        loop.append(ir.Communication(h, ir.CommunicationType.Allgather, team, a_i, g_i))
    else:
        row = ir.select_type(name(), g_i, 0)
        loop.append(ir.Select(row, g_i, 0, ir.BinOp("%", ir.Var("rank"), ir.Var("worldSize"))))
        if kind == "SendRecv":
            peer = ir.BinOp("%", ir.BinOp("+", ir.Var("rank"), ir.Const(1)), ir.Var("worldSize"))
            back = ir.BinOp("%", ir.BinOp("-", ir.Var("rank"), ir.Const(1)), ir.Var("worldSize"))
            loop.append(ir.Communication(h, ir.CommunicationType.SendRecv, team, row, row,
                                         send_peer=peer, recv_peer=back))
        else:
            loop.append(ir.Communication(h, ir.CommunicationType.Allreduce, team, row, row,
                                         reduce_op=draw(st.sampled_from(ir.REDUCE_OPS))))
    loop.append(ir.Wait(h))
    loop.append(ir.Select(c_i, c, 0, idx.name))
    epilogue = draw(st.sampled_from([None, "gelu_aux", "dgelu"]))
    if epilogue is None:
        loop.append(ir.Matmul(c_i, g_i, b))
    else:  # the pre-activation: written (an allocation) or read (an input)
        pre = ir.Tensor(name(), c.shape, dtype)
        if epilogue == "gelu_aux":
            body.insert(1, ir.Allocate(pre))
            if draw(st.booleans()):
                outputs.append(pre)
        else:
            extra_inputs.append(pre)
        pre_i = ir.select_type(name(), pre, 0)
        loop += [ir.Select(pre_i, pre, 0, idx.name), ir.Matmul(c_i, g_i, b, epilogue, pre_i)]
    if draw(st.booleans()):  # an accumulate: in place, or into another allocation
        into = draw(st.sampled_from([c_i] + [t for t in tensors if t.shape == c_i.shape]))
        loop.append(ir.Add(into, c_i, draw(st.sampled_from([c_i, into]))))
    kernels = ()
    if draw(st.booleans()):
        kernels = (ir.KernelDef("epilogue", "pointwise", (
            ("scale", draw(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False))),
            ("bias", draw(st.booleans())), ("dtype", dtype), ("tile", draw(st.integers(-9, 9))),
            ("expr", draw(st.text(alphabet="ab +*:|.", max_size=8))))),)
        loop.append(ir.LaunchKernel("epilogue", (c_i,), (draw(st.integers(1, 9)), 1, 1),
                                    (128, 1, 1), draw(st.integers(0, 4096)),
                                    tuple(draw(st.lists(st.integers(-5, 5), max_size=2)))))
    loop += [ir.SetCurrentStream(user), ir.Synchronize(worker)]
    body.append(ir.ForLoop(idx, 0, stages, tuple(loop)))
    return ir.Program((a, b, *extra_inputs), tuple(outputs), tuple(body), draw(st.integers(1, 4)),
                      kernels=kernels)
