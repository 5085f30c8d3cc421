"""InferenceSession: the onnxruntime-style API, stats, devices from the registry, config checks."""

from __future__ import annotations

import numpy as np
import pytest

import weft
from weft.compiler import models
from weft.config import PRESETS
from weft.runtime import DeviceError, FeedError, InferenceSession, available_devices, register_device
from weft.runtime.devices import _REGISTRY, RefDevice

from .test_frontend_util import rand


@pytest.fixture(scope="module")
def mlp_art():
    return weft.compile(models.mlp(batch=3), calibration={"input": rand(6, 64, seed=1)})


def test_inputs_outputs_and_run_like_onnxruntime(mlp_art, tmp_path):
    path = mlp_art.save(tmp_path / "mlp.weft")
    sess = weft.InferenceSession(str(path), device="ref")
    (inp,) = sess.get_inputs()
    (out,) = sess.get_outputs()
    assert (inp.name, inp.shape, inp.type) == ("input", [3, 64], "tensor(float)")
    assert (out.name, out.shape, out.type) == ("logits", [3, 10], "tensor(float)")
    assert sess.stats is None
    x = rand(3, 64, seed=2)
    (y,) = sess.run(None, {"input": x})
    assert y.shape == (3, 10) and y.dtype == np.float32
    np.testing.assert_array_equal(sess.run(["logits"], {"input": x})[0], y)
    np.testing.assert_array_equal(sess.run(None, {"input": x.astype(np.float64)})[0], y)


def test_stats_describe_the_last_run(mlp_art):
    sess = InferenceSession(mlp_art)
    sess.run(None, {"input": rand(3, 64)})
    stats = sess.stats
    assert stats["device"] == "ref" and stats["cycles"] is None
    assert stats["macs"] == models.count_macs(models.mlp(batch=3)) and stats["accel_mac_fraction"] == 1.0
    assert [layer["target"] for layer in stats["layers"]] == ["host", "accel", "accel", "accel", "host"]
    for layer in stats["layers"]:
        assert {"name", "op", "target", "macs", "shape", "seconds"} <= set(layer)
    assert stats["layers"][-1]["shape"] == [3, 10]


def test_host_layers_lower_the_accelerated_fraction():
    model = models.awkward_cnn()
    art = weft.compile(model, calibration={"input": rand(2, 1, 3, 29, 29)})
    sess = InferenceSession(art)
    sess.run(None, {"input": rand(1, 3, 29, 29)})
    targets = {layer["name"]: layer["target"] for layer in sess.stats["layers"]}
    assert targets["branch_c"] == "host"  # AveragePool not counting its pads runs in float on the host
    assert targets["stem"] == "accel" and 0.99 < sess.stats["accel_mac_fraction"] <= 1.0


def test_bad_feeds_name_the_input(mlp_art):
    sess = InferenceSession(mlp_art)
    with pytest.raises(FeedError, match="input 'input' is missing"):
        sess.run(None, {})
    with pytest.raises(FeedError, match=r"input 'input' must have shape \[3, 64\], got \[2, 64\]"):
        sess.run(None, {"input": rand(2, 64)})
    with pytest.raises(FeedError, match="'image' is not an input of the model"):
        sess.run(None, {"input": rand(3, 64), "image": rand(1)})
    with pytest.raises(FeedError, match="input 'input' must be float32, got int64"):
        sess.run(None, {"input": np.zeros((3, 64), np.int64)})
    with pytest.raises(DeviceError, match="'probs' is not an output of the model"):
        sess.run(["probs"], {"input": rand(3, 64)})


def test_device_for_another_config_refuses_naming_both_hashes(mlp_art):
    tiny = PRESETS["tiny"]
    with pytest.raises(DeviceError, match=f"config 'tiny' \\(hash {tiny.hash}\\).*config 'default' "
                                          f"\\(hash {mlp_art.config_hash}\\)"):
        InferenceSession(mlp_art, device="ref", config="tiny")
    with pytest.raises(DeviceError, match="hash"):
        InferenceSession(mlp_art, device=RefDevice(tiny))
    InferenceSession(mlp_art, device="ref", config="default")  # the same config is fine


def test_unknown_device_lists_the_available_ones(mlp_art):
    with pytest.raises(DeviceError, match=r"device 'tpu' is not available in this build \(available: .*ref"):
        InferenceSession(mlp_art, device="tpu")


def test_registry_adds_devices_without_touching_the_session(mlp_art):
    class Doubling(RefDevice):
        name = "doubling"

        def run(self, feeds, *, keep_intermediates=False):
            out, figures, values = super().run(feeds, keep_intermediates=keep_intermediates)
            return {k: 2 * v for k, v in out.items()}, {**figures, "cycles": 123}, values

    try:
        register_device("doubling", Doubling)
        assert "doubling" in available_devices()
        with pytest.raises(ValueError, match="already registered"):
            register_device("doubling", Doubling)
        x = {"input": rand(3, 64, seed=4)}
        sess = InferenceSession(mlp_art, device="doubling")
        np.testing.assert_array_equal(sess.run(None, x)[0], 2 * InferenceSession(mlp_art).run(None, x)[0])
        assert sess.stats["device"] == "doubling" and sess.stats["cycles"] == 123
    finally:
        _REGISTRY.pop("doubling", None)


def test_intermediates_are_the_packed_layer_outputs(mlp_art):
    sess = InferenceSession(mlp_art)
    sess.run(None, {"input": rand(3, 64)}, keep_intermediates=True)
    layer = next(n for n in mlp_art.graph.nodes if n.op == "qconv2d")
    value = sess.intermediate(layer.outputs[0])
    assert value.dtype == np.int8 and value.shape == mlp_art.graph.values[layer.outputs[0]].shape
    with pytest.raises(DeviceError, match="no intermediate 'nope'"):
        sess.intermediate("nope")


def test_cpu_target_runs_the_float_graph():
    model = models.vgg_small()
    art = weft.compile(model, target="cpu")
    assert art.target == "cpu" and not any(n.op.startswith("q") for n in art.graph.nodes)
    sess = InferenceSession(art, device="ref", config="tiny")  # a float graph does not depend on the config
    x = rand(1, 3, 32, 32)
    from .test_frontend_util import ort_run

    np.testing.assert_allclose(sess.run(None, {"input": x})[0], ort_run(model, {"input": x})[0], rtol=1e-4, atol=1e-6)
    assert sess.stats["accel_mac_fraction"] == 0.0
