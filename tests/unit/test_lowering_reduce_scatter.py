"""The GEMM + ReduceScatter lowering: structure, golden text, round trip, refusals."""

import pytest

from hostir import ir
from hostir.errors import LoweringError
from hostir.options import Options, set_options
from hostir.parser import parse
from hostir.printer import print_program
from lowering.fusion import DeviceMesh, Fusion, ParallelType as P
from lowering.patterns import is_reduce_scatter, matmul_reduce_scatter, stage_rows
from lowering.pipeline import lower

GOLDEN = """\
%HostIr {
  numberOfStreams = 2
  inputs:
    T0 : bfloat16[Stream(2), 32, DIDx(2), 16] mesh=[0, 1]
    T1 : bfloat16[DIDx(2), 16, 8] mesh=[0, 1]
  outputs: T2
  GetCurrentStream into Stream s0
  T3 = select(T1, axis=0, index=0)
  T4 = ALLOCATE(bfloat16[2, 32, 8])
  T2 = ALLOCATE(bfloat16[2, 16, 8])
  FOR k in range(0, 2):
    SetCurrentStream to Stream (k)
    Synchronize Stream s0
  FOR i in range(0, 2):
    SetCurrentStream to Stream (i % numberOfStreams)
    T5 = select(T0, axis=0, index=i)
    T6 = select(T5, axis=1, index=0)
    T7 = select(T4, axis=0, index=i)
    T7 = matmul(T6, T3)
    T8 = select(T2, axis=0, index=i)
    C0 = Communication(ReduceScatter, team=[0, 1], in=T7, out=T8, op=sum)
    Wait C0
    SetCurrentStream to Stream s0
    Synchronize Stream (i % numberOfStreams)
} // %HostIr
"""


def test_golden_program():
    p = lower(matmul_reduce_scatter(64, 32, 8, stages=2, world_size=2, dtype="bfloat16"), 2, 2)
    assert print_program(p) == GOLDEN


def test_structure_of_the_pipelined_program():
    p = lower(matmul_reduce_scatter(256, 32, 16, stages=4, world_size=2), 2, 3)
    assert p.number_of_streams == 3 and p.provenance == "assign_streams"
    assert isinstance(p.body[0], ir.GetCurrentStream)
    loop = p.body[-1]
    assert isinstance(loop, ir.ForLoop) and (loop.start, loop.stop) == (0, 4)
    kinds = [type(s).__name__ for s in loop.body]
    assert kinds == ["SetCurrentStream", "Select", "Select", "Select", "Matmul",
                     "Select", "Communication", "Wait", "SetCurrentStream", "Synchronize"]
    mm, comm = loop.body[4], loop.body[6]
    # the partial GEMM of a stage: M/S rows, this rank's K/D, all N
    assert mm.a.local_shape == (64, 16) and mm.b.local_shape == (16, 16)
    assert comm.type is ir.CommunicationType.ReduceScatter and comm.reduce_op == "sum"
    assert comm.input is mm.out and comm.input.local_shape == (64, 16)
    assert comm.output.local_shape == (32, 16) and comm.team == (0, 1)
    assert [t.local_shape for t in p.inputs] == [(4, 64, 1, 16), (1, 16, 16)]
    assert p.outputs[0].shape == (4, 32, 16)  # this rank's rows of every stage


def test_one_stage_without_stream_axis():
    fd = Fusion()
    a, b = fd.define_tensor([64, 8]), fd.define_tensor([8, 4])
    c = fd.matmul(a, b)
    mesh = DeviceMesh((0, 1))
    a.split(1, 2).set_mesh(mesh).parallelize(1, P.DIDx)
    b.split(0, 2).set_mesh(mesh).parallelize(0, P.DIDx)
    c.split(0, 2).set_mesh(mesh).parallelize(0, P.DIDx)
    fd.add_output(c)
    p = lower(fd, 2, 1)
    assert not any(isinstance(s, ir.ForLoop) for s in p.body)
    comms = [s for s in ir.walk(p.body) if isinstance(s, ir.Communication)]
    assert len(comms) == 1 and comms[0].type is ir.CommunicationType.ReduceScatter
    assert p.outputs[0].shape == (1, 32, 4)
    assert print_program(parse(print_program(p))) == print_program(p)


@pytest.mark.parametrize("stages,world,streams", [(1, 1, 1), (1, 2, 1), (2, 2, 2), (4, 2, 3),
                                                  (2, 4, 1), (8, 8, 4)])
