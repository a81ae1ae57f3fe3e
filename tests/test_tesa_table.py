"""TeSATable: checked inserts, merge, summary, and save/load without unpickling."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparta_explore import TeSA, TeSANameError, TeSAShapeError, TeSATable
from sparta_explore.errors import FileFormatError

SHAPES = {"fc1.weight": (4, 3), "fc1.bias": (4,), "relu": (2, 4)}


def test_bound_table_rejects_unknown_names_with_suggestion():
    t = TeSATable.dense_for(SHAPES)
    with pytest.raises(TeSANameError, match=r"'fc1.wieght'.*did you mean 'fc1.weight'"):
        t["fc1.wieght"] = TeSA.dense((4, 3))


def test_bound_table_rejects_wrong_shapes_naming_tensor():
    t = TeSATable(shapes=SHAPES)
    with pytest.raises(TeSAShapeError, match=r"'fc1.weight' has shape \(3, 4\), tensor has \(4, 3\)"):
        t["fc1.weight"] = TeSA.dense((3, 4))


def test_activation_may_keep_batch_dim_at_one():
    t = TeSATable(shapes=SHAPES)
    t["relu"] = TeSA.dense((1, 4))
    assert t["relu"].shape == (1, 4)


def test_missing_name_lookup_raises_named_error():
    with pytest.raises(TeSANameError, match="'fc9.weight'"):
        TeSATable.dense_for(SHAPES)["fc9.weight"]


def test_values_must_be_tesas():
    with pytest.raises(TypeError, match="fc1.weight"):
        TeSATable()["fc1.weight"] = torch.ones(2)


def test_merge_tables_entrywise_and_union():
    a = TeSATable({"w": TeSA.from_mask(torch.tensor([1, 0, 1]))})
    b = TeSATable({"w": TeSA.dense((3,), bits=8), "v": TeSA.dense((2,))})
    m = a.merge(b)
    assert set(m) == {"w", "v"}
    assert m["w"].bits.tolist() == [8, 0, 8]
    assert a["w"].bits.tolist() == [32, 0, 32]  # inputs untouched


def test_summary_columns_and_values():
    t = TeSATable({"fc1.weight": TeSA.from_mask(torch.tensor([[1, 0], [0, 0]]), bits=8, fmt="int"),
                   "fc1.bias": TeSA.dense((2,))})
    df = t.summary()
    assert list(df.columns) == ["name", "shape", "numel", "sparsity", "bits", "fmt", "mean_bits"]
    row = df.set_index("name").loc["fc1.weight"]
    assert row["shape"] == "2x2" and row["sparsity"] == 0.75 and row["bits"] == "8" and row["fmt"] == "int"
    assert t.total_sparsity() == pytest.approx(3 / 6)


def test_save_load_round_trip(tmp_path):
    t = TeSATable.dense_for(SHAPES)
    t["fc1.weight"] = TeSA(torch.tensor([[0, 4, 8], [8, 8, 0], [16, 32, 1], [0, 0, 0]]), "uint")
    path = t.save(tmp_path / "sub" / "table.npz")
    back = TeSATable.load(path)
    assert back.equals(t) and back.shapes == t.shapes
    assert not list((tmp_path / "sub").glob("*.tmp"))


def test_load_refuses_pickled_objects(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, header=np.array([{"code": "run me"}], dtype=object))
    with pytest.raises(FileFormatError, match="evil.npz"):
        TeSATable.load(path)


def test_load_refuses_foreign_npz(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, header=np.frombuffer(b'{"format": "something"}', dtype=np.uint8))
    with pytest.raises(FileFormatError, match="other.npz is not a readable TeSA table: format 'something'"):
        TeSATable.load(path)


def test_load_of_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileFormatError, match="missing.npz is not a readable TeSA table: no such file"):
        TeSATable.load(tmp_path / "missing.npz")


def _saved(tmp_path) -> bytes:
    t = TeSATable.dense_for(SHAPES)
    t["fc1.weight"] = TeSA.from_mask(torch.tensor([[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 1]]), bits=8)
    return t.save(tmp_path / "good.npz").read_bytes()


def _header_npz(path, header: bytes) -> None:
    np.savez(path, header=np.frombuffer(header, dtype=np.uint8))


@pytest.mark.parametrize("damage, why", [
    (lambda blob, p: p.write_bytes(blob[: len(blob) // 2]), "truncated"),
    (lambda blob, p: p.write_bytes(b""), "the file is empty"),
    (lambda blob, p: p.write_bytes(bytes(range(256)) * 4), "no zip signature"),
    (lambda blob, p: p.write_bytes(blob[:200] + bytes([blob[200] ^ 0xFF]) + blob[201:]), "is not a readable"),
    (lambda blob, p: _header_npz(p, b"[1, 2]"), "JSON list, not an object"),
    (lambda blob, p: _header_npz(p, b"\xff\xfe\x00"), "not UTF-8"),
    (lambda blob, p: _header_npz(p, b"{not json"), "not JSON"),
    (lambda blob, p: _header_npz(p, b'{"format": "sparta-explore.tesa-table", "version": 1, "names": 3}'),
     "'names' is not a list"),
    (lambda blob, p: _header_npz(p, b'{"format": "sparta-explore.tesa-table", "version": 1, "names": ["a"]}'),
     "arrays ['bits_0', 'fmt_0'] of tensor 'a' are missing"),
    (lambda blob, p: _header_npz(p, b'{"format": "sparta-explore.tesa-table", "version": 9, "names": []}'),
     "unsupported TeSA table version 9"),
])
def test_every_broken_file_is_one_error_naming_it(tmp_path, damage, why):
    path = tmp_path / "broken.npz"
    damage(_saved(tmp_path), path)
    with pytest.raises(FileFormatError, match="broken.npz") as info:
        TeSATable.load(path)
    assert why in str(info.value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_files_load_or_fail_with_the_one_error(tmp_path, data):
    blob = bytearray(_saved(tmp_path))
    for _ in range(data.draw(st.integers(1, 8))):  # flip, cut or insert bytes anywhere
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        i = data.draw(st.integers(0, len(blob) - 1))
        if op == "flip":
            blob[i] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del blob[i:i + data.draw(st.integers(1, 64))]
        else:
            blob[i:i] = data.draw(st.binary(min_size=1, max_size=16))
        if not blob:
            break
    path = tmp_path / "fuzzed.npz"
    path.write_bytes(bytes(blob))
    try:
        table = TeSATable.load(path)
    except FileFormatError as e:
        assert "fuzzed.npz" in str(e)
    else:  # a mutation the zip format does not check (padding, a comment) may leave a valid table
        assert set(table) <= set(SHAPES)


def test_lookups_that_miss_suggest_nothing_and_indexing_still_suggests(monkeypatch):
    import difflib

    table = TeSATable({"fc1.weight": TeSA.dense((4, 3))})
    monkeypatch.setattr(difflib, "get_close_matches", lambda *a, **k: (_ for _ in ()).throw(AssertionError("asked")))
    assert table.get("fc2.weight") is None and "fc2.weight" not in table and "fc1.weight" in table
    assert table.get("fc1.weight") is table["fc1.weight"]
    monkeypatch.undo()
    with pytest.raises(TeSANameError, match="did you mean 'fc1.weight'"):
        table["fc1.weigth"]
