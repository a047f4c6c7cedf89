import pytest

from hostir import ir
from hostir.errors import LoweringError
from hostir.options import Options, set_options
from lowering.fusion import DeviceMesh, Fusion, ParallelType as P
from lowering.patterns import allgather_matmul
from lowering.pipeline import lower


def test_structure_of_the_pipelined_program():
    p = lower(allgather_matmul(256, 32, 16, stages=4, world_size=2, dtype="bfloat16"), 2, 3)
    assert p.number_of_streams == 3
    assert isinstance(p.body[0], ir.GetCurrentStream)
    waits, loop = p.body[-2], p.body[-1]
    # each of the 3 workers waits on the user's stream once, before the stages
    assert isinstance(waits, ir.ForLoop) and (waits.start, waits.stop) == (0, 3)
    assert [type(s).__name__ for s in waits.body] == ["SetCurrentStream", "Synchronize"]
    assert isinstance(loop, ir.ForLoop) and (loop.start, loop.stop) == (0, 4)
    kinds = [type(s).__name__ for s in loop.body]
    assert kinds == ["SetCurrentStream", "Select", "Select", "Communication",
                     "Wait", "Select", "Matmul", "SetCurrentStream", "Synchronize"]
    assert not any(isinstance(s, ir.Synchronize) and isinstance(s.stream, ir.StreamValue)
                   for s in loop.body), "a stage must not wait on the user's stream"
    comm = loop.body[3]
    assert comm.type is ir.CommunicationType.Allgather and comm.team == (0, 1)
    assert comm.input.local_shape == (1, 32, 32) and comm.output.local_shape == (2, 32, 32)
    assert p.outputs[0].shape == (4, 2, 32, 16)
    assert p.provenance == "assign_streams"


def test_one_stage_without_stream_axis():
    fd = Fusion()
    a = fd.define_tensor([64, 8])
    b = fd.define_tensor([8, 4])
    a.split(0, 2).set_mesh(DeviceMesh((0, 1))).parallelize(0, P.DIDx)
    c = fd.matmul(a, b)
    fd.add_output(c)
    p = lower(fd, 2, 1)
    assert not any(isinstance(s, ir.ForLoop) for s in p.body)
    assert sum(isinstance(s, ir.Communication) for s in ir.walk(p.body)) == 1


def test_dump_lowering_prints_after_each_pass(capsys):
    set_options(Options(dumps=frozenset({"lowering"})))
    try:
        lower(allgather_matmul(64, 8, 8, 2, 2), 2, 2)
    finally:
        set_options(None)
    out = capsys.readouterr().out
    assert "// after pass lower_communication" in out and "// after pass assign_streams" in out
    assert out.count("%HostIr {") == 2


def _sharded(m=64, k=8, n=4, stages=2, world=2):
    fd = Fusion()
    a = fd.define_tensor([m, k])
    b = fd.define_tensor([k, n])
    return fd, a, b


def test_refuses_shapes_that_do_not_divide():
    with pytest.raises(LoweringError, match=r"T0 \(A\) axis 0: extent M=100 is not divisible by stages\*devices = 4\*2"):
        allgather_matmul(100, 8, 8, stages=4, world_size=2)
    fd, a, _ = _sharded()
    with pytest.raises(LoweringError, match="tensor T0 axis 0: extent 64 is not divisible by the split factor 3"):
        a.split(0, 3)


def test_refuses_a_sharded_k():
    fd, a, b = _sharded()
    a.split(0, 2).set_mesh(DeviceMesh((0, 1))).parallelize(0, P.DIDx)
    b.split(0, 2)  # [2, 4, 4]: K sharded -> not even rank 2 any more
    with pytest.raises(LoweringError):
        fd.matmul(a, b)
    fd, a, b = _sharded(k=2)
    a.split(0, 2).set_mesh(DeviceMesh((0, 1))).parallelize(0, P.DIDx)
    b.set_mesh(DeviceMesh((0, 1))).parallelize(0, P.DIDx)
    fd.add_output(fd.matmul(a, b))
    with pytest.raises(LoweringError, match=r"tensor T1 axis 0 \(K, the contraction axis\) is DIDx"):
        lower(fd, 2)
    fd, a, b = _sharded(k=2)
    a.set_mesh(DeviceMesh((0, 1))).parallelize(1, P.DIDx)
    fd.add_output(fd.matmul(a, b))
    with pytest.raises(LoweringError, match=r"tensor T0 axis 1 \(K, the contraction axis\) is DIDx"):
        lower(fd, 2)


def test_refuses_a_mesh_that_does_not_match_the_world():
    fd = allgather_matmul(64, 8, 8, 2, 2)
    with pytest.raises(LoweringError, match=r"device mesh \[0, 1\] does not match the world of 4 ranks"):
        lower(fd, 4)


def test_refuses_an_unsupported_pattern():
    fd, a, b = _sharded()
    a.split(0, 2).split(1, 2).set_mesh(DeviceMesh((0, 1)))
    a.parallelize(0, P.DIDx).parallelize(1, P.Stream)  # DIDx outside Stream
    fd.add_output(fd.matmul(a, b))
    with pytest.raises(LoweringError, match="not a supported pattern"):
        lower(fd, 2)


def test_refuses_an_output_without_its_stream_axis():
    fd, a, b = _sharded()
    a.split(0, 2).split(1, 2).set_mesh(DeviceMesh((0, 1)))
    a.parallelize(0, P.Stream).parallelize(1, P.DIDx)
    fd.add_output(fd.matmul(a, b))
    with pytest.raises(LoweringError, match=r"tensor T2 axis 0 \(the stage axis\) is Serial; expected Stream"):
        lower(fd, 2)


def test_refuses_a_missing_mesh_and_other_fusions():
    fd, a, b = _sharded()
    a.split(0, 2).parallelize(0, P.DIDx)
    fd.add_output(fd.matmul(a, b))
    with pytest.raises(LoweringError, match="no device mesh"):
        lower(fd, 2)
    fd, a, b = _sharded()
    with pytest.raises(LoweringError, match="no lowering for them"):
        lower(fd, 2)


def test_refuses_mismatched_matmul_operands():
    fd, a, b = _sharded()
    c = fd.define_tensor([5, 4])
    with pytest.raises(LoweringError, match="K\\) has extent 8 but T2 axis 0 has 5"):
        fd.matmul(a, c)
