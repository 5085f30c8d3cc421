"""The .weft file: a round trip keeps everything, sections extend it, and any damage is refused with a
clear error (never code execution: no pickle anywhere)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from onnx import helper

import weft
from weft.core.artifact import FORMAT_VERSION, Artifact, ArtifactError
from weft.core.ir import graph_to_dict

from .artifact_util import members_of, rezip
from .test_frontend_util import make_model, rand


@pytest.fixture(scope="module")
def artifact() -> Artifact:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Softmax", ["f"], ["y"], name="softmax", axis=1)]
    model = make_model(nodes, {"x": [1, 3, 8, 8]}, {"y": None}, {"w": rand(6, 3, 3, 3), "b": rand(6)})
    return weft.compile(model, calibration={"x": rand(2, 1, 3, 8, 8)})


def _key(a: np.ndarray) -> str:
    return f"{a.dtype}{list(a.shape)}{a.tobytes().hex()}"


def test_round_trip_keeps_graph_config_and_meta(artifact, tmp_path):
    path = artifact.save(tmp_path / "m.weft")
    again = Artifact.load(path)
    assert graph_to_dict(again.graph, _key) == graph_to_dict(artifact.graph, _key)
    assert again.config == artifact.config and again.config_hash == artifact.config.hash
    assert again.target == "accel" and again.meta == json.loads(json.dumps(artifact.meta))
    x = {"x": rand(1, 3, 8, 8, seed=5)}
    np.testing.assert_array_equal(weft.InferenceSession(again).run(None, x)[0],
                                  weft.InferenceSession(artifact).run(None, x)[0])


def test_file_layout_is_json_and_npy(artifact):
    members = members_of(artifact.to_bytes())
    manifest = json.loads(members["manifest.json"])
    assert manifest["format"] == "weft-artifact" and manifest["format_version"] == FORMAT_VERSION
    assert manifest["config_hash"] == artifact.config.hash and manifest["target"] == "accel"
    assert set(manifest["members"]) == set(members) - {"manifest.json"}
    assert all(name.endswith(".npy") for name in members if name.startswith("arrays/"))
    assert {n["op"] for n in manifest["graph"]["nodes"]} >= {"quantize", "qconv2d", "qavgpool", "Softmax"}


def test_sections_survive_and_unknown_ones_are_kept(artifact, tmp_path):
    art = Artifact.from_bytes(artifact.to_bytes())
    section = art.add_section("insns", {"count": 3, "isa": "v1"}, {"stream.bin": b"\x01\x02\x03"})
    section.add_array("dram", np.arange(10, dtype=np.uint8))
    again = Artifact.load(art.save(tmp_path / "s.weft"))
    assert again.section("insns").meta == {"count": 3, "isa": "v1"}
    assert again.section("insns").files["stream.bin"] == b"\x01\x02\x03"
    np.testing.assert_array_equal(again.section("insns").array("dram"), np.arange(10, dtype=np.uint8))
    with pytest.raises(ArtifactError, match="no section 'bitstream'"):
        again.section("bitstream")
    with pytest.raises(ValueError, match="section and file names"):
        art.add_section("../evil", {}, {})


def test_unknown_format_version_is_refused(artifact):
    members = members_of(artifact.to_bytes())
    manifest = json.loads(members["manifest.json"])
    manifest["format_version"] = FORMAT_VERSION + 1
    members["manifest.json"] = json.dumps(manifest).encode()
    with pytest.raises(ArtifactError, match=f"format version {FORMAT_VERSION + 1}; this weft reads version"):
        Artifact.from_bytes(rezip(members))


def test_corrupted_member_is_refused(artifact):
    members = members_of(artifact.to_bytes())
    key = next(k for k in members if k.startswith("arrays/"))
    blob = bytearray(members[key])
    blob[-1] ^= 0xFF
    members[key] = bytes(blob)
    with pytest.raises(ArtifactError, match=f"member '{key}' is corrupt"):
        Artifact.from_bytes(rezip(members))


def test_damaged_files_are_refused(artifact, tmp_path):
    data = artifact.to_bytes()
    for damaged, pattern in ((data[: len(data) // 2], "not a zip file, or truncated"), (b"hello", "not a zip"),
                             (rezip({"x.txt": b"1"}), "no manifest.json"),
                             (rezip({"manifest.json": b"{"}), "not valid JSON"),
                             (rezip({"manifest.json": b'{"format": "other"}'}), "format is 'other'")):
        with pytest.raises(ArtifactError, match=pattern):
            Artifact.from_bytes(damaged)
    with pytest.raises(ArtifactError, match="no such artifact file"):
        Artifact.load(tmp_path / "missing.weft")


def test_pickled_arrays_are_never_loaded(artifact):
    members = members_of(artifact.to_bytes())
    manifest = json.loads(members["manifest.json"])
    key = next(k for k in members if k.startswith("arrays/"))
    buf = io.BytesIO()
    np.save(buf, np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    members[key] = buf.getvalue()
    import hashlib

    manifest["members"][key] = hashlib.sha256(members[key]).hexdigest()
    members["manifest.json"] = json.dumps(manifest).encode()
    with pytest.raises(ArtifactError, match=r"not a valid \.npy array"):
        Artifact.from_bytes(rezip(members))


def test_tampered_config_is_refused(artifact):
    members = members_of(artifact.to_bytes())
    manifest = json.loads(members["manifest.json"])
    manifest["config"]["block_in"] = 32
    members["manifest.json"] = json.dumps(manifest).encode()
    with pytest.raises(ArtifactError, match="the recorded config hashes to"):
        Artifact.from_bytes(rezip(members))


def test_save_is_atomic(artifact, tmp_path, monkeypatch):
    target = tmp_path / "a.weft"
    target.write_bytes(b"old")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(OSError, match="disk full"):
        artifact.save(target)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["a.weft"]
