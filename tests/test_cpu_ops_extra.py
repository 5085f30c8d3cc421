"""The cpu backend's kernels for grouped and depthwise convolutions, activations, broadcasting Max/Min/Pow,
reductions and transposes, and its numpy fallback, on IR graphs built directly, against numpy (float64
where the op is transcendental) and the float reference kernels."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper

import weft
from weft.compiler.llvm.cuda import gpu_steps
from weft.compiler.llvm.graph import cross_compile, plan_graph
from weft.core.errors import UnsupportedError
from weft.core.float_ops import FLOAT_OPS, OpDef, fused_conv
from weft.core.ir import Graph, Node, Value
from weft.runtime import InferenceSession

from .test_frontend_util import make_model, ort_run

RTOL = 1e-4


def graph_of(op: str, feeds: dict[str, np.ndarray], out_shape: tuple[int, ...], attrs: dict | None = None,
             consts: dict[str, np.ndarray] | None = None, inputs: list[str] | None = None) -> Graph:
    """One node reading `inputs` (default: the feeds, then the constants) into output "y"."""
    consts = consts or {}
    names = inputs if inputs is not None else [*feeds, *consts]
    g = Graph("t", inputs=list(feeds), outputs=["y"], nodes=[Node(op, names, ["y"], attrs or {}, name="n0")],
              values={k: Value(k, v.shape, str(v.dtype)) for k, v in feeds.items()})
    g.values["y"] = Value("y", out_shape, "float32")
    for k, v in consts.items():
        g.set_constant(k, v)
    return g


def run_plan(g: Graph, feeds: dict[str, np.ndarray], threads: int = 2) -> tuple[np.ndarray, list[dict]]:
    plan = plan_graph(g)
    outs, layers = plan.run(feeds, threads=threads, timings=True)
    return outs["y"], layers


def close(got: np.ndarray, want: np.ndarray, rtol: float = RTOL) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = np.maximum(np.abs(want), 1.0)
    err = float(np.max(np.abs(got.astype(np.float64) - want) / scale))
    assert err <= rtol, f"relative error {err:.3g}"


def rand(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# ---- grouped and depthwise convolution ---------------------------------------------------------------


def conv_case(n: int, c: int, o: int, hw: int, k: int, stride: int, group: int, act: str = "none",
              clip: tuple | None = None, residual: bool = False, seed: int = 0) -> None:
    pad = k // 2
    attrs = {"strides": (stride, stride), "pads": (pad,) * 4, "group": group, "act": act}
    if clip is not None:
        attrs["clip"] = clip
    x = rand(n, c, hw, hw, seed=seed)
    consts = {"w": rand(o, c // group, k, k, seed=seed + 1, scale=0.3), "b": rand(o, seed=seed + 2)}
    out_hw = (hw + 2 * pad - k) // stride + 1
    feeds = {"x": x}
    names = ["x", "w", "b"]
    if residual:
        feeds["r"] = rand(n, o, out_hw, out_hw, seed=seed + 3)
        names.append("r")
    g = graph_of("FusedConv", feeds, (n, o, out_hw, out_hw), attrs, consts, inputs=names)
    node = g.nodes[0]
    want = fused_conv(node, x, consts["w"], consts["b"], feeds.get("r"))
    got, layers = run_plan(g, feeds)
    close(got, want)
    assert all(layer["kernel"] == "llvm" for layer in layers)


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_3x3_relu6(stride):
    conv_case(1, 24, 24, 13, 3, stride, group=24, act="clip", clip=(0.0, 6.0))


def test_depthwise_with_residual_and_chained_halo():
    conv_case(2, 16, 16, 8, 3, 1, group=16, residual=True, act="relu")
    # a depthwise layer reading a convolution's output (written inside a zero halo) and feeding another
    x = rand(1, 16, 9, 9)
    w1, w2, w3 = rand(16, 16, 1, 1, seed=1), rand(16, 1, 3, 3, seed=2), rand(32, 16, 1, 1, seed=3)
    conv = {"strides": (1, 1), "act": "relu"}
    g = Graph("chain", inputs=["x"], outputs=["y"], nodes=[
        Node("FusedConv", ["x", "w1", ""], ["a"], {**conv, "pads": (0, 0, 0, 0)}, name="pw"),
        Node("FusedConv", ["a", "w2", ""], ["d"], {**conv, "pads": (1, 1, 1, 1), "group": 16}, name="dw"),
        Node("FusedConv", ["d", "w3", ""], ["y"], {**conv, "pads": (0, 0, 0, 0)}, name="pw2")],
        values={"x": Value("x", x.shape), "a": Value("a", (1, 16, 9, 9)), "d": Value("d", (1, 16, 9, 9)),
                "y": Value("y", (1, 32, 9, 9))},
        constants={"w1": w1, "w2": w2, "w3": w3})
    want = x
    for node, w in zip(g.nodes, (w1, w2, w3), strict=True):
        want = fused_conv(node, want, w, None, None)
    got, _ = run_plan(g, {"x": x})
    close(got, want)


def test_grouped_layers_write_halos_for_padded_readers():
    """dw -> grouped -> dw, each padded: every producer writes its output inside the next one's zeros."""
    x = rand(1, 16, 7, 7)
    ws = [rand(16, 1, 3, 3, seed=1), rand(16, 4, 3, 3, seed=2), rand(16, 1, 3, 3, seed=3)]
    attrs = {"strides": (1, 1), "pads": (1, 1, 1, 1), "act": "relu"}
    names = ["x", "a", "b", "y"]
    g = Graph("halo", inputs=["x"], outputs=["y"], nodes=[
        Node("FusedConv", [names[k], f"w{k}", ""], [names[k + 1]], {**attrs, "group": grp}, name=f"c{k}")
        for k, grp in enumerate((16, 4, 16))],
        values={n: Value(n, x.shape) for n in names}, constants={f"w{k}": w for k, w in enumerate(ws)})
    plan = plan_graph(g)
    assert {t.name: t.layout.halo for t in plan.tensors if t.name in ("a", "b")} == {"a": 1, "b": 1}
    want = x
    for node, w in zip(g.nodes, ws, strict=True):
        want = fused_conv(node, want, w, None, None)
    close(plan.run({"x": x})[0]["y"], want)