def test_round_trip(stages, world, streams):
    p = lower(matmul_reduce_scatter(8 * 8 * 2, 64, 16, stages, world, "float16"), world, streams)
    text = print_program(p)
    q = parse(text)
    assert print_program(q) == text
    assert q.inputs == p.inputs and q.outputs == p.outputs and q.body == p.body


def test_dispatch_and_dump(capsys):
    assert is_reduce_scatter(matmul_reduce_scatter(64, 8, 8, 2, 2))
    set_options(Options(dumps=frozenset({"lowering"})))
    try:
        lower(matmul_reduce_scatter(64, 8, 8, 2, 2), 2, 2)
    finally:
        set_options(None)
    out = capsys.readouterr().out
    assert "// after pass lower_reduce_scatter" in out and "// after pass assign_streams" in out


def test_stage_rows():
    assert stage_rows(2, 8, 2, 0).tolist() == [0, 1, 4, 5]
    assert stage_rows(1, 8, 4, 3).tolist() == [6, 7]
    assert sorted(sum((stage_rows(4, 32, 2, r).tolist() for r in range(2)), [])) == list(range(32))


# ---------------------------------------------------------------------------- the ring form

RING_GOLDEN = """\
%HostIr {
  numberOfStreams = 2
  inputs:
    T0 : bfloat16[Stream(2), 2, 16, DIDx(2), 16] mesh=[0, 1]
    T1 : bfloat16[DIDx(2), 16, 8] mesh=[0, 1]
  outputs: T2
  GetCurrentStream into Stream s0
  T3 = select(T1, axis=0, index=0)
  T9 = ALLOCATE(bfloat16[2, 2, 16, 8])
  T10 = ALLOCATE(bfloat16[2, 1, 16, 8])
  T2 = ALLOCATE(bfloat16[2, 16, 8])
  SetCurrentStream to Stream 1
  Synchronize Stream s0
  SetCurrentStream to Stream 0
  Synchronize Stream s0
  FOR i in range(0, 2):
    T11 = select(T0, axis=0, index=i)
    T12 = select(T9, axis=0, index=i)
    T13 = select(T10, axis=0, index=i)
    T14 = select(T2, axis=0, index=i)
    T15 = select(T11, axis=0, index=((rank - 1) % worldSize))
    T16 = select(T15, axis=1, index=0)
    T17 = select(T12, axis=0, index=((rank - 1) % worldSize))
    T17 = matmul(T16, T3)
    SetCurrentStream to Stream 1
    Synchronize Stream 0
    T18 = select(T12, axis=0, index=((rank - 1) % worldSize))
    T19 = select(T13, axis=0, index=0)
    C0 = Communication(SendRecv, team=[0, 1], in=T18, out=T19, send_peer=((rank + 1) % worldSize), recv_peer=((rank - 1) % worldSize))
    SetCurrentStream to Stream 0
    T20 = select(T11, axis=0, index=rank)
    T21 = select(T20, axis=1, index=0)
    T14 = matmul(T21, T3)
    Wait C0
    T14 = add(T14, T19)
  SetCurrentStream to Stream s0
  Synchronize Stream 0
  Synchronize Stream 1
} // %HostIr
"""


def test_golden_ring_program():
    p = lower(matmul_reduce_scatter(64, 32, 8, stages=2, world_size=2, dtype="bfloat16"), 2, 2,
              schedule="ring")
    assert p.provenance == "ring_reduce_scatter"
    assert print_program(p) == RING_GOLDEN
    assert print_program(parse(RING_GOLDEN)) == RING_GOLDEN


def test_structure_of_the_ring_program():
    """Four ranks: step 1 multiplies rank - 1's rows; steps 2..3 send the partial sum on,
    multiply the next rows while it travels, wait and add; the last step multiplies this
    rank's rows into the output and adds the sum of every other rank."""
    p = lower(matmul_reduce_scatter(4 * 4 * 8, 32, 16, stages=4, world_size=4), 4, 2,
              schedule="ring")
    a, b = p.inputs
    assert a.shape == (4, 4, 8, 4, 8) and a.local_shape == (4, 4, 8, 1, 8)  # [S, D, m, 1, K/D]
    assert [p_.value for p_ in a.parallel] == ["Stream", "Serial", "Serial", "DIDx", "Serial"]
    assert b.local_shape == (1, 8, 16) and p.outputs[0].shape == (4, 8, 16)
    stage = p.body[-4]
    assert isinstance(stage, ir.ForLoop) and (stage.start, stage.stop) == (0, 4)
    inner = [s for s in stage.body if isinstance(s, ir.ForLoop)]
    assert len(inner) == 1 and (inner[0].start, inner[0].stop) == (1, 3)
    kinds = [type(s).__name__ for s in inner[0].body]
    assert kinds == ["SetCurrentStream", "Synchronize", "Select", "Select", "Communication",
                     "SetCurrentStream", "Select", "Select", "Select", "Matmul", "Wait", "Add"]
    comms = [s for s in ir.walk(p.body) if isinstance(s, ir.Communication)]
    assert {c.type for c in comms} == {ir.CommunicationType.SendRecv}
    assert all(c.input.local_shape == c.output.local_shape == (8, 16) for c in comms)
    send = comms[0]
    env = {"rank": 0, "worldSize": 4, "j": 1}
    assert (ir.evaluate(send.send_peer, env), ir.evaluate(send.recv_peer, env)) == (1, 3)
    last = stage.body[-1]
    assert isinstance(last, ir.Add) and last.out.name == last.a.name
    assert last.out.local_shape == (8, 16)  # this rank's rows of the stage, in the output


