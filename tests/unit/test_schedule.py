import json

from hostir.options import Options, set_options
from lowering.schedule import Schedule, choose_schedule
from runtime import schedule_tuning


def test_heuristic():
    assert choose_schedule(8192, 8192, 8192, 2, "cuda") == Schedule("ring", 2, 2, "copy_engine")
    assert choose_schedule(4096, 8192, 28672, 2, "cuda").stages == 1
    assert choose_schedule(32768, 32768, 8192, 2, "cuda").stages == 4
    assert choose_schedule(32768, 8192, 4096, 2, "cuda") == Schedule("ring", 4, 2, "copy_engine")
    assert choose_schedule(32768 + 4, 8, 4096, 2, "cuda").stages == 2   # 4 would not divide
    assert choose_schedule(16384, 8192, 8192, 2, "cuda").stages == 4
    assert choose_schedule(1024, 64, 64, 2, "cpu").schedule == "pipelined"
    assert choose_schedule(1024, 64, 64, 1, "cuda").schedule == "pipelined"


def test_a_stored_choice_overrides_the_heuristic(tmp_path):
    set_options(Options(cache_dir=tmp_path))
    try:
        assert schedule_tuning.choose(64, 8, 8, 2, "cpu", "float32").schedule == "pipelined"
        schedule_tuning.store(64, 8, 8, 2, "cpu", "float32", Schedule("ring", 4, 3, "mpi"), 12.5)
        assert schedule_tuning.choose(64, 8, 8, 2, "cpu", "float32") == Schedule("ring", 4, 3, "mpi")
        assert schedule_tuning.choose(64, 8, 16, 2, "cpu", "float32").schedule == "pipelined"
        data = json.loads((tmp_path / schedule_tuning.FILE).read_text())
        assert list(data.values())[0]["us"] == 12.5
        (tmp_path / schedule_tuning.FILE).write_text("{not json")   # a broken file is ignored
        assert schedule_tuning.choose(64, 8, 8, 2, "cpu", "float32").schedule == "pipelined"
    finally:
        set_options(None)
