"""Registry: forgiving lookups, clear errors, no silent re-registration."""

import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.registry import Registry


def test_lookup_forgives_case_separators_and_suffix():
    r = Registry[str]("quantizer", suffix="quantizer")
    r.add("dorefa", "d")
    assert r.get("DoReFaQuantizer") == r.get("do-re_fa") == "d"
    assert "DOREFA" in r and "bnn" not in r


def test_unknown_and_duplicate_names_are_config_errors():
    r = Registry[int]("model")
    r.add("digits-cnn", 1)
    with pytest.raises(ConfigError, match="unknown model 'vgg'; choose one of digits-cnn"):
        r.get("vgg")
    with pytest.raises(ConfigError, match="already registered"):
        r.add("digits-cnn", 2)
    assert r.get("digits-cnn") == 1 and r.names() == ["digits-cnn"]
