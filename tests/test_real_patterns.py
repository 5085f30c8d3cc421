"""The patterns of today's vision exports, written as their exporters write them, on both targets.

Each model runs compiled for the accelerator (fsim equals the reference interpreter to the bit on every
layer; the int8 result against float onnxruntime) and compiled for the CPU (LLVM kernels, with numpy steps
only for ops that have no kernel; against onnxruntime)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import weft
from weft.compiler import models

from .test_frontend_util import cosine, make_model, ort_run

SAMPLES = 4


def _he(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(np.float32)


def _conv(name: str, x: str, y: str, w: np.ndarray, inits: dict, **attrs: object) -> onnx.NodeProto:
    inits[f"{name}.weight"] = w
    inits[f"{name}.bias"] = (np.random.default_rng(len(inits)).standard_normal(w.shape[0]) * 0.05).astype(np.float32)
    return helper.make_node("Conv", [x, f"{name}.weight", f"{name}.bias"], [y], name=name, **attrs)


def check_both_targets(model: onnx.ModelProto | str | Path, feeds_shape: dict[str, list[int]], *,
                       config: str = "tiny", min_cosine: float = 0.99, min_accel_fraction: float = 0.0) -> dict:
    """Compile `model` for the accelerator and the cpu; check fsim == ref per layer, the int8 cosine and the
    cpu's relative error against onnxruntime. Returns the fsim session's stats."""
    rng = np.random.default_rng(7)
    calibration = {n: rng.standard_normal((SAMPLES, *s)).astype(np.float32) for n, s in feeds_shape.items()}
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in feeds_shape.items()}
    proto = onnx.load(str(model)) if isinstance(model, (str, Path)) else model
    want = ort_run(proto, feeds)[0]

    art = weft.compile(model, target="accel", config=config, calibration=calibration)
    ref = weft.InferenceSession(art, device="ref")
    fsim = weft.InferenceSession(art, device="fsim")
    got_ref = ref.run(None, feeds, keep_intermediates=True)[0]
    got_fsim = fsim.run(None, feeds, keep_intermediates=True)[0]
    np.testing.assert_array_equal(got_fsim, got_ref)
    for node in art.graph.nodes:
        if node.attrs.get("target") == "accel":
            np.testing.assert_array_equal(fsim.intermediate(node.outputs[0]), ref.intermediate(node.outputs[0]),
                                          err_msg=node.name)
    assert cosine(got_fsim, want) >= min_cosine
    stats = fsim.stats
    assert stats["accel_mac_fraction"] >= min_accel_fraction

    cpu = weft.InferenceSession(weft.compile(model, target="cpu"), device="cpu")
    got_cpu = cpu.run(None, feeds)[0]
    assert np.abs(got_cpu - want).max() <= 1e-4 * max(np.abs(want).max(), 1e-6)
    return stats


@pytest.mark.parametrize("config", ["tiny", "default"])
def test_mobilenet_v2_inverted_residuals(config):
    stats = check_both_targets(models.mobilenet_v2(), {"input": [1, 3, 32, 32]}, config=config,
                               min_accel_fraction=0.95)
    assert any(layer["op"] == "qconv2d" and layer["target"] == "accel" for layer in stats["layers"])


@pytest.mark.parametrize("config", ["tiny", "default"])
def test_resnext_32x4d_block(config):
    check_both_targets(models.resnext(), {"input": [1, 3, 16, 16]}, config=config, min_accel_fraction=0.95)


def test_shufflenet_v2_unit_with_channel_shuffle():
    """ShuffleNetV2's stride-1 unit as torchvision exports it: Split into halves, a branch of 1x1 ->
    depthwise 3x3 -> 1x1 on one, Concat, then the shuffle as Reshape -> Transpose -> Reshape."""
    rng, inits = np.random.default_rng(1), {}
    c, half = 16, 8
    inits["split"] = np.array([half, half], np.int64)
    inits["shape5"] = np.array([1, 2, half, 8, 8], np.int64)
    inits["shape4"] = np.array([1, c, 8, 8], np.int64)
    nodes = [
        _conv("stem", "input", "s", _he(rng, c, 3, 3, 3), inits, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["s"], ["s_r"]),
        helper.make_node("Split", ["s_r", "split"], ["x1", "x2"], axis=1),
        _conv("b1", "x2", "b1", _he(rng, half, half, 1, 1), inits), helper.make_node("Relu", ["b1"], ["b1r"]),
        _conv("dw", "b1r", "dw", _he(rng, half, 1, 3, 3), inits, pads=[1, 1, 1, 1], group=half),
        _conv("b2", "dw", "b2", _he(rng, half, half, 1, 1), inits), helper.make_node("Relu", ["b2"], ["b2r"]),
        helper.make_node("Concat", ["x1", "b2r"], ["cat"], axis=1),
        helper.make_node("Reshape", ["cat", "shape5"], ["r5"]),
        helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t5", "shape4"], ["shuffled"]),
        _conv("head", "shuffled", "output", _he(rng, 10, c, 1, 1), inits),
    ]
    check_both_targets(make_model(nodes, {"input": [1, 3, 8, 8]}, {"output": None}, inits),
                       {"input": [1, 3, 8, 8]})


def test_squeeze_excitation_with_silu_and_sigmoid():
    """EfficientNet's block: conv + SiLU (x * Sigmoid(x)), then GlobalAveragePool -> 1x1 -> SiLU -> 1x1 ->
    Sigmoid gating the features with Mul."""
    rng, inits = np.random.default_rng(2), {}
    nodes = [
        _conv("stem", "input", "c", _he(rng, 16, 3, 3, 3), inits, pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["c_sig"]), helper.make_node("Mul", ["c", "c_sig"], ["act"]),
        helper.make_node("GlobalAveragePool", ["act"], ["pooled"]),
        _conv("se.reduce", "pooled", "r", _he(rng, 4, 16, 1, 1), inits),
        helper.make_node("Sigmoid", ["r"], ["r_sig"]), helper.make_node("Mul", ["r", "r_sig"], ["r_act"]),
        _conv("se.expand", "r_act", "e", _he(rng, 16, 4, 1, 1), inits),
        helper.make_node("Sigmoid", ["e"], ["gate"]),
        helper.make_node("Mul", ["act", "gate"], ["scaled"]),
        _conv("project", "scaled", "output", _he(rng, 8, 16, 1, 1), inits),
    ]
    check_both_targets(make_model(nodes, {"input": [1, 3, 12, 12]}, {"output": None}, inits),
                       {"input": [1, 3, 12, 12]})


def test_hardswish_between_convolutions():
    rng, inits = np.random.default_rng(3), {}
    nodes = [
        _conv("c1", "input", "c", _he(rng, 16, 3, 3, 3), inits, pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("HardSwish", ["c"], ["h"]),
        _conv("c2", "h", "output", _he(rng, 8, 16, 3, 3), inits, pads=[1, 1, 1, 1]),
    ]
    check_both_targets(make_model(nodes, {"input": [1, 3, 16, 16]}, {"output": None}, inits, opset=14),
                       {"input": [1, 3, 16, 16]}, min_accel_fraction=0.95)


def test_alexnet_style_lrn():
    rng, inits = np.random.default_rng(4), {}
    nodes = [
        _conv("conv1", "input", "c", _he(rng, 16, 3, 5, 5), inits, pads=[2, 2, 2, 2]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("LRN", ["r"], ["n"], size=5, alpha=1e-4, beta=0.75, bias=1.0),
        helper.make_node("MaxPool", ["n"], ["p"], kernel_shape=[3, 3], strides=[2, 2]),
        _conv("conv2", "p", "output", _he(rng, 8, 8, 3, 3), inits, pads=[1, 1, 1, 1], group=2),
    ]
    check_both_targets(make_model(nodes, {"input": [1, 3, 15, 15]}, {"output": None}, inits, opset=9),
                       {"input": [1, 3, 15, 15]}, min_accel_fraction=0.95)


def test_opset_18_reduce_mean_head():
    """`x.mean((2, 3))` then a linear layer, as PyTorch's dynamo exporter writes it at opset 18."""
    rng, inits = np.random.default_rng(5), {}
    inits["axes"] = np.array([2, 3], np.int64)
    inits["fc.weight"] = _he(rng, 10, 16)
    inits["fc.bias"] = np.zeros(10, np.float32)
    nodes = [
        _conv("conv", "input", "c", _he(rng, 16, 3, 3, 3), inits, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("ReduceMean", ["r", "axes"], ["m"], keepdims=0),
        helper.make_node("Gemm", ["m", "fc.weight", "fc.bias"], ["output"], transB=1),
    ]
    check_both_targets(make_model(nodes, {"input": [1, 3, 8, 8]}, {"output": None}, inits, opset=18),
                       {"input": [1, 3, 8, 8]})


def test_model_with_external_data(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save_model(models.MODELS["small_resnet"](), path, save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
    assert (tmp_path / "model.onnx.data").is_file()
    dims = onnx.load(str(path), load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    shape = [d.dim_value for d in dims]
    check_both_targets(path, {"input": shape}, min_accel_fraction=0.95)


def test_dropout_with_a_mask_output():
    rng, inits = np.random.default_rng(6), {}
    inits["ratio"] = np.array(0.5, np.float32)
    nodes = [
        _conv("c1", "input", "c", _he(rng, 8, 3, 3, 3), inits, pads=[1, 1, 1, 1]),
        helper.make_node("Dropout", ["c", "ratio"], ["d", "mask"]),
        helper.make_node("Relu", ["d"], ["r"]),
        _conv("c2", "r", "output", _he(rng, 8, 8, 3, 3), inits),
    ]
    check_both_targets(make_model(nodes, {"input": [1, 3, 8, 8]}, {"output": None}, inits),
                       {"input": [1, 3, 8, 8]}, min_accel_fraction=0.95)


def test_unknown_op_is_the_only_compile_error(tmp_path, capsys):
    from weft.cli import main

    nodes = [helper.make_node("Relu", ["input"], ["r"]), helper.make_node("Hardmax", ["r"], ["output"], name="hm")]
    path = tmp_path / "m.onnx"
    onnx.save(make_model(nodes, {"input": [1, 4]}, {"output": None}), path)
    assert main(["compile", str(path), "-o", str(tmp_path / "m.weft")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "node 'hm' (Hardmax)" in err[0] and "not supported" in err[0]
    assert not (tmp_path / "m.weft").exists()

