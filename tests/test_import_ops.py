"""Every op the importer learned, in the opset forms exporters write, through weft's float graph on the
reference device, against onnxruntime on random inputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import weft

from .test_frontend_util import make_model, ort_run, rand

X4 = {"x": [2, 6, 5, 7]}


def _node(op: str, inputs: list[str], outputs: list[str] | None = None, **attrs: object) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs or ["y"], name=f"the_{op.lower()}", **attrs)


def _i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def _f32(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


def assert_matches_onnxruntime(model: onnx.ModelProto, seed: int = 0, rtol: float = 1e-5, atol: float = 1e-6,
                               positive: bool = False) -> list[np.ndarray]:
    """Compile for the cpu target, run on the ref device, compare every output with onnxruntime."""
    feeds = {}
    for k, vi in enumerate(model.graph.input):
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        x = rand(*shape, seed=seed + k)
        feeds[vi.name] = np.abs(x) + np.float32(0.1) if positive else x
    want = ort_run(model, feeds)
    art = weft.compile(model, target="cpu")
    got = weft.InferenceSession(art, device="ref").run(None, feeds)
    assert len(got) == len(want)
    for name, a, b in zip([o.name for o in model.graph.output], got, want, strict=True):
        assert a.shape == b.shape, name
        assert a.dtype == b.dtype, name
        if a.dtype == np.bool_ or a.dtype.kind == "i":
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=name)
    return got


# (nodes, inputs, outputs, initializers, opset) per case; outputs None-shaped unless a test needs more
UNARY = [
    ("Sigmoid", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSigmoid", {}), ("HardSwish", {}),
    ("Tanh", {}), ("LeakyRelu", {"alpha": 0.2}), ("LeakyRelu", {}), ("Elu", {"alpha": 0.7}), ("Softplus", {}),
    ("Erf", {}), ("Exp", {}), ("Neg", {}), ("Abs", {}), ("Reciprocal", {}), ("Floor", {}), ("Ceil", {}),
    ("Round", {}), ("Sign", {}), ("Sin", {}), ("Cos", {}), ("Softsign", {}), ("Selu", {"alpha": 1.5, "gamma": 2.0}),
    ("Selu", {}), ("Celu", {"alpha": 0.5}), ("ThresholdedRelu", {"alpha": 0.3}), ("Mish", {}),
]

FIRST_OPSET = {"HardSwish": 14, "Erf": 9, "Sign": 9, "ThresholdedRelu": 10, "Round": 11, "Celu": 12, "Mish": 18}
UNARY_CASES = [(op, attrs, opset) for op, attrs in UNARY for opset in (7, 13, 22) if opset >= FIRST_OPSET.get(op, 7)]


@pytest.mark.parametrize(("op", "attrs", "opset"), UNARY_CASES,
                         ids=[f"{op}-{sorted(a)}-{v}" for op, a, v in UNARY_CASES])
def test_unary_activations(op, attrs, opset):
    model = make_model([_node(op, ["x"], **attrs)], X4, {"y": None}, opset=opset)
    assert_matches_onnxruntime(model)


@pytest.mark.parametrize("op", ["Sqrt", "Log"])
def test_unary_on_positive_inputs(op):
    assert_matches_onnxruntime(make_model([_node(op, ["x"])], X4, {"y": None}), positive=True)


@pytest.mark.parametrize("approximate", [None, "none", "tanh"])
def test_gelu_opset_20(approximate):
    attrs = {} if approximate is None else {"approximate": approximate}
    assert_matches_onnxruntime(make_model([_node("Gelu", ["x"], **attrs)], X4, {"y": None}, opset=20))


def test_gelu_written_with_erf():
    """How exporters before opset 20 write GELU: x * 0.5 * (1 + erf(x / sqrt 2))."""
    nodes = [_node("Div", ["x", "s2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["x", "p"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    inits = {"s2": _f32(np.sqrt(2)).reshape(()), "one": _f32(1).reshape(()), "half": _f32(0.5).reshape(())}
    assert_matches_onnxruntime(make_model(nodes, X4, {"y": None}, inits))


@pytest.mark.parametrize("slope", [(1, 6, 1, 1), (6, 1, 1), (1,), (7,)], ids=str)
def test_prelu_broadcasts_the_slope(slope):
    model = make_model([_node("PRelu", ["x", "s"])], X4, {"y": None}, {"s": rand(*slope, seed=3)}, opset=9)
    assert_matches_onnxruntime(model)


@pytest.mark.parametrize("op", ["Max", "Min", "Mean"])
@pytest.mark.parametrize("opset", [8, 13])
def test_variadic_max_min_broadcast(op, opset):
    inputs = {"x": [2, 6, 5, 7], "b": [6, 1, 7], "c": [1]}
    assert_matches_onnxruntime(make_model([_node(op, ["x", "b", "c"])], inputs, {"y": None}, opset=opset))


def test_range_in_a_shape_subgraph_folds():
    """Positions 0..C-1 from Range(0, Shape(x)[1], 1), as exporters write position ids."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "one"], ["c"], axis=0),
             helper.make_node("Range", ["zero", "c", "one"], ["r"]), helper.make_node("Cast", ["r"], ["f"], to=1),
             helper.make_node("Unsqueeze", ["f", "axes"], ["u"]), _node("Add", ["x", "u"])]
    inits = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "axes": _i64(1)}
    assert_matches_onnxruntime(make_model(nodes, {"x": [2, 6, 3]}, {"y": None}, inits, opset=13))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize(("opset", "axis"), [(7, None), (11, 2), (13, None), (13, 1)], ids=str)
