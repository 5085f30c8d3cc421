"""Models whose initializers live in a data file beside the .onnx (what torch.onnx.export(dynamo=True)
and onnx.save_model(save_as_external_data=True) write): loaded from the model's folder only, and every
way of not finding the data is one clear error naming the file."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import weft
from weft.cli import main
from weft.compiler.onnx_import import load_model
from weft.core.errors import ModelError

from .test_frontend_util import make_model, ort_run, rand


def _model() -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("ReduceMean", ["r", "axes"], ["m"], name="mean", keepdims=0),
             helper.make_node("Gemm", ["m", "fc_w", "fc_b"], ["y"], name="fc", transB=1)]
    inits = {"w": rand(8, 3, 3, 3, seed=1), "b": rand(8, seed=2), "axes": np.array([2, 3], np.int64),
             "fc_w": rand(10, 8, seed=3), "fc_b": rand(10, seed=4)}
    return make_model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 10]}, inits, opset=18)


def _save_external(model: onnx.ModelProto, folder: Path, location: str = "model.onnx.data") -> Path:
    path = folder / "model.onnx"
    model = onnx.ModelProto.FromString(model.SerializeToString())  # save_model moves the data out in place
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=location,
                    size_threshold=0)
    return path


def _external(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]


def test_external_data_is_read_from_the_models_folder(tmp_path):
    model = _model()
    path = _save_external(model, tmp_path)
    assert (tmp_path / "model.onnx.data").is_file()
    assert len(_external(onnx.load(path, load_external_data=False))) == 5  # the test covers what it claims
    x = rand(1, 3, 8, 8, seed=9)
    want = ort_run(model, {"x": x})[0]
    for source in (path, str(path)):
        art = weft.compile(source, target="cpu")
        got = weft.InferenceSession(art, device="ref").run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    loaded = load_model(path)
    assert not _external(loaded)


def test_a_missing_data_file_is_named(tmp_path):
    path = _save_external(_model(), tmp_path)
    (tmp_path / "model.onnx.data").unlink()
    with pytest.raises(ModelError, match=r"external data file '.*model\.onnx\.data' \(tensor 'w'\) is missing"):
        weft.compile(path, target="cpu")


def test_a_short_data_file_is_named(tmp_path):
    path = _save_external(_model(), tmp_path)
    data = tmp_path / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ModelError, match=r"model\.onnx\.data' is too short for tensor"):
        weft.compile(path, target="cpu")


@pytest.mark.parametrize("location", ["../outside.data", "sub/../../outside.data", "/etc/passwd"])
def test_locations_outside_the_models_folder_are_refused(tmp_path, location):
    folder = tmp_path / "m"
    folder.mkdir()
    path = _save_external(_model(), folder)
    model = onnx.load(path, load_external_data=False)
    for t in _external(model):
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = location
    (tmp_path / "outside.data").write_bytes((folder / "model.onnx.data").read_bytes())
    onnx.save_model(model, path)
    with pytest.raises(ModelError, match=re.escape(f"names the external data file '{location}', which is not inside")):
        weft.compile(path, target="cpu")


def test_a_symlink_out_of_the_folder_is_refused(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    path = _save_external(_model(), folder, location="link.data")
    (tmp_path / "real.data").write_bytes((folder / "link.data").read_bytes())
    (folder / "link.data").unlink()
    (folder / "link.data").symlink_to(tmp_path / "real.data")
    with pytest.raises(ModelError, match=r"'link\.data', which is not inside the model's folder"):
        weft.compile(path, target="cpu")


def test_bytes_with_external_data_name_what_is_missing(tmp_path):
    path = _save_external(_model(), tmp_path)
    with pytest.raises(ModelError, match=r"tensor 'w' keeps its data in the external file 'model\.onnx\.data'"):
        weft.compile(path.read_bytes(), target="cpu")


def test_cli_missing_data_file_is_one_line_and_exit_2(tmp_path, capsys):
    path = _save_external(_model(), tmp_path)
    (tmp_path / "model.onnx.data").unlink()
    assert main(["compile", str(path), "-o", str(tmp_path / "x.weft"), "--target", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("weft compile: error: ") and "model.onnx.data" in err and "is missing" in err
    assert not (tmp_path / "x.weft").exists()


def test_cli_unknown_op_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "model.onnx"
    onnx.save_model(make_model([helper.make_node("Hardmax", ["x"], ["y"], name="hm")], {"x": [1, 4]},
                               {"y": None}), path)
    assert main(["compile", str(path), "-o", str(tmp_path / "x.weft")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "node 'hm' (Hardmax): op 'Hardmax' is not supported (weft imports: " in err and "Sigmoid" in err