@pytest.mark.parametrize("stages,world,streams", [(1, 1, 1), (1, 2, 1), (2, 2, 2), (4, 2, 3),
                                                  (2, 4, 1), (2, 3, 2), (8, 8, 4)])
def test_ring_round_trip(stages, world, streams):
    p = lower(matmul_reduce_scatter(8 * 8 * 3, 8 * 3 * 8, 16, stages, world, "float16"), world,
              streams, schedule="ring")
    text = print_program(p)
    q = parse(text)
    assert print_program(q) == text
    assert q.inputs == p.inputs and q.outputs == p.outputs and q.body == p.body


def test_ring_dump_names_the_pass(capsys):
    set_options(Options(dumps=frozenset({"lowering"})))
    try:
        lower(matmul_reduce_scatter(64, 8, 8, 2, 2), 2, 2, schedule="ring")
    finally:
        set_options(None)
    out = capsys.readouterr().out
    assert "// after pass lower_reduce_scatter" in out and "// after pass ring_reduce_scatter" in out


def test_ring_pass_refuses_other_programs():
    from lowering.passes.ring_reduce_scatter import ring_reduce_scatter
    from lowering.patterns import allgather_matmul
    from lowering.passes.lower_communication import lower_communication

    with pytest.raises(LoweringError, match="expected the program of lower_reduce_scatter"):
        ring_reduce_scatter(lower_communication(allgather_matmul(64, 8, 8, 2, 2), 2), 2)
    with pytest.raises(LoweringError, match="numberOfStreams must be a positive int"):
        ring_reduce_scatter(lower(matmul_reduce_scatter(64, 8, 8, 2, 2), 2, 2), 0)


# ---------------------------------------------------------------------------- refusals


def _fusion(m=64, k=8, n=4, world=2, stages=2):
    """The logical matmul, unsharded: each test shards it (wrongly) itself."""
    fd = Fusion()
    a, b = fd.define_tensor([m, k]), fd.define_tensor([k, n])
    c = fd.matmul(a, b)
    fd.add_output(c)
    return fd, a, b, c, DeviceMesh(tuple(range(world)))


def _good(fd, a, b, c, mesh, world=2, stages=2):
    a.split(1, world).split(0, stages).set_mesh(mesh).parallelize(0, P.Stream).parallelize(2, P.DIDx)
    b.split(0, world).set_mesh(mesh).parallelize(0, P.DIDx)
    c.split(0, stages).split(1, world).set_mesh(mesh).parallelize(0, P.Stream).parallelize(1, P.DIDx)


def test_refuses_b_not_split_on_k():
    fd, a, b, c, mesh = _fusion()
    a.split(1, 2).set_mesh(mesh).parallelize(1, P.DIDx)
    b.split(1, 2).set_mesh(mesh).parallelize(1, P.DIDx)  # N split, not K
    c.split(0, 2).set_mesh(mesh).parallelize(0, P.DIDx)
    with pytest.raises(LoweringError, match=r"tensor T1 \(B\) axis 0 is Serial, expected DIDx"):
        lower(fd, 2)


def test_refuses_a_whose_k_is_not_sharded():
    fd, a, b, c, mesh = _fusion()
    _good(fd, a, b, c, mesh)
    a.parallelize(2, P.Serial)
    with pytest.raises(LoweringError, match=r"tensor T0 \(A\) axis 2 is Serial, expected DIDx"):
        lower(fd, 2)


def test_refuses_a_replicated_output():
    fd, a, b, c, mesh = _fusion()
    _good(fd, a, b, c, mesh)
    c.parallelize(1, P.Serial)
    with pytest.raises(LoweringError, match=r"tensor T2 \(C\) axis 1 is Serial, expected DIDx"):
        lower(fd, 2)


