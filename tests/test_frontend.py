"""ONNX import across opsets 9 to current: every supported op, checked against onnxruntime in float
(target cpu) and in int8 (target accel, on the reference device)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import weft
from weft.compiler import models
from weft.compiler.onnx_import import MAX_OPSET, SUPPORTED_OPS, import_onnx

from .test_frontend_util import cosine, make_model, ort_run, rand

#: Newest opset this onnxruntime runs (the newest onnx knows is checked against it, same weights).
ORT_MAX = 26
OPSETS = [9, 11, 13, 17, ORT_MAX]


def _run(artifact: weft.runtime.Artifact, feeds: dict) -> list[np.ndarray]:
    return weft.InferenceSession(artifact, device="ref").run(None, feeds)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("builder", ["awkward_cnn", "reshape_net", "vgg_small", "mlp"])
def test_models_across_opsets_match_onnxruntime(builder, opset):
    model = models.MODELS[builder](opset=opset)
    name = model.graph.input[0].name
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = rand(*shape, seed=opset)
    expected = ort_run(model, {name: x})[0]
    float_out = _run(weft.compile(model, target="cpu"), {name: x})[0]
    np.testing.assert_allclose(float_out, expected, rtol=1e-4, atol=1e-5)
    calibration = {name: rand(16, *shape, seed=100 + opset)}
    int_out = _run(weft.compile(model, calibration=calibration), {name: x})[0]
    assert cosine(int_out, expected) >= 0.99


def test_newest_opset_imports_like_the_previous_one():
    newest = models.awkward_cnn(opset=MAX_OPSET)
    older = models.awkward_cnn(opset=ORT_MAX)
    x = rand(1, 3, 29, 29)
    expected = ort_run(older, {"input": x})[0]
    np.testing.assert_allclose(_run(weft.compile(newest, target="cpu"), {"input": x})[0], expected, rtol=1e-4,
                               atol=1e-5)


def _single_op_model(opset: int) -> tuple:
    """One graph exercising the ops the model builders do not: Sub, Div, Softmax on a 4-D tensor (its
    meaning changed at opset 13), SAME padding, ceil-mode pooling, Slice, Squeeze, Cast, a batched MatMul,
    Clip spelled per opset, and AveragePool that does not count pads."""
    rng = np.random.default_rng(opset)
    w = rng.standard_normal((6, 3, 3, 3)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], auto_pad="SAME_UPPER", strides=[2, 2]),
        helper.make_node("Sub", ["c", "k"], ["s"]),
        helper.make_node("Div", ["s", "k2"], ["d"]),
        helper.make_node("MaxPool", ["d"], ["m"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
        if opset >= 10 else helper.make_node("MaxPool", ["d"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["d"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=0),
        helper.make_node("Softmax", ["a"], ["sm"], axis=1),
        helper.make_node("MatMul", ["sm", "mm"], ["mmo"]),
        helper.make_node("Cast", ["mmo"], ["cast"], to=1),
    ]
    if opset >= 11:
        nodes.append(helper.make_node("Clip", ["cast", "lo", ""], ["clip"]))
    else:
        nodes.append(helper.make_node("Clip", ["cast"], ["clip"], min=-0.2))
    inits = {"w": w, "k": np.float32(0.1), "k2": rng.uniform(1, 2, (1, 6, 1, 1)).astype(np.float32),
             "mm": rng.standard_normal((6, 4)).astype(np.float32), "lo": np.float32(-0.2)}
    model = make_model(nodes, {"x": [2, 3, 12, 11]}, {"m": None, "clip": None}, inits, opset=opset)
    return model, {"x": rand(2, 3, 12, 11, seed=opset)}


@pytest.mark.parametrize("opset", [9, 11, 13, ORT_MAX])
def test_op_variants_match_onnxruntime(opset):
    model, feeds = _single_op_model(opset)
    expected = ort_run(model, feeds)
    for got, want in zip(_run(weft.compile(model, target="cpu"), feeds), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    art = weft.compile(model, calibration={"x": rand(3, 2, 3, 12, 11, seed=7)})
    for got, want in zip(_run(art, feeds), expected, strict=True):
        assert cosine(got, want) >= 0.99


def test_softmax_axis_meaning_follows_the_opset():
    """Softmax(axis=1) on (N, C, H, W): over C*H*W before opset 13, over C from 13 on."""
    x = rand(1, 2, 3, 4)
    for opset in (11, 13):
        model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": [1, 2, 3, 4]}, {"y": None},
                           opset=opset)
        got = _run(weft.compile(model, target="cpu"), {"x": x})[0]
        np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
        total = got.sum(axis=(1, 2, 3)) if opset == 11 else got.sum(axis=1)
        np.testing.assert_allclose(total, 1.0, rtol=1e-5)


def test_dynamic_batch_is_fixed_by_calibration_data_or_defaults_to_one():
    w = rand(8, 4, seed=1)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": ["N", 8]}, {"y": None}, {"w": w})
    assert weft.compile(model, target="cpu").graph.values["x"].shape == (1, 8)
    art = weft.compile(model, calibration={"x": rand(3, 5, 8)})
    assert art.graph.values["x"].shape == (5, 8)
    art = weft.compile(model, target="cpu", input_shapes={"x": (7, 8)})
    x = rand(7, 8)
    np.testing.assert_allclose(_run(art, {"x": x})[0], x @ w, rtol=1e-5, atol=1e-6)


def test_supported_ops_are_the_issue_list():
    wanted = {
        "Conv", "Gemm", "MatMul", "Relu", "Clip", "Add", "Sum", "Mul", "BatchNormalization", "MaxPool",
        "AveragePool", "GlobalAveragePool", "Flatten", "Reshape", "Concat", "Pad", "Softmax", "Dropout",
        "Identity", "Constant", "ConstantOfShape", "Shape", "Gather", "Unsqueeze", "Squeeze", "Slice", "Cast",
    }
    assert wanted <= SUPPORTED_OPS


def test_import_names_nodes_uniquely_and_keeps_graph_names():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Relu", ["b"], ["c"], name="r")]
    graph = import_onnx(make_model(nodes, {"x": [1, 4]}, {"c": None}))
    assert [n.name for n in graph.nodes] == ["Relu_0", "Relu_1", "r"]
    assert graph.inputs == ["x"] and graph.outputs == ["c"]


def test_samples_along_the_batch_axis_leave_a_dynamic_batch_at_one():
    w = rand(8, 4, seed=1)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": ["N", 8]}, {"y": None}, {"w": w})
    art = weft.compile(model, calibration={"x": rand(40, 8)})
    assert art.graph.values["x"].shape == (1, 8) and art.meta["calibration"]["batches"] == 40


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("pads", [(0, 0, 0, 0), (1, 1, 1, 1), (0, 1, 1, 0)])
@pytest.mark.parametrize("ceil_mode", [0, 1])
def test_average_pool_divisors_match_onnxruntime(count_include_pad, pads, ceil_mode):
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=list(pads),
                            ceil_mode=ceil_mode, count_include_pad=count_include_pad, name="pool")
    model = make_model([node], {"x": [1, 2, 8, 7]}, {"y": None})
    x = rand(1, 2, 8, 7)
    want = ort_run(model, {"x": x})[0]
    np.testing.assert_allclose(_run(weft.compile(model, target="cpu"), {"x": x})[0], want, rtol=1e-5, atol=1e-6)
    art = weft.compile(model, calibration={"x": rand(4, 1, 2, 8, 7, seed=1)})
    uniform = (count_include_pad or not any(pads)) and not ceil_mode
    assert art.graph.node("pool").op == ("qavgpool" if uniform else "AveragePool")
    assert cosine(_run(art, {"x": x})[0], want) > 0.99


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("op", ["Conv", "MaxPool", "AveragePool"])
def test_auto_pad_matches_onnxruntime(mode, op):
    inputs = ["x", "w"] if op == "Conv" else ["x"]
    node = helper.make_node(op, inputs, ["y"], auto_pad=mode, strides=[2, 2], kernel_shape=[4, 4])
    model = make_model([node], {"x": [1, 2, 9, 8]}, {"y": None}, {"w": rand(3, 2, 4, 4)} if op == "Conv" else {})
    x = rand(1, 2, 9, 8)
    np.testing.assert_allclose(_run(weft.compile(model, target="cpu"), {"x": x})[0], ort_run(model, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)
