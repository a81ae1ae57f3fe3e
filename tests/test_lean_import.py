"""`import sparta_explore` stays lean: no NNI, no scikit-learn, no compiler."""

import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_import_does_not_load_nni_or_heavy_modules():
    loaded = _modules_after("import sparta_explore")
    assert not {m for m in loaded if m == "nni" or m.startswith("nni.")}
    assert "sklearn" not in loaded and "matplotlib" not in loaded
    assert "sparta_explore.pruners" not in loaded and "sparta_explore.kernels" not in loaded


def test_core_api_is_usable_without_nni():
    loaded = _modules_after("import torch, sparta_explore as se\n"
                            "g = se.capture(torch.nn.Linear(3, 2), torch.zeros(1, 3))\n"
                            "t = se.TeSATable.dense_for(g.shapes())\nt.summary()")
    assert "nni" not in loaded


def test_pruners_are_reachable_lazily():
    loaded = _modules_after("import sparta_explore as se\nassert 'block' in se.pruners.pruner_names()")
    assert "nni" in loaded  # the adapters, and only they, bring NNI in