@pytest.mark.parametrize("channels", [7, 12])
def test_depthwise_narrow_blocks(channels):
    conv_case(2, channels, channels, 6, 3, 2, group=channels, act="relu")


def test_grouped_3x3_group32():
    conv_case(1, 128, 128, 10, 3, 1, group=32, act="relu", residual=True)


def test_grouped_1x1_group4_shufflenet():
    conv_case(1, 48, 96, 7, 1, 1, group=4)
    conv_case(1, 12, 24, 7, 3, 2, group=3, act="relu")  # groups of 4 input channels: blocks of 4


def test_depthwise_channel_multiplier():
    conv_case(1, 8, 16, 6, 3, 1, group=8)


def test_onnx_depthwise_and_grouped_against_onnxruntime():
    """Through the importer and the cpu device: depthwise stride 2 with ReLU6, then a grouped 3x3."""
    inits = {"w": rand(16, 1, 3, 3, seed=1, scale=0.3), "b": rand(16, seed=2), "w2": rand(32, 4, 3, 3, seed=3),
             "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=16, pads=[1] * 4, strides=[2, 2],
                              kernel_shape=[3, 3]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["d"]),
             helper.make_node("Conv", ["d", "w2"], ["y"], group=4, pads=[1] * 4, kernel_shape=[3, 3])]
    model = make_model(nodes, {"x": [1, 16, 9, 9]}, {"y": None}, inits)
    feeds = {"x": rand(1, 16, 9, 9)}
    sess = InferenceSession(weft.compile(model, target="cpu"), device="cpu", threads=2)
    close(sess.run(None, feeds)[0], ort_run(model, feeds)[0])


# ---- element-wise ops ----------------------------------------------------------------------------------


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(x.astype(np.float64))


