import pytest

from hostir.options import Options


def test_options_parse_the_environment(tmp_path):
    o = Options.from_environ({"HOSTIR_DUMP": "host_ir, lowering", "HOSTIR_ENABLE": "check_zeroed",
                              "HOSTIR_CACHE_DIR": str(tmp_path), "HOSTIR_COMM_TIMEOUT": "12"})
    assert o.dump("host_ir") and o.dump("lowering") and not o.dump("ptxas")
    assert o.enable("check_zeroed")
    assert o.cache_dir == tmp_path and o.comm_timeout_s == 12.0


def test_unknown_options_are_refused():
    with pytest.raises(ValueError, match="HOSTIR_DUMP: unknown option"):
        Options.from_environ({"HOSTIR_DUMP": "host_irr"})


def test_default_cache_dir_is_a_path():
    o = Options.from_environ({})
    assert str(o.cache_dir).endswith("hostir") and o.cache_dir.parent.name == ".cache"