def test_refuses_mismatched_stages():
    fd, a, b, c, mesh = _fusion(m=64)
    a.split(1, 2).split(0, 2).set_mesh(mesh).parallelize(0, P.Stream).parallelize(2, P.DIDx)
    b.split(0, 2).set_mesh(mesh).parallelize(0, P.DIDx)
    c.split(0, 4).split(1, 2).set_mesh(mesh).parallelize(0, P.Stream).parallelize(1, P.DIDx)
    with pytest.raises(LoweringError, match=r"tensor T2 axis 0 \(Stream\) has 4 stages; expected 2"):
        lower(fd, 2)


def test_refuses_an_output_stream_without_a_staged_input():
    fd, a, b, c, mesh = _fusion()
    a.split(1, 2).set_mesh(mesh).parallelize(1, P.DIDx)
    b.split(0, 2).set_mesh(mesh).parallelize(0, P.DIDx)
    c.split(0, 2).split(1, 2).set_mesh(mesh).parallelize(0, P.Stream).parallelize(1, P.DIDx)
    with pytest.raises(LoweringError, match="tensor T2 axis 0 is Stream but T0 has no Stream axis"):
        lower(fd, 2)


def test_refuses_k_split_by_other_factors():
    fd, a, b, c, mesh = _fusion(k=8)
    a.split(1, 4).split(0, 2).set_mesh(DeviceMesh((0, 1, 2, 3)))
    a.parallelize(0, P.Stream).parallelize(2, P.DIDx)
    b.split(0, 2).set_mesh(mesh).parallelize(0, P.DIDx)
    c.split(0, 2).split(1, 2).set_mesh(mesh).parallelize(0, P.Stream).parallelize(1, P.DIDx)
    with pytest.raises(LoweringError, match=r"tensor T0: device mesh \[0, 1, 2, 3\] does not match the world of 2"):
        lower(fd, 2)


def test_refuses_a_mesh_that_does_not_match_the_world():
    with pytest.raises(LoweringError, match=r"tensor T1: device mesh \[0, 1\] does not match the world of 4 ranks"):
        lower(matmul_reduce_scatter(64, 8, 8, 2, 2), 4)


def test_refuses_a_missing_mesh():
    fd, a, b, c, mesh = _fusion()
    _good(fd, a, b, c, mesh)
    b.mesh = None
    with pytest.raises(LoweringError, match="tensor T1: it has a DIDx axis but no device mesh"):
        lower(fd, 2)


def test_refuses_shapes_that_do_not_divide():
    with pytest.raises(LoweringError, match=r"T2 \(C\) axis 0: extent M=100 is not divisible by stages\*devices = 4\*2"):
        matmul_reduce_scatter(100, 8, 8, stages=4, world_size=2)
    with pytest.raises(LoweringError, match=r"T0 \(A\) axis 1: extent K=9 is not divisible by the 2 devices"):
        matmul_reduce_scatter(64, 9, 8, stages=2, world_size=2)
    fd, a, b, c, mesh = _fusion(m=6 * 2, world=4)
    a.split(1, 4)
    with pytest.raises(LoweringError, match="tensor T2 axis 0: extent 12 is not divisible by the split factor 8"):
        c.split(0, 8)


def test_refuses_an_output_sharded_on_its_inner_rows():
    fd, a, b, c, mesh = _fusion(m=64)
    a.split(1, 2).split(0, 2).set_mesh(mesh).parallelize(0, P.Stream).parallelize(2, P.DIDx)
    b.split(0, 2).set_mesh(mesh).parallelize(0, P.DIDx)
    c.split(0, 2).split(1, 16).set_mesh(mesh).parallelize(0, P.Stream).parallelize(2, P.DIDx)
    # C is [S, 16, DIDx(2), 4]: the DIDx axis is not the outer row axis of a stage
    with pytest.raises(LoweringError, match=r"tensor T2 \(C\) axis 1 is Serial, expected DIDx"):
        lower(fd, 2)


def test_refuses_b_with_an_unsplit_sharded_k():
    fd, a, b, c, mesh = _fusion(k=2)
    a.set_mesh(mesh).parallelize(1, P.DIDx)
    b.set_mesh(mesh).parallelize(0, P.DIDx)
    c.split(0, 2).set_mesh(mesh).parallelize(0, P.DIDx)
    with pytest.raises(LoweringError, match=r"tensor T1 axis 0 \(K, the contraction axis\) is DIDx without a split"):
        lower(fd, 2)