UNARY = {
    "Sigmoid": ({}, lambda x: 1 / (1 + np.exp(-x))),
    "Tanh": ({}, np.tanh),
    "HardSigmoid": ({"alpha": 0.3}, lambda x: np.clip(0.3 * x + 0.5, 0, 1)),
    "HardSwish": ({}, lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
    "LeakyRelu": ({}, lambda x: np.where(x < 0, 0.01 * x, x)),
    "Elu": ({"alpha": 0.7}, lambda x: np.where(x > 0, x, 0.7 * np.expm1(x))),
    "Softplus": ({}, lambda x: np.logaddexp(0, x)),
    "Exp": ({}, np.exp),
    "Sqrt": ({}, lambda x: np.sqrt(np.abs(x))),
    "Neg": ({}, np.negative),
    "Abs": ({}, np.abs),
    "Reciprocal": ({}, lambda x: 1 / x),
    "Erf": ({}, _erf),
    "Gelu": ({}, lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))),
    "GeluTanh": ({"approximate": "tanh"},
                 lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_activation(name):
    attrs, ref = UNARY[name]
    x = rand(2, 3, 5, 7, scale=3.0)
    x.flat[:6] = [1e-7, -1e-7, 3e-4, -3e-4, 25.0, -25.0]  # where naive formulas cancel or overflow
    if name == "Sqrt":
        x = np.abs(x)
    if name == "Exp":
        x = np.clip(x, -20, 20)
    op = "Gelu" if name == "GeluTanh" else name
    got, layers = run_plan(graph_of(op, {"x": x}, x.shape, attrs), {"x": x})
    want = ref(x.astype(np.float64))
    assert layers[0]["kernel"] == "llvm"
    # relative to each element: float32 rounding, not the 1e-4 of the whole suite (Gelu's float64
    # references cancel in 1 + erf and 1 + tanh: about 1e-16 absolute)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-15 if op == "Gelu" else 1e-30)


def test_prelu_slope_per_channel():
    x = rand(1, 16, 4, 4)
    slope = rand(16, 1, 1, seed=1)
    got, _ = run_plan(graph_of("PRelu", {"x": x}, x.shape, consts={"s": slope}), {"x": x})
    close(got, np.where(x < 0, slope * x, x))


@pytest.mark.parametrize("op,ref", [("Max", np.maximum), ("Min", np.minimum)])
def test_max_min_variadic_broadcasting(op, ref):
    a, b, c = rand(2, 3, 4, 5), rand(4, 1, seed=1), rand(1, 3, 1, 5, seed=2)
    feeds = {"a": a, "b": b, "c": c}
    got, _ = run_plan(graph_of(op, feeds, (2, 3, 4, 5)), feeds)
    close(got, ref(ref(a, b), c))


def test_pow_broadcasting_and_int_exponent():
    a, b = np.abs(rand(3, 4, 5)) + 0.1, rand(4, 1, seed=1)
    feeds = {"a": a, "b": b}
    got, _ = run_plan(graph_of("Pow", feeds, a.shape), feeds)
    close(got, np.power(a.astype(np.float64), b))
    x = rand(2, 8)
    got, _ = run_plan(graph_of("Pow", {"x": x}, x.shape, consts={"e": np.array(3, np.int64)}), {"x": x})
    close(got, x.astype(np.float64) ** 3)


# ---- reductions, pools, transposes -------------------------------------------------------------------


@pytest.mark.parametrize("op,axes,keep", [("ReduceMean", [2, 3], 1), ("ReduceSum", [1], 0),
                                          ("ReduceMax", [-1], 1), ("ReduceMean", [0, 2], 0)])
def test_reductions(op, axes, keep):
    x = rand(2, 3, 4, 5)
    ref = {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max}[op]
    want = ref(x.astype(np.float64), axis=tuple(axes), keepdims=bool(keep))
    g = graph_of(op, {"x": x}, want.shape, {"keepdims": keep}, consts={"axes": np.array(axes, np.int64)})
    got, _ = run_plan(g, {"x": x})
    close(got, want)


def test_reduce_all_and_noop():
    x = rand(3, 4)
    got, _ = run_plan(graph_of("ReduceSum", {"x": x}, (1, 1)), {"x": x})
    close(got, x.astype(np.float64).sum(keepdims=True))
    got, _ = run_plan(graph_of("ReduceSum", {"x": x}, x.shape, {"noop_with_empty_axes": 1}), {"x": x})
    close(got, x)


def test_global_max_pool_blocked_and_plain():
    x = rand(1, 16, 5, 6)
    w = rand(16, 16, 1, 1, seed=1)
    g = Graph("gmp", inputs=["x"], outputs=["y"], nodes=[
        Node("FusedConv", ["x", "w", ""], ["a"], {"strides": (1, 1), "pads": (0, 0, 0, 0)}, name="c"),
        Node("GlobalMaxPool", ["a"], ["y"], name="p")],
        values={"x": Value("x", x.shape), "a": Value("a", x.shape), "y": Value("y", (1, 16, 1, 1))},
        constants={"w": w})
    a = fused_conv(g.nodes[0], x, w, None, None)
    got, _ = run_plan(g, {"x": x})
    close(got, a.max(axis=(2, 3), keepdims=True))
    got, _ = run_plan(graph_of("GlobalMaxPool", {"x": x}, (1, 16, 1, 1)), {"x": x})
    close(got, x.max(axis=(2, 3), keepdims=True))


@pytest.mark.parametrize("perm", [(0, 2, 3, 1), (3, 1, 0, 2), None])
def test_transpose(perm):
    x = rand(2, 3, 4, 5)
    want = np.transpose(x, perm)
    got, _ = run_plan(graph_of("Transpose", {"x": x}, want.shape, {} if perm is None else {"perm": perm}), {"x": x})
    np.testing.assert_array_equal(got, want)


def test_expand_and_tile():
    x = rand(3, 1, 5)
    got, layers = run_plan(graph_of("Expand", {"x": x}, (2, 3, 4, 5), consts={"s": np.array([2, 1, 4, 1])}), {"x": x})
    np.testing.assert_array_equal(got, np.broadcast_to(x, (2, 3, 4, 5)))
    got, _ = run_plan(graph_of("Tile", {"x": x}, (6, 2, 5), consts={"r": np.array([2, 2, 1])}), {"x": x})
    np.testing.assert_array_equal(got, np.tile(x, (2, 2, 1)))
    assert layers[0]["kernel"] == "llvm"


def test_split_into_uneven_parts():
    x = rand(2, 7, 3)
    g = Graph("split", inputs=["x"], outputs=["a", "b"], nodes=[Node("Split", ["x", "s"], ["a", "b"], {"axis": 1},
                                                                     name="sp")],
              values={"x": Value("x", x.shape), "a": Value("a", (2, 3, 3)), "b": Value("b", (2, 4, 3))})
    g.set_constant("s", np.array([3, 4], np.int64))
    outs, _ = plan_graph(g).run({"x": x})
    np.testing.assert_array_equal(outs["a"], x[:, :3])
    np.testing.assert_array_equal(outs["b"], x[:, 3:])


@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_normalization(axis):
    x = rand(2, 3, 4, 5, scale=2.0) + 3.0  # an offset mean: a one-pass variance would cancel
    norm = x.shape[axis % 4:]
    scale, shift = rand(*norm, seed=1), rand(*norm, seed=2)
    g = graph_of("LayerNormalization", {"x": x}, x.shape, {"axis": axis, "epsilon": 1e-3},
                 consts={"s": scale, "b": shift})
    got, layers = run_plan(g, {"x": x})
    d = x.astype(np.float64)
    axes = tuple(range(axis % 4, 4))
    mean = d.mean(axis=axes, keepdims=True)
    want = (d - mean) / np.sqrt(((d - mean) ** 2).mean(axis=axes, keepdims=True) + 1e-3) * scale + shift
    close(got, want)
    assert layers[0]["kernel"] == "llvm"


def test_instance_normalization():
    x = rand(2, 3, 4, 5, scale=2.0) + 1.0
    scale, shift = rand(3, seed=1), rand(3, seed=2)
    got, _ = run_plan(graph_of("InstanceNormalization", {"x": x}, x.shape, consts={"s": scale, "b": shift}),
                      {"x": x})
    d = x.astype(np.float64)
    mean = d.mean(axis=(2, 3), keepdims=True)
    want = (d - mean) / np.sqrt(d.var(axis=(2, 3), keepdims=True) + 1e-5) * scale.reshape(3, 1, 1) \
        + shift.reshape(3, 1, 1)
    close(got, want)


# ---- the numpy fallback ------------------------------------------------------------------------------


@pytest.fixture
def cumsum_op():
    """An op with a numpy kernel and no host handler, registered for one test."""
    FLOAT_OPS["WeftTestCumsum"] = OpDef(lambda n, i, k: [(i[0].shape, "float32")],
                                        lambda n, a: [np.cumsum(a[0], axis=n.attrs["axis"]).astype(np.float32)])
    yield "WeftTestCumsum"
    del FLOAT_OPS["WeftTestCumsum"]


def test_runs_of_kernels_are_called_natively_around_a_numpy_step(cumsum_op):
    """Consecutive generated kernels run from one native call (a sequence), a numpy step between two runs
    splits them, and every layer still gets its own time."""
    from weft.compiler.llvm.hostplan import _Sequence
    from weft.compiler.llvm.jit import sequence_runner

    x = rand(1, 8, 4, 4)
    names = ["x", "a", "b", "c", "d", "y"]
    g = Graph("seq", inputs=["x"], outputs=["y"], nodes=[
        Node("Sigmoid", ["x"], ["a"], name="s0"), Node("Neg", ["a"], ["b"], name="n0"),
        Node(cumsum_op, ["b"], ["c"], {"axis": 3}, name="cs"),
        Node("Sigmoid", ["c"], ["d"], name="s1"), Node("Neg", ["d"], ["y"], name="n1")],
        values={n: Value(n, x.shape) for n in names})
    plan = plan_graph(g)
    want = -1 / (1 + np.exp(np.cumsum(1 / (1 + np.exp(-x.astype(np.float64))), axis=3)))
    for timings in (True, False, True):
        outs, layers = plan.run({"x": x}, timings=timings)
        close(outs["y"], want)
    assert [layer["name"] for layer in layers] == ["s0", "n0", "cs", "s1", "n1"]
    assert all(layer["seconds"] > 0 for layer in layers)
    if sequence_runner() is not None:  # 64-bit Linux
        kinds = [type(s).__name__ for s in plan._segments]
        assert kinds == ["_Sequence", "Step", "_Sequence"], kinds
        assert all(len(s.nodes) == 2 for s in plan._segments if isinstance(s, _Sequence))


def test_numpy_fallback_runs_between_kernels(cumsum_op):
    x = rand(1, 8, 4, 4)
    g = Graph("fb", inputs=["x"], outputs=["y"], nodes=[
        Node("Sigmoid", ["x"], ["a"], name="s"),
        Node(cumsum_op, ["a"], ["b"], {"axis": 2}, name="cs"),
        Node("Relu", ["b"], ["y"], name="r")],
        values={"x": Value("x", x.shape), "a": Value("a", x.shape), "b": Value("b", x.shape),
                "y": Value("y", x.shape)})
    plan = plan_graph(g)
    for _ in range(2):  # the buffers are reused: a second run sees the same results
        outs, layers = plan.run({"x": x}, timings=True)
        close(outs["y"], np.maximum(np.cumsum(1 / (1 + np.exp(-x.astype(np.float64))), axis=2), 0))
    assert [layer["kernel"] for layer in layers] == ["llvm", "numpy", "llvm"]
    assert len(plan.numpy_steps()) == 1
    with pytest.raises(UnsupportedError, match="WeftTestCumsum") as err:
        cross_compile(g, "aarch64")
    assert err.value.node == "cs"
    with pytest.raises(UnsupportedError, match="the cuda device needs generated code"):
        gpu_steps(g)


def test_numpy_fallback_for_a_known_op_with_runtime_data():
    data, idx = rand(5, 3), np.array([4, 0, 2], np.int64)
    g = graph_of("Gather", {"x": data}, (3, 3), {"axis": 0}, consts={"i": idx})
    got, layers = run_plan(g, {"x": data})
    np.testing.assert_array_equal(got, data[idx])
    assert layers[0]["kernel"] == "numpy"


def test_case_a_handler_refuses_runs_through_numpy():
    """Weights that are a graph input: the conv kernel packs constants only, so numpy runs the layer, and
    whatever the handler had planned before it gave up is forgotten."""
    x, w = rand(1, 8, 5, 5), rand(16, 8, 3, 3, seed=1)
    feeds = {"x": x, "w": w}
    g = graph_of("FusedConv", feeds, (1, 16, 5, 5), {"strides": (1, 1), "pads": (1, 1, 1, 1), "act": "relu"},
                 inputs=["x", "w", ""])
    plan = plan_graph(g)
    outs, layers = plan.run(feeds, timings=True)
    close(outs["y"], fused_conv(g.nodes[0], x, w, None, None))
    assert [s.runner for s in plan.steps] == ["numpy"] and layers[0]["kernel"] == "numpy"


def test_op_without_any_kernel_is_refused():
    x = rand(2, 2)
    with pytest.raises(UnsupportedError, match="has a kernel for this op"):
        plan_graph(graph_of("NoSuchOp", {"x": x}, x.shape))


@pytest.mark.parametrize(("shape", "size", "beta"), [((1, 16, 6, 7), 5, 0.75), ((2, 7, 5, 3), 3, 0.6),
                                                     ((1, 9, 4, 4), 4, 0.75), ((1, 5, 9), 5, 1.0),
                                                     ((1, 3, 2, 2), 7, 0.75)])
def test_lrn_kernel_against_the_reference(shape, size, beta):
    """LRN as a generated kernel (no numpy step): odd and even windows (ONNX's for even sizes, which
    onnxruntime refuses), windows wider than the channels, beta 0.75 by square roots and others by pow."""
    from weft.core.float_ops import FLOAT_OPS

    x = rand(*shape, scale=10.0)
    g = graph_of("LRN", {"x": x}, shape, {"size": size, "alpha": 2e-4, "beta": beta, "bias": 1.5})
    got, layers = run_plan(g, {"x": x})
    want = FLOAT_OPS["LRN"].run(g.nodes[0], [x])[0]
    close(got, want.astype(np.float64), rtol=1e-6)
    assert [layer["kernel"] for layer in layers] == ["llvm"]
