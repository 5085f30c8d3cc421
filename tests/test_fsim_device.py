"""The "fsim" device: registered with weft.runtime (numpy alone), its stats, and what it refuses."""

from __future__ import annotations

import numpy as np
import pytest

import weft
from weft.compiler import models
from weft.runtime import DeviceError, InferenceSession, available_devices
from weft.runtime.fsim_device import timing_model

from .numpy_only import run_with_numpy_alone
from .test_frontend_util import rand


@pytest.fixture(scope="module")
def art():
    return weft.compile(models.small_resnet(widths=(8, 16, 24)), calibration={"input": rand(2, 1, 3, 32, 32)})


def test_fsim_is_registered_and_runs_a_saved_artifact_without_onnx(art, tmp_path):
    assert "fsim" in available_devices()
    path = art.save(tmp_path / "net.weft")
    x = rand(1, 3, 32, 32, seed=4)
    np.save(tmp_path / "x.npy", x)
    expected = InferenceSession(art, device="ref").run(None, {"input": x})[0]
    np.save(tmp_path / "expected.npy", expected)
    run_with_numpy_alone(f"""
        import numpy as np
        import weft.runtime
        assert "fsim" in weft.runtime.available_devices()
        sess = weft.runtime.InferenceSession({str(path)!r}, device="fsim")
        out = sess.run(None, {{"input": np.load({str(tmp_path / "x.npy")!r})}})[0]
        assert np.array_equal(out, np.load({str(tmp_path / "expected.npy")!r}))
        assert sess.stats["accel_mac_fraction"] == 1.0
    """)


def test_stats_per_layer(art):
    sess = InferenceSession(art, device="fsim")
    sess.run(None, {"input": rand(1, 3, 32, 32)})
    stats = sess.stats
    assert stats["device"] == "fsim" and stats["macs"] > 0 and stats["accel_mac_fraction"] == 1.0
    assert "cycles" in stats and (stats["cycles"] is None) == (timing_model() is None)
    for layer in stats["layers"]:
        assert {"name", "op", "target", "macs", "shape", "seconds", "insn_count", "bytes", "cycles"} <= set(layer)
        if layer["target"] == "accel":
            assert {"insns", "insn_count", "bytes", "cycles", "accel_macs", "schedule"} <= set(layer)
            assert set(layer["bytes"]) >= {"inp", "wgt", "acc", "acc_narrow", "out", "uop"}
            assert layer["insn_count"] == sum(layer["insns"].values()) and layer["bytes"]["out"] > 0
    convs = [layer for layer in stats["layers"] if layer["op"] == "qconv2d"]
    assert all(layer["accel_macs"] >= layer["macs"] > 0 for layer in convs)  # padding only adds work


def test_intermediates_come_from_dram(art):
    sess = InferenceSession(art, device="fsim")
    sess.run(None, {"input": rand(1, 3, 32, 32)})
    with pytest.raises(DeviceError, match="keep_intermediates"):
        sess.intermediate(art.graph.nodes[1].outputs[0])
    sess.run(None, {"input": rand(1, 3, 32, 32)}, keep_intermediates=True)
    value = art.graph.values[art.graph.nodes[1].outputs[0]]
    assert sess.intermediate(value.name).shape == value.shape


def test_fsim_refuses_what_it_cannot_run(art):
    cpu = weft.compile(models.mlp(), target="cpu")
    with pytest.raises(DeviceError, match="target 'cpu'"):
        InferenceSession(cpu, device="fsim")
    bare = weft.compile(models.mlp(), calibration={"input": rand(2, 4, 64)}, codegen=False)
    with pytest.raises(DeviceError, match="no instruction streams"):
        InferenceSession(bare, device="fsim")
    with pytest.raises(DeviceError, match="compiled for config 'default'"):
        InferenceSession(art, device="fsim", config="tiny")