def test_softmax_and_log_softmax_across_opsets(op, opset, axis):
    node = _node(op, ["x"], **({} if axis is None else {"axis": axis}))
    assert_matches_onnxruntime(make_model([node], X4, {"y": None}, opset=opset))


def test_pow_with_float_and_int_exponents():
    nodes = [_node("Pow", ["x", "e"], ["p"]), helper.make_node("Pow", ["p", "k"], ["y"])]
    model = make_model(nodes, {"x": [3, 4]}, {"y": None}, {"e": _f32(2.0, 0.5, 1.5, 3.0), "k": _i64(2)}, opset=15)
    assert_matches_onnxruntime(model, positive=True)


def test_comparisons_where_and_logic():
    nodes = [
        _node("Greater", ["x", "b"], ["gt"]), helper.make_node("Less", ["x", "c"], ["lt"]),
        helper.make_node("Equal", ["gt", "lt"], ["eq"]), helper.make_node("Not", ["eq"], ["ne"]),
        helper.make_node("And", ["ne", "gt"], ["both"]), helper.make_node("Where", ["both", "x", "b"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "logic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5]),
                                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [5]),
                                               helper.make_tensor_value_info("c", TensorProto.FLOAT, [3, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("ne", TensorProto.BOOL, None)])
    opsets = [helper.make_opsetid("", 13)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))
    assert_matches_onnxruntime(model)


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("select_last_index", [0, 1])
def test_argmax(keepdims, select_last_index):
    node = _node("ArgMax", ["r"], axis=1, keepdims=keepdims, select_last_index=select_last_index)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), node]  # Relu's zeros make ties
    graph = helper.make_graph(nodes, "argmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    opsets = [helper.make_opsetid("", 13)]
    assert_matches_onnxruntime(helper.make_model(graph, opset_imports=opsets,
                                                 ir_version=helper.find_min_ir_version_for(opsets)))


# ---- reductions --------------------------------------------------------------------------------------

def _axes_input_opset(op: str) -> int:
    return 13 if op == "ReduceSum" else 18


# (axes, keepdims, noop_with_empty_axes); noop_with_empty_axes comes with axes as an input
REDUCE_FORMS = [
    ([2, 3], 1, None), ([1], 0, None), ([-1], 1, None), (None, 0, None), (None, 1, 1), ([0, 2], None, None),
]
REDUCE_CASES = [(op, opset, *form) for op in ("ReduceMean", "ReduceMax", "ReduceSum", "ReduceMin")
                for opset in (7, 11, 13, 18) for form in REDUCE_FORMS
                if form[2] is None or opset >= _axes_input_opset(op)]


@pytest.mark.parametrize(("op", "opset", "axes", "keepdims", "noop"), REDUCE_CASES, ids=str)
def test_reductions_attribute_and_input_forms(op, opset, axes, keepdims, noop):
    axes_as_input = opset >= _axes_input_opset(op)
    attrs = {k: v for k, v in (("keepdims", keepdims), ("noop_with_empty_axes", noop)) if v is not None}
    inits = {}
    if axes is not None and axes_as_input:
        inits["axes"] = _i64(*axes)
        node = _node(op, ["x", "axes"], **attrs)
    else:
        node = _node(op, ["x"], **attrs, **({} if axes is None else {"axes": axes}))
    assert_matches_onnxruntime(make_model([node], X4, {"y": None}, inits, opset=opset))


def test_global_max_pool():
    assert_matches_onnxruntime(make_model([_node("GlobalMaxPool", ["x"])], X4, {"y": None}, opset=7))


def test_reduce_mean_head_as_the_dynamo_exporter_writes_it():
    """PyTorch's dynamo exporter (opset 18) writes ``x.mean((2, 3))`` + Linear as ReduceMean over an axes
    input, keepdims, then Flatten and Gemm."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("ReduceMean", ["r", "axes"], ["m"], name="mean", keepdims=1),
        helper.make_node("Flatten", ["m"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="fc", transB=1),
    ]
    inits = {"w": rand(8, 3, 3, 3, seed=1), "b": rand(8, seed=2), "axes": _i64(2, 3),
             "fc_w": rand(10, 8, seed=3), "fc_b": rand(10, seed=4)}
    model = make_model(nodes, {"x": [2, 3, 9, 9]}, {"y": [2, 10]}, inits, opset=18)
    assert_matches_onnxruntime(model, rtol=1e-4, atol=1e-5)


# ---- layout ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("perm", [None, [0, 2, 3, 1], [3, 1, 0, 2]], ids=str)
def test_transpose(perm):
    attrs = {} if perm is None else {"perm": perm}
    assert_matches_onnxruntime(make_model([_node("Transpose", ["x"], **attrs)], X4, {"y": None}, opset=7))


SPLIT_CASES = [
    # (opset, axis, split given as, split sizes or num_outputs, outputs)
    (7, 1, "attribute", [2, 4], 2), (11, -1, "attribute", [3, 1, 3], 3), (11, 1, None, None, 3),
    (13, 1, "input", [1, 5], 2), (13, 2, None, None, 5), (18, 3, "num_outputs", 3, 3), (18, 1, "num_outputs", 4, 4),
    (18, 1, "input", [2, 2, 2], 3),
]


@pytest.mark.parametrize(("opset", "axis", "form", "split", "count"), SPLIT_CASES, ids=str)
def test_split_forms(opset, axis, form, split, count):
    outs = [f"y{k}" for k in range(count)]
    inits, attrs, inputs = {}, {"axis": axis}, ["x"]
    if form == "attribute":
        attrs["split"] = split
    elif form == "input":
        inits["split"], inputs = _i64(*split), ["x", "split"]
    elif form == "num_outputs":
        attrs["num_outputs"] = split
    model = make_model([_node("Split", inputs, outs, **attrs)], X4, dict.fromkeys(outs), inits, opset=opset)
    assert_matches_onnxruntime(model)


@pytest.mark.parametrize(("shape", "target"), [([3, 1], [2, 3, 4]), ([1, 4], [3, 1]), ([2, 1, 5], [1])], ids=str)
def test_expand(shape, target):
    model = make_model([_node("Expand", ["x", "s"])], {"x": shape}, {"y": None}, {"s": _i64(*target)}, opset=8)
    assert_matches_onnxruntime(model)


def test_tile():
    model = make_model([_node("Tile", ["x", "r"])], {"x": [2, 3, 4]}, {"y": None}, {"r": _i64(2, 1, 3)}, opset=7)
    assert_matches_onnxruntime(model)


@pytest.mark.parametrize("opset", [7, 11, 13, 21])
def test_squeeze_unsqueeze_forms(opset):
    """Axes as attributes before opset 13, inputs from it; Squeeze without axes drops every 1."""
    axes_input = opset >= 13
    inits = {"ua": _i64(0, 3), "sa": _i64(2)} if axes_input else {}
    unsq = _node("Unsqueeze", ["x", "ua"] if axes_input else ["x"], ["u"], **({} if axes_input else {"axes": [0, 3]}))
    sq = helper.make_node("Squeeze", ["u", "sa"] if axes_input else ["u"], ["s"],
                          **({} if axes_input else {"axes": [2]}))
    squeeze_all = helper.make_node("Squeeze", ["s"], ["y"])
    model = make_model([unsq, sq, squeeze_all], {"x": [3, 1, 4]}, {"y": None, "s": None}, inits, opset=opset)
    got = assert_matches_onnxruntime(model)
    assert got[0].shape == (3, 4)


@pytest.mark.parametrize("opset", [7, 14])
def test_reshape_and_flatten(opset):
    nodes = [_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Flatten", ["r"], ["y"], axis=2)]
    model = make_model(nodes, X4, {"y": None}, {"shape": _i64(0, -1, 5, 1)}, opset=opset)
    assert_matches_onnxruntime(model)


def test_reshape_allowzero_attribute():
    model = make_model([_node("Reshape", ["x", "shape"], allowzero=1)], {"x": [2, 3]}, {"y": None},
                       {"shape": _i64(3, 2)}, opset=14)
    assert_matches_onnxruntime(model)


@pytest.mark.parametrize(("a", "b"), [([2, 3, 4, 5], [2, 3, 5, 6]), ([2, 3, 4, 5], [5, 6]), ([4, 5], [3, 5, 2]),
                                      ([3, 1, 4, 5], [2, 5, 3]), ([5], [2, 5, 3]), ([2, 3, 5], [5])], ids=str)
def test_matmul_with_batch_dimensions(a, b):
    model = make_model([_node("MatMul", ["a", "b"])], {"a": a, "b": b}, {"y": None}, opset=9)
    assert_matches_onnxruntime(model, rtol=1e-5, atol=1e-5)


# ---- Resize and Upsample -----------------------------------------------------------------------------


# Upsample (opsets 7-9) only grows; Resize-10 also shrinks
UPSAMPLE_CASES = [(opset, scales, mode) for opset in (7, 9, 10) for mode in ("nearest", "linear")
                  for scales in ([1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 3.0, 1.5], [1.0, 1.0, 0.5, 0.6])
                  if opset == 10 or min(scales) >= 1]


@pytest.mark.parametrize(("opset", "scales", "mode"), UPSAMPLE_CASES, ids=str)
def test_upsample_and_resize_10(opset, scales, mode):
    if opset == 7:
        node = _node("Upsample", ["x"], mode=mode, scales=scales)
        inits = {}
    else:
        node = _node("Upsample" if opset == 9 else "Resize", ["x", "scales"], mode=mode)
        inits = {"scales": _f32(*scales)}
    assert_matches_onnxruntime(make_model([node], {"x": [1, 2, 5, 6]}, {"y": None}, inits, opset=opset))


RESIZE_MODES = [
    ("nearest", "asymmetric", "floor"), ("nearest", "half_pixel", "round_prefer_floor"),
    ("nearest", "align_corners", "round_prefer_ceil"), ("nearest", "pytorch_half_pixel", "ceil"),
    ("nearest", "tf_half_pixel_for_nn", "round_prefer_floor"), ("linear", "half_pixel", None),
    ("linear", "asymmetric", None), ("linear", "align_corners", None), ("linear", "pytorch_half_pixel", None),
    ("linear", "half_pixel_symmetric", None), ("cubic", "half_pixel", None), ("cubic", "align_corners", None),
    ("cubic", "asymmetric", None), ("cubic", "pytorch_half_pixel", None),
]


@pytest.mark.parametrize(("mode", "transform", "nearest"), RESIZE_MODES, ids=str)
@pytest.mark.parametrize("target", [("scales", [1, 1, 2, 1.5]), ("scales", [1, 1, 0.6, 0.5]),
                                    ("sizes", [1, 2, 9, 1]), ("sizes", [1, 2, 3, 13])], ids=str)
@pytest.mark.parametrize("opset", [11, 13, 19])
def test_resize_11_and_later(opset, target, mode, transform, nearest):
    attrs = {"mode": mode, "coordinate_transformation_mode": transform}
    if nearest is not None:
        attrs["nearest_mode"] = nearest
    kind, values = target
    inits = {"roi": np.zeros(0, np.float32)}
    if kind == "scales":
        inits["scales"] = _f32(*values)
        inputs = ["x", "roi", "scales"]
    else:
        inits.update(scales=np.zeros(0, np.float32), sizes=_i64(*values))
        inputs = ["x", "roi", "scales", "sizes"]
    if opset >= 13 and kind == "sizes":
        inputs[1:3] = ["", ""]
    model = make_model([_node("Resize", inputs, **attrs)], {"x": [1, 2, 5, 6]}, {"y": None}, inits, opset=opset)
    assert_matches_onnxruntime(model)


@pytest.mark.parametrize("attrs", [{"exclude_outside": 1}, {"cubic_coeff_a": -0.5},
                                   {"cubic_coeff_a": -0.5, "exclude_outside": 1}], ids=str)
@pytest.mark.parametrize("scales", [[1, 1, 2, 1.5], [1, 1, 0.6, 0.5]], ids=str)
def test_resize_cubic_options(attrs, scales):
    node = _node("Resize", ["x", "", "scales"], mode="cubic", **attrs)
    model = make_model([node], {"x": [1, 2, 5, 6]}, {"y": None}, {"scales": _f32(*scales)}, opset=13)
    assert_matches_onnxruntime(model, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("transform", ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"])
@pytest.mark.parametrize("target", [("scales", [1, 1, 0.6, 0.5]), ("scales", [1, 1, 0.3, 1.5]),
                                    ("sizes", [1, 2, 2, 3])], ids=str)
def test_resize_antialias_18(mode, transform, target):
    inits = {"scales": _f32(*target[1])} if target[0] == "scales" else {"sizes": _i64(*target[1])}
    inputs = ["x", "", "scales"] if target[0] == "scales" else ["x", "", "", "sizes"]
    node = _node("Resize", inputs, mode=mode, antialias=1, coordinate_transformation_mode=transform)
    model = make_model([node], {"x": [1, 2, 9, 10]}, {"y": None}, inits, opset=18)
    assert_matches_onnxruntime(model, atol=1e-5)


def test_resize_19_with_axes():
    node = _node("Resize", ["x", "", "scales"], mode="linear", axes=[3, 2])
    model = make_model([node], {"x": [1, 2, 5, 6]}, {"y": None}, {"scales": _f32(2, 3)}, opset=19)
    assert_matches_onnxruntime(model)


# ---- neural-network ops ------------------------------------------------------------------------------


@pytest.mark.parametrize("attrs", [{"size": 3}, {"size": 5, "alpha": 2e-3, "beta": 0.6, "bias": 2.0},
                                   {"size": 1, "alpha": 0.1}], ids=str)
def test_lrn(attrs):
    """AlexNet's LRN (onnxruntime refuses even sizes; weft follows ONNX's window for them)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), _node("LRN", ["c"], **attrs)]
    model = make_model(nodes, {"x": [2, 3, 7, 7]}, {"y": None}, {"w": rand(6, 3, 3, 3, seed=2)}, opset=7)
    assert_matches_onnxruntime(model, rtol=2e-5)


