"""A damaged, foreign or hostile package is one clear PackageError naming the file and the fault; nothing is loaded."""

import json
import zipfile

import pytest

import sparta_explore as se
from sparta_explore.compile.package.archive import MANIFEST, _sha256
from sparta_explore.errors import PackageError


@pytest.fixture
def package(fp32_model, tmp_path):
    return fp32_model[0].save(tmp_path / "good.sparta")


def _parts(path):
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def _rewrite(path, parts, out, *, fix_hashes=True):
    manifest = json.loads(parts[MANIFEST])
    if fix_hashes:
        manifest["files"] = {n: {"size": len(d), "sha256": _sha256(d)} for n, d in parts.items() if n != MANIFEST}
    parts = {**parts, MANIFEST: json.dumps(manifest).encode()}
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in parts.items():
            zf.writestr(name, data)
    return out


def _fails(path, match, cache):
    with pytest.raises(PackageError, match=match) as caught:
        se.load(path, cache_dir=cache)
    assert str(path) in str(caught.value)
    assert not list(cache.rglob("*.so")), "a damaged package must not get as far as building kernels"


def test_a_truncated_package_is_one_clear_error(package, tmp_path):
    data = package.read_bytes()
    cut = tmp_path / "cut.sparta"
    cut.write_bytes(data[: len(data) // 2])
    _fails(cut, "truncated", tmp_path / "cache")


def test_a_file_that_is_no_package_is_named(tmp_path):
    junk = tmp_path / "junk.sparta"
    junk.write_bytes(b"not a zip at all" * 10)
    _fails(junk, "not a sparta-explore package", tmp_path / "cache")
    with pytest.raises(PackageError, match="no such file"):
        se.load(tmp_path / "missing.sparta")


def test_another_format_version_says_which(package, tmp_path):
    parts = _parts(package)
    manifest = json.loads(parts[MANIFEST])
    manifest["format_version"] = 99
    parts[MANIFEST] = json.dumps(manifest).encode()
    _fails(_rewrite(package, parts, tmp_path / "v99.sparta", fix_hashes=False), "format version 99",
           tmp_path / "cache")


def test_a_missing_kernel_source_is_named(package, tmp_path):
    parts = _parts(package)
    source = next(n for n in parts if n.startswith("kernels/"))
    del parts[source]
    _fails(_rewrite(package, parts, tmp_path / "listed.sparta", fix_hashes=False), "listed in the manifest is missing",
           tmp_path / "cache")
    _fails(_rewrite(package, parts, tmp_path / "unlisted.sparta"), f"kernel source '{source}' is missing",
           tmp_path / "cache")


def test_a_changed_byte_is_caught_by_the_hashes(package, tmp_path):
    parts = _parts(package)
    data = bytearray(parts["tensors.safetensors"])
    data[len(data) // 2] ^= 0xFF
    parts["tensors.safetensors"] = bytes(data)
    _fails(_rewrite(package, parts, tmp_path / "flipped.sparta", fix_hashes=False), "'tensors.safetensors' is corrupt",
           tmp_path / "cache")


@pytest.mark.parametrize("target", ["builtins.eval", "os.system", "torch.hub.load", "subprocess.run",
                                    "transformers.AutoModel.from_pretrained"])
def test_a_graph_calling_code_outside_the_trusted_roots_is_refused(package, tmp_path, target):
    parts = _parts(package)
    model = json.loads(parts["model.json"])
    node = next(n for n in model["model"]["graph"]["nodes"] if n["op"] == "call_module")
    node.update(op="call_function", target={"$callable": target})
    parts["model.json"] = json.dumps(model).encode()
    with pytest.raises(PackageError, match="not allowed|outside the trusted code|not one of the builtins"):
        se.load(_rewrite(package, parts, tmp_path / "hostile.sparta"), cache_dir=tmp_path / "cache")


def test_a_module_class_outside_the_trusted_roots_is_refused(package, tmp_path):
    parts = _parts(package)
    model = json.loads(parts["model.json"])
    child = next(iter(model["model"]["children"].values()))
    child["class"] = "collections.OrderedDict"
    parts["model.json"] = json.dumps(model).encode()
    with pytest.raises(PackageError, match="outside the trusted code"):
        se.load(_rewrite(package, parts, tmp_path / "foreign.sparta"), cache_dir=tmp_path / "cache")


def test_a_compiled_package_takes_no_model_argument(package, fp32_model, tmp_path):
    with pytest.raises(PackageError, match="without model="):
        se.load(package, model=fp32_model[0], cache_dir=tmp_path / "cache")
