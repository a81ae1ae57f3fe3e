"""The kernels' fixed C text comes from templates/*.c: filled completely, and a missing value is an error."""

import re

import numpy as np
import pytest

from sparta_explore.kernels.bsr_codegen import TileConfig, generate_source
from sparta_explore.kernels.c_templates import TEMPLATES, c_fill, c_text
from sparta_explore.kernels.groups import plan_groups
from sparta_explore.kernels.int8_codegen import generate_int8_source, prepare_groups
from sparta_explore.kernels.vnni_codegen import DOT_MODES


def test_every_template_is_c_with_only_named_placeholders():
    files = sorted(TEMPLATES.glob("*.c"))
    assert len(files) >= 10
    for f in files:
        text = c_text(f.name)
        assert "$" not in re.sub(r"\$\{[a-z_]+\}", "", text), f.name  # no stray $ that Template would eat


def test_missing_value_raises():
    with pytest.raises(KeyError):
        c_fill("fp32_driver.c", name="k")  # body not given


def test_generated_sources_have_no_placeholders_left():
    kept = np.random.default_rng(0).random((70, 100)) < 0.4
    # an fp32 linear with its pattern as data reads its shape from the pattern too; int8 kernels bake it
    sources = [(generate_source(plan_groups(kept, 1, TileConfig().rows), 70, 100, 8, "gelu", "k", TileConfig(),
                                as_data=as_data).text, "(P->K_IN)" if as_data else "100L") for as_data in (False, True)]
    for dot in (None, *DOT_MODES.values()):
        groups, variant = prepare_groups(kept, 1, 8, 8, dot)
        sources += [(generate_int8_source(groups, 70, 100, "relu", "k8", 8, 8, variant, dot, emulate=True,
                                          as_data=as_data).text, "100L") for as_data in (False, True)]
    for src, k_in in sources:
        assert "${" not in src and "void k" in src and f"#define K_IN {k_in}" in src