CONV_TRANSPOSE = [
    {}, {"strides": [2, 2]}, {"strides": [2, 3], "pads": [1, 0, 1, 2]},
    {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, {"group": 2},
    {"group": 3, "strides": [3, 2], "output_padding": [2, 1]}, {"strides": [2, 2], "output_shape": [12, 14]},
    {"strides": [2, 2], "output_shape": [10, 12]},
    {"strides": [2, 2], "output_shape": [10, 12], "auto_pad": "SAME_UPPER"},
    {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
    {"dilations": [2, 1]},
]


@pytest.mark.parametrize("attrs", CONV_TRANSPOSE, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose(attrs, bias):
    group = attrs.get("group", 1)
    inits = {"w": rand(6, 4 // (2 if group == 2 else 1) if group != 3 else 2, 3, 3, seed=5)}
    inputs = ["x", "w"]
    if bias:
        inits["b"] = rand(inits["w"].shape[1] * group, seed=6)
        inputs.append("b")
    model = make_model([_node("ConvTranspose", inputs, **attrs)], {"x": [2, 6, 5, 6]}, {"y": None}, inits, opset=11)
    assert_matches_onnxruntime(model, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs", [{}, {"strides": [3], "pads": [1, 2], "output_padding": [1]}, {"group": 2},
                                   {"strides": [2], "output_shape": [12]}, {"strides": [2], "auto_pad": "SAME_UPPER"}],
                         ids=str)
def test_conv_transpose_1d(attrs):
    inits = {"w": rand(6, 2, 3, seed=5), "b": rand(2 * attrs.get("group", 1), seed=6)}
    model = make_model([_node("ConvTranspose", ["x", "w", "b"], **attrs)], {"x": [2, 6, 6]}, {"y": None}, inits,
                       opset=11)
    assert_matches_onnxruntime(model, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [7, 13])
def test_instance_normalization(opset):
    node = _node("InstanceNormalization", ["x", "s", "b"], epsilon=1e-3)
    model = make_model([node], X4, {"y": None}, {"s": rand(6, seed=1), "b": rand(6, seed=2)}, opset=opset)
    assert_matches_onnxruntime(model, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("axis", "stats"), [(-1, False), (1, True), (2, True), (-2, False)])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_normalization(axis, stats, bias):
    x = [2, 6, 5, 7]
    norm = x[axis:]
    inits = {"s": rand(*norm, seed=1)}
    inputs = ["x", "s"]
    if bias:
        inits["b"] = rand(*norm, seed=2)
        inputs.append("b")
    outs = ["y", "mean", "inv"] if stats else ["y"]
    node = _node("LayerNormalization", inputs, outs, axis=axis, epsilon=1e-4)
    model = make_model([node], {"x": x}, dict.fromkeys(outs), inits, opset=17)
    assert_matches_onnxruntime(model, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [7, 11])
def test_batch_normalization_of_opset_7_with_spatial(opset):
    attrs = {"spatial": 1} if opset < 9 else {}
    inits = {"s": rand(6, seed=1), "b": rand(6, seed=2), "m": rand(6, seed=3), "v": np.abs(rand(6, seed=4)) + 0.5}
    node = _node("BatchNormalization", ["x", "s", "b", "m", "v"], epsilon=1e-3, **attrs)
    assert_matches_onnxruntime(make_model([node], X4, {"y": None}, inits, opset=opset), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [7, 10, 12, 13, 22])
def test_dropout_with_its_mask_output(opset):
    """The mask is all true at inference from opset 12; onnxruntime's is all false (zeros before opset 10,
    where it has the input's type) for the older forms."""
    inputs, inits = ["x"], {}
    if opset >= 12:
        inputs, inits = ["x", "ratio"], {"ratio": np.array(0.3, np.float32)}
    nodes = [_node("Dropout", inputs, ["d", "mask"], **({"ratio": 0.3} if opset < 12 else {})),
             helper.make_node("Relu", ["d"], ["y"])]
    mask_type = TensorProto.BOOL if opset >= 10 else TensorProto.FLOAT
    graph = helper.make_graph(nodes, "drop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6]),
                               helper.make_tensor_value_info("mask", mask_type, [2, 6])],
                              [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))
    assert assert_matches_onnxruntime(model)[1].all() == (opset >= 12)


def test_hardswish_mobilenet_block():
    """MobileNetV3's conv + HardSwish + HardSigmoid squeeze-excite gate."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["c"], ["h"], name="hswish"),
        helper.make_node("GlobalAveragePool", ["h"], ["g"], name="gap"),
        helper.make_node("HardSigmoid", ["g"], ["gate"], name="hsig", alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["h", "gate"], ["y"], name="scale"),
    ]
    inits = {"w": rand(8, 3, 3, 3, seed=1), "b": rand(8, seed=2)}
    assert_matches_onnxruntime(make_model(nodes, {"x": [1, 3, 8, 8]}, {"y": None}, inits, opset=14), atol=1e-5)


def test_every_imported_op_has_a_float_definition():
    """What the importer accepts, the float graph can infer, fold and run (Constant, Sum, Dropout,
    Upsample and the QLinear / Integer ops become other ops at import)."""
    from weft.compiler.onnx_import import SUPPORTED_OPS
    from weft.core.float_ops import FLOAT_OPS

    rewritten = {"Constant", "Sum", "Dropout", "Upsample", "QLinearConv", "QLinearMatMul", "ConvInteger",
                 "MatMulInteger"}
    assert SUPPORTED_OPS - rewritten <= set(FLOAT_OPS)
    assert {"Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "LeakyRelu", "PRelu", "Elu", "Softplus", "Erf", "Gelu",
            "Max", "Min", "Pow", "Sqrt", "Exp", "Neg", "Abs", "Reciprocal", "ReduceMean", "ReduceMax", "ReduceSum",
            "GlobalMaxPool", "LRN", "Transpose", "Split", "Expand", "Tile", "Resize", "Upsample", "ConvTranspose",
            "InstanceNormalization", "LayerNormalization", "Equal", "Where", "Less", "Greater", "And", "Not",
            "ArgMax"} <= SUPPORTED_OPS


def test_shape_subgraphs_on_new_ops_fold_away():
    """A Resize whose sizes come from Shape -> Slice -> Concat -> Cast, and an Expand to the Shape of another
    tensor, fold to constants before the float graph runs."""
    from weft.compiler import passes
    from weft.compiler.onnx_import import import_onnx

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["s", "zero", "two"], ["nc"]),
        helper.make_node("Mul", ["hw", "two"], ["hw2"]), helper.make_node("Concat", ["nc", "hw2"], ["sizes"], axis=0),
        _node("Resize", ["x", "", "", "sizes"], ["r"], mode="nearest"),
        helper.make_node("Shape", ["r"], ["rs"]), helper.make_node("Expand", ["b", "rs"], ["e"]),
        helper.make_node("Add", ["r", "e"], ["y"]),
    ]
    inits = {"zero": _i64(0), "two": _i64(2), "hw": _i64(3, 4), "b": rand(1, 1, 1, 8, seed=4)}
    model = make_model(nodes, {"x": [1, 2, 3, 4]}, {"y": None}, inits, opset=13)
    graph = passes.fold_constants(passes.infer_shapes(import_onnx(model)))
    assert [n.op for n in graph.nodes] == ["Resize", "Add"]
    assert_matches_onnxruntime(model)


@pytest.mark.parametrize("opset", [7, 8])
@pytest.mark.parametrize("builder", ["vgg_small", "awkward_cnn", "mlp", "small_resnet"])
def test_test_models_converted_down_to_opsets_7_and_8(builder, opset):
    """Whole models in their opset-7/8 forms (BatchNormalization with spatial, Dropout with ratio, Clip and
    Pad attributes), written by onnx's version converter."""
    from onnx import version_converter

    from weft.compiler import models

    model = version_converter.convert_version(models.MODELS[builder](opset=9), opset)
    assert model.opset_import[0].version == opset
    assert_matches_onnxruntime(model, rtol=1e-4, atol=1e-5)


def test_conv_transpose_counts_its_macs():
    from weft.core.float_ops import macs_of
    from weft.core.ir import Node

    node = Node("ConvTranspose", ["x", "w"], ["y"], {"group": 2}, "up")
    # 2x6x5x5 inputs, each meeting 4 output channels (of its group) x 3x3 taps
    assert macs_of(node, [(2, 6, 5, 5), (6, 4, 3, 3)], [(2, 8, 7, 7)]) == 2 * 6 * 5 * 5 * 4 * 9


def test_transformer_block_as_exporters_write_it():
    """Self-attention + MLP in opset 20: LayerNormalization, batched MatMul, Split with num_outputs,
    Reshape/Transpose into heads, Softmax, Gelu and a residual, all on the float graph."""
    d, heads = 8, 2
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g1", "b1"], ["n1"], axis=-1),
        helper.make_node("MatMul", ["n1", "w_qkv"], ["qkv"]),
        helper.make_node("Split", ["qkv"], ["q", "k", "v"], axis=-1, num_outputs=3),
        *[helper.make_node("Reshape", [t, "heads"], [f"{t}h"]) for t in "qkv"],
        *[helper.make_node("Transpose", [f"{t}h"], [f"{t}t"], perm=[0, 2, 1, 3]) for t in "qv"],
        helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["qt", "kt"], ["att"]),
        helper.make_node("Mul", ["att", "inv_sqrt"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vt"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merged"], ["ctx_m"]),
        helper.make_node("Add", ["x", "ctx_m"], ["r1"]),
        helper.make_node("LayerNormalization", ["r1", "g2", "b2"], ["n2"], axis=-1),
        helper.make_node("MatMul", ["n2", "w1"], ["h"]),
        helper.make_node("Gelu", ["h"], ["a"], approximate="tanh"),
        helper.make_node("MatMul", ["a", "w2"], ["m"]),
        helper.make_node("Add", ["r1", "m"], ["y"]),
    ]
    inits = {"g1": rand(d, seed=1), "b1": rand(d, seed=2), "w_qkv": rand(d, 3 * d, seed=3, scale=0.3),
             "heads": _i64(0, 0, heads, d // heads), "inv_sqrt": np.array(1 / np.sqrt(d // heads), np.float32),
             "merged": _i64(0, 0, d), "g2": rand(d, seed=4), "b2": rand(d, seed=5),
             "w1": rand(d, 4 * d, seed=6, scale=0.3), "w2": rand(4 * d, d, seed=7, scale=0.3)}
    model = make_model(nodes, {"x": [2, 5, d]}, {"y": [2, 5, d]}, inits, opset=20)
    assert_matches_onnxruntime(model, rtol=1e-4, atol=1e-5)


def test_nodes_the_importer_adds_do_not_take_the_models_node_names():
    nodes = [helper.make_node("Dropout", ["x", "ratio"], ["d", "mask"], name="drop"),
             helper.make_node("Relu", ["d"], ["y"], name="drop_mask"),
             helper.make_node("Not", ["mask"], ["nm"], name="drop_mask_shape")]
    model = make_model(nodes, {"x": [2, 3]}, {"y": None}, {"ratio": np.array(0.5, np.float32)})
    from weft.compiler.onnx_import import import_onnx

    ops = {n.name: n.op for n in import_onnx(model).nodes}
    assert len(ops) == 5 and (ops["drop"], ops["drop_mask"], ops["drop_mask_shape"]) == ("Identity", "Relu", "Not")
    assert_matches_onnxruntime(model)
