"""`weft compile`, `weft inspect`, `weft run`: files in, files out, errors as one line and exit 2 with
nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import helper

import weft
from weft.cli import main
from weft.compiler import models
from weft.config import PRESETS

from .test_frontend_util import make_model, rand


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return models.save(models.small_resnet(widths=(8, 16, 24)), tmp_path_factory.mktemp("m") / "net.onnx")


def test_compile_inspect_run(model_path, tmp_path, capsys):
    cal = tmp_path / "cal.npz"
    np.savez(cal, input=rand(4, 1, 3, 32, 32))
    out = tmp_path / "net.weft"
    assert main(["compile", str(model_path), "-o", str(out), "--calibration", str(cal)]) == 0
    printed = capsys.readouterr()
    assert "wrote" in printed.out and "on the accelerator" in printed.out and printed.err == ""
    assert weft.runtime.Artifact.load(out).meta["calibration"] == {"source": "given", "batches": 4}

    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    for layer in ("conv1", "layer2.0.downsample.0", "avgpool", "logits"):
        assert layer in text
    assert main(["inspect", str(out), "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert table["config_hash"] == PRESETS["default"].hash and table["accel_mac_fraction"] == 1.0
    # qim2col: the host gathers conv1's 3x3x3 windows (weft.compiler.im2col)
    assert {r["op"] for r in table["layers"]} == {"quantize", "qim2col", "qconv2d", "qavgpool", "dequantize"}
    assert sum(r["macs"] for r in table["layers"]) == models.count_macs(models.small_resnet(widths=(8, 16, 24)))

    x = rand(1, 3, 32, 32, seed=3)
    np.save(tmp_path / "x.npy", x)
    args = ["run", str(out), "--device", "ref", "--input", f"input={tmp_path / 'x.npy'}",
            "--output", str(tmp_path / "y.npz"), "--stats", str(tmp_path / "stats.json")]
    assert main(args) == 0
    assert "output 'logits'" in capsys.readouterr().out
    with np.load(tmp_path / "y.npz") as y:
        np.testing.assert_array_equal(y["logits"], weft.InferenceSession(out).run(None, {"input": x})[0])
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["device"] == "ref" and stats["cycles"] is None and len(stats["layers"]) == len(table["layers"])

    assert main(["run", str(out), "--seed", "7"]) == 0
    assert "seeded random normal [1, 3, 32, 32] (seed 7)" in capsys.readouterr().out


def test_compile_without_calibration_warns_once(model_path, tmp_path, capsys):
    out = tmp_path / "a.weft"
    assert main(["compile", str(model_path), "-o", str(out), "--config", "tiny"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: no calibration data") == 1
    art = weft.runtime.Artifact.load(out)
    assert art.config.name == "tiny" and art.meta["calibration"]["source"] == "random"


def test_cpu_target_and_pass_list(model_path, tmp_path, capsys):
    assert main(["compile", str(model_path), "-o", str(tmp_path / "c.weft"), "--target", "cpu"]) == 0
    assert weft.runtime.Artifact.load(tmp_path / "c.weft").target == "cpu"
    capsys.readouterr()
    assert main(["compile", "--list-passes"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names[0] == "infer_shapes" and names[-6:] == ["quantize", "fuse_clamps", "im2col_host_convs", "pack_layout",
                                                         "partition", "fuse_pools"]


def _fails(args, capsys, *needles):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    for needle in needles:
        assert needle in err, err


def test_compile_errors_exit_2_and_write_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    models.save(make_model([helper.make_node("Hardmax", ["x"], ["y"], name="hm")], {"x": [1, 4]}, {"y": None}), bad)
    out = tmp_path / "out.weft"
    _fails(["compile", str(bad), "-o", str(out)], capsys, "node 'hm' (Hardmax)", "not supported")
    truncated = tmp_path / "cut.onnx"
    truncated.write_bytes(models.mlp().SerializeToString()[:300])
    _fails(["compile", str(truncated), "-o", str(out)], capsys, str(truncated))
    _fails(["compile", str(tmp_path / "none.onnx"), "-o", str(out)], capsys, "no such model file")
    dynamic = tmp_path / "dyn.onnx"
    models.save(make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, "C"]}, {"y": None}), dynamic)
    _fails(["compile", str(dynamic), "-o", str(out), "--target", "cpu"], capsys, "graph input 'x'", "dimension 1")
    cal = tmp_path / "cal.npz"
    np.savez(cal, wrong=rand(2, 8))
    _fails(["compile", str(dynamic), "-o", str(out), "--input-shape", "x=1,8", "--calibration", str(cal)],
           capsys, "'wrong', which is not a model input")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx", "cal.npz", "cut.onnx",
                                                                                "dyn.onnx"]
    assert main(["compile", str(dynamic), "-o", str(out), "--target", "cpu", "--input-shape", "x=1,8"]) == 0


def test_run_errors_exit_2(model_path, tmp_path, capsys):
    out = tmp_path / "n.weft"
    weft.compile(model_path, calibration={"input": rand(1, 3, 32, 32)}).save(out)
    _fails(["run", str(out), "--config", "tiny"], capsys, PRESETS["tiny"].hash, PRESETS["default"].hash)
    _fails(["run", str(out), "--device", "tpu"], capsys, "device 'tpu' is not available")
    # The board device exists but cannot start without its bitstream: it says what is missing.
    _fails(["run", str(out), "--device", "pynq"], capsys, "device 'pynq' needs the bitstream")
    _fails(["run", str(out), "--device", "fsim", "--device-option", "bogus=1"], capsys,
           "device 'fsim' has no option 'bogus'")
    _fails(["run", str(out), "--device", "ref", "--device-option", "threads=2"], capsys,
           "device 'ref' has no option 'threads'")
    _fails(["run", str(out), "--input", f"image={tmp_path / 'x.npy'}"], capsys, "'image', which is not a model input")
    np.save(tmp_path / "x.npy", rand(1, 3, 16, 16))
    _fails(["run", str(out), "--input", f"input={tmp_path / 'x.npy'}", "--output", str(tmp_path / "y.npz")], capsys,
           "must have shape [1, 3, 32, 32]")
    assert not (tmp_path / "y.npz").exists()
    (tmp_path / "broken.weft").write_bytes(out.read_bytes()[:1000])
    _fails(["inspect", str(tmp_path / "broken.weft")], capsys, "not a weft artifact")


def test_calibration_file_path_works_from_python_and_bad_files_are_named(model_path, tmp_path, capsys):
    cal = tmp_path / "cal.npz"
    np.savez(cal, input=rand(2, 1, 3, 32, 32))
    assert weft.compile(model_path, calibration=cal).meta["calibration"]["batches"] == 2
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    _fails(["compile", str(model_path), "-o", str(tmp_path / "o.weft"), "--calibration", str(tmp_path / "bad.npz")],
           capsys, "bad.npz: not a readable .npz file")
    _fails(["compile", str(model_path), "--calibration", str(tmp_path / "none.npz")], capsys,
           "no such calibration file")


def test_run_passes_device_options(model_path, tmp_path, capsys):
    out = tmp_path / "n.weft"
    weft.compile(model_path, calibration={"input": rand(1, 3, 32, 32)}).save(out)
    stats = tmp_path / "s.json"
    assert main(["run", str(out), "--device", "fsim", "--device-option", "timing=0", "--stats", str(stats)]) == 0
    assert json.loads(stats.read_text())["cycles"] is None  # the option reached the device: no timing model
    assert main(["run", str(out), "--device", "fsim", "--stats", str(stats)]) == 0
    assert json.loads(stats.read_text())["cycles"] > 0
