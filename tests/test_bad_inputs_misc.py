"""Bad inputs outside the artifact: configs, ONNX shapes, session feeds and deploy folders. Each is
refused with its error class and a message naming the culprit; on the command line as one line and exit 2;
and nothing the user had is lost."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper

import weft
from weft.cli import main
from weft.config import AcceleratorConfig, ConfigError, load_config
from weft.core.errors import ModelError
from weft.core.walker import FeedError
from weft.runtime import InferenceSession
from weft.runtime.deploy import MARKER, DeployError, deploy

from .driver_util import compiled
from .test_frontend_util import make_model, rand


def _one_line_error(capsys: pytest.CaptureFixture[str], fragment: str) -> None:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert fragment in err, err


# ---- config ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("data", "fragment"), [
    ({"batch": True}, "config field 'batch': must be an integer, got True"),
    ({"block_in": 16.0}, "config field 'block_in': must be an integer, got 16.0"),
    ({"acc_buff_bytes": "128k"}, "config field 'acc_buff_bytes': must be an integer, got '128k'"),
    ({"clock_mhz": True}, "config field 'clock_mhz': must be a number, not bool"),
    ({"LOG_BATCH": True, "LOG_INP_WIDTH": 3, "LOG_WGT_WIDTH": 3, "LOG_ACC_WIDTH": 5, "LOG_BLOCK": 4,
      "LOG_UOP_BUFF_SIZE": 15, "LOG_INP_BUFF_SIZE": 15, "LOG_WGT_BUFF_SIZE": 18, "LOG_ACC_BUFF_SIZE": 17},
     "config field 'LOG_BATCH': must be a non-negative integer, got True"),
])
def test_bools_and_non_integers_in_a_config_are_refused(data, fragment):
    with pytest.raises(ConfigError) as err:
        AcceleratorConfig.from_dict(data)
    assert fragment in str(err.value)


def test_batch_one_still_loads_and_true_never_hashes_as_one():
    assert load_config({"batch": 1}).hash == load_config(None).hash


def _relu_model(dims: list[int | str | None]) -> onnx.ModelProto:
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], {"x": dims}, {"y": None})


def test_cli_refuses_a_config_file_with_a_bool(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    onnx.save(_relu_model([1, 3, 4, 4]), model)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"name": "b", "batch": True}))
    assert main(["compile", str(model), "-o", str(tmp_path / "m.weft"), "--config", str(cfg)]) != 0
    _one_line_error(capsys, "'batch': must be an integer, got True")
    assert not (tmp_path / "m.weft").exists()


# ---- ONNX shapes -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("dims", "shapes", "fragment"), [
    ([0, 3, 4, 4], None, "graph input 'x' declares dimension 0 as 0"),
    ([1, -3, 4, 4], None, "graph input 'x' declares dimension 1 as -3"),
    (["N", 4, 100000, 100000], {"x": (1, 4, 100000, 100000)}, "graph input 'x' has the shape [1, 4, 100000, 100000]: "
                                                               "40000000000 elements exceed the limit"),
    (["N", "C"], {"x": (60000, 60000)}, "elements exceed the limit"),
    (["N", "C"], {"x": (2, -5)}, "graph input 'x' has the shape [2, -5]: dimension 1 is -5"),
    (["N", "C"], {"x": (0, 5)}, "graph input 'x' has the shape [0, 5]: dimension 0 is 0"),
])
def test_bad_input_dimensions_are_refused_naming_the_input(dims, shapes, fragment):
    with pytest.raises(ModelError) as err:
        weft.compile(_relu_model(dims), target="cpu", input_shapes=shapes)
    assert fragment in str(err.value)


def test_calibration_data_cannot_fix_a_dimension_to_zero():
    stack = np.zeros((2, 1, 3, 0, 8), np.float32)  # two batches whose height is 0
    with pytest.raises(ModelError, match=r"graph input 'x' has the shape \[1, 3, 0, 8\]: dimension 2 is 0"):
        weft.compile(_relu_model(["N", 3, "H", "W"]), target="cpu", calibration={"x": stack})


def test_a_huge_constant_of_shape_is_refused_naming_the_node():
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["big"], name="the_fill"),
             helper.make_node("Add", ["x", "big"], ["y"], name="add")]
    model = make_model(nodes, {"x": [1, 4]}, {"y": None}, {"s": np.array([100000, 100000, 4], np.int64)})
    with pytest.raises(ModelError, match=r"node 'the_fill' \(ConstantOfShape\): output 'big' would have the shape "
                                         r"\[100000, 100000, 4\]: 40000000000 elements exceed"):
        weft.compile(model, target="cpu")


def test_cli_input_shape_too_large_is_one_line(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    onnx.save(_relu_model(["N", "C"]), model)
    assert main(["compile", str(model), "-o", str(tmp_path / "m.weft"), "--input-shape", "x=60000,60000"]) == 2
    _one_line_error(capsys, "graph input 'x' has the shape [60000, 60000]")
    assert not (tmp_path / "m.weft").exists()


# ---- session feeds ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlp():
    return compiled("mlp")


@pytest.mark.parametrize(("bad", "fragment"), [
    ({(0, 0): np.nan}, "input 'input' has 1 non-finite value (NaN or Inf)"),
    ({(0, 0): np.inf, (1, 3): -np.inf, (2, 2): np.nan}, "input 'input' has 3 non-finite values"),
])
def test_non_finite_feeds_are_refused(mlp, bad, fragment):
    art, feeds = mlp
    x = feeds["input"].copy()
    for at, value in bad.items():
        x[at] = value
    with pytest.raises(FeedError) as err:
        InferenceSession(art, "ref").run(None, {"input": x})
    assert fragment in str(err.value)
    assert np.isnan(x).sum() == sum(np.isnan(v) for v in bad.values())  # the caller's array is untouched


def test_allow_nonfinite_lets_them_through(mlp):
    art, feeds = mlp
    x = feeds["input"].copy()
    x[0, 0] = np.nan
    out = InferenceSession(art, "ref", allow_nonfinite=True).run(None, {"input": x})
    assert out[0].shape == (4, 10)


def test_the_cpu_device_refuses_non_finite_feeds_too():
    pytest.importorskip("llvmlite")
    art = weft.compile(_relu_model([1, 3, 4, 4]), target="cpu")
    x = rand(1, 3, 4, 4)
    x[0, 1, 2, 3] = np.nan
    with pytest.raises(FeedError, match="input 'x' has 1 non-finite value"):
        InferenceSession(art, "cpu").run(None, {"x": x})
    assert InferenceSession(art, "cpu", allow_nonfinite=True).run(None, {"x": x})[0].shape == (1, 3, 4, 4)


def test_cli_run_refuses_a_nan_input_file_in_one_line(mlp, tmp_path, capsys):
    art, feeds = mlp
    path = tmp_path / "mlp.weft"
    art.save(path)
    x = feeds["input"].copy()
    x[1, 2] = np.nan
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(path), "--input", f"input={tmp_path / 'x.npy'}", "--no-progress"]) == 2
    _one_line_error(capsys, "input 'input' has 1 non-finite value")
    out = tmp_path / "out.npz"
    assert main(["run", str(path), "--input", f"input={tmp_path / 'x.npy'}", "--no-progress", "--allow-nonfinite",
                 "--output", str(out)]) == 0
    assert np.load(out)[next(iter(np.load(out).files))].shape == (4, 10)


def test_wrong_shape_and_unknown_input_still_named(mlp):
    art, feeds = mlp
    sess = InferenceSession(art, "ref")
    with pytest.raises(FeedError, match=r"input 'input' must have shape \[4, 64\], got \[4, 63\]"):
        sess.run(None, {"input": feeds["input"][:, :63]})
    with pytest.raises(FeedError, match="'other' is not an input of the model"):
        sess.run(None, {**feeds, "other": feeds["input"]})


# ---- deploy ----------------------------------------------------------------------------------------------
@pytest.fixture
def mlp_file(mlp, tmp_path):
    path = tmp_path / "mlp.weft"
    mlp[0].save(path)
    return path


def test_deploy_refuses_a_weft_folder_it_did_not_write(mlp_file, tmp_path):
    out = tmp_path / "home"
    (out / "weft").mkdir(parents=True)
    (out / "weft" / "thesis.tex").write_text("years of work")
    with pytest.raises(DeployError, match=rf"{out / 'weft'} exists and was not written by weft deploy"):
        deploy(mlp_file, "pynq-z2", out)
    assert (out / "weft" / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in out.iterdir()) == ["weft"]  # nothing written beside it either


def test_deploy_refuses_a_symlinked_weft_folder(mlp_file, tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    (out / "weft").symlink_to(elsewhere)
    with pytest.raises(DeployError, match="was not written by weft deploy"):
        deploy(mlp_file, "pynq-z2", out)
    assert (elsewhere / "keep.txt").read_text() == "keep"


def test_cli_deploy_refusal_is_one_line(mlp_file, tmp_path, capsys):
    out = tmp_path / "home"
    (out / "weft").mkdir(parents=True)
    (out / "weft" / "notes.txt").write_text("mine")
    assert main(["deploy", str(mlp_file), "--board", "pynq-z2", "-o", str(out)]) == 2
    _one_line_error(capsys, "was not written by weft deploy")
    assert (out / "weft" / "notes.txt").read_text() == "mine"


def test_deploy_replaces_its_own_folder_through_a_staging_folder(mlp_file, tmp_path):
    out = tmp_path / "board"
    deploy(mlp_file, "pynq-z2", out)
    assert (out / "weft" / MARKER).is_file()
    (out / "weft" / "stale.py").write_text("# from an older deploy")
    deploy(mlp_file, "pynq-z2", out)
    assert not (out / "weft" / "stale.py").exists() and (out / "weft" / "runtime" / "session.py").is_file()
    assert not [p.name for p in out.iterdir() if p.name.startswith((".weft-staging", ".weft-old"))]
    (out / "run.py").write_text("# edited on the board")  # deploy's own files in its own folder: overwritten
    deploy(mlp_file, "pynq-z2", out)
    assert "edited" not in (out / "run.py").read_text()


def test_deploy_does_not_overwrite_a_users_files(mlp_file, tmp_path):
    out = tmp_path / "home"
    out.mkdir()
    (out / "run.py").write_text("my script")
    (out / "data.csv").write_text("1,2")
    with pytest.raises(DeployError, match=rf"{out / 'run.py'} exists and {out} was not written by weft deploy"):
        deploy(mlp_file, "pynq-z2", out)
    assert (out / "run.py").read_text() == "my script"
    assert sorted(p.name for p in out.iterdir()) == ["data.csv", "run.py"]


def test_deploy_into_a_folder_with_other_files_keeps_them(mlp_file, tmp_path):
    out = tmp_path / "project"
    out.mkdir()
    (out / "data.csv").write_text("1,2")
    deploy(mlp_file, "pynq-z2", out)
    assert (out / "data.csv").read_text() == "1,2" and (out / "run.py").is_file()


def test_deploy_of_a_bad_artifact_writes_nothing(tmp_path):
    bad = tmp_path / "bad.weft"
    bad.write_bytes(b"PK not really")
    out = tmp_path / "out"
    with pytest.raises(weft.core.artifact.ArtifactError, match=r"bad\.weft is not a weft artifact"):
        deploy(bad, "pynq-z2", out)
    assert not out.exists() and bad.read_bytes() == b"PK not really"
