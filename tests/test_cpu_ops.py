"""Operator suite of the "cpu" device against onnxruntime: random shapes and attributes (hypothesis), each
model compiled with ``target="cpu"`` and run through JIT-compiled kernels. Relative error stays within
float32 rounding of the longest reduction."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

import weft
from weft.runtime import InferenceSession

from .test_frontend_util import make_model, ort_run, rand

#: hypothesis budget per operator: each example compiles a few kernels (about 0.1-0.5 s each)
EXAMPLES = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
RTOL = 2e-5


def check(model, feeds, rtol: float = RTOL, threads: int = 2, opset_note: str = "") -> InferenceSession:
    art = weft.compile(model, target="cpu")
    sess = InferenceSession(art, device="cpu", threads=threads)
    got = sess.run(None, feeds)
    want = ort_run(model, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = max(float(np.abs(w).max()), 1.0)
        err = float(np.abs(g.astype(np.float64) - w).max()) / scale
        assert err <= rtol, f"relative error {err:.3g} {opset_note}"
    return sess


@st.composite
def conv_cases(draw):
    k = draw(st.sampled_from([1, 2, 3, 5]))
    stride = draw(st.sampled_from([1, 2]))
    pads = [draw(st.integers(0, k // 2 + 1)) for _ in range(4)]
    h = draw(st.integers(max(1, k - pads[0] - pads[2]), 11))
    w = draw(st.integers(max(1, k - pads[1] - pads[3]), 11))
    return dict(n=draw(st.integers(1, 2)), c=draw(st.sampled_from([1, 3, 8, 16, 20, 32])),
                o=draw(st.sampled_from([1, 5, 16, 24, 32, 48])), h=h, w=w, k=k, stride=stride, pads=pads,
                bias=draw(st.booleans()), act=draw(st.sampled_from(["none", "relu", "clip"])),
                residual=draw(st.booleans()), seed=draw(st.integers(0, 1000)))


@EXAMPLES
@given(conv_cases())
def test_conv_with_fused_bias_residual_and_activation(case):
    n, c, o, h, w, k = case["n"], case["c"], case["o"], case["h"], case["w"], case["k"]
    s, pads = case["stride"], case["pads"]
    oh = (h + pads[0] + pads[2] - k) // s + 1
    ow = (w + pads[1] + pads[3] - k) // s + 1
    inits = {"w": rand(o, c, k, k, seed=case["seed"], scale=0.3)}
    ins = ["x", "w"]
    if case["bias"]:
        inits["b"] = rand(o, seed=case["seed"] + 1)
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["y0"], kernel_shape=[k, k], strides=[s, s],
                              pads=[pads[0], pads[1], pads[2], pads[3]])]
    inputs = {"x": [n, c, h, w]}
    feeds = {"x": rand(n, c, h, w, seed=case["seed"] + 2)}
    last = "y0"
    if case["residual"]:
        nodes.append(helper.make_node("Add", ["y0", "r"], ["y1"]))
        inputs["r"] = [n, o, oh, ow]
        feeds["r"] = rand(n, o, oh, ow, seed=case["seed"] + 3)
        last = "y1"
    if case["act"] == "relu":
        nodes.append(helper.make_node("Relu", [last], ["y"]))
    elif case["act"] == "clip":
        inits.update(lo=np.array(-0.5, np.float32), hi=np.array(1.5, np.float32))
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    model = make_model(nodes, inputs, {"y": [n, o, oh, ow]}, inits)
    sess = check(model, feeds)
    assert [layer["op"] for layer in sess.stats["layers"]] == ["FusedConv"]  # bias/residual/act fused


@st.composite
def pool_cases(draw):
    k = draw(st.integers(1, 4))
    stride = draw(st.integers(1, 3))
    pads = [draw(st.integers(0, (k - 1) // 2 + (k > 1))) for _ in range(4)]
    pads = [min(p, k - 1) for p in pads]
    return dict(kind=draw(st.sampled_from(["MaxPool", "AveragePool"])), k=k, stride=stride, pads=pads,
                ceil=draw(st.booleans()), include=draw(st.booleans()), h=draw(st.integers(k, 12)),
                w=draw(st.integers(k, 12)), c=draw(st.sampled_from([3, 16, 32])), blocked=draw(st.booleans()),
                seed=draw(st.integers(0, 1000)))


@EXAMPLES
@given(pool_cases())
def test_pooling_with_pads_ceil_mode_and_divisors(case):
    c, h, w, k = case["c"], case["h"], case["w"], case["k"]
    attrs = dict(kernel_shape=[k, k], strides=[case["stride"]] * 2, pads=case["pads"], ceil_mode=int(case["ceil"]))
    if case["kind"] == "AveragePool":
        attrs["count_include_pad"] = int(case["include"])
    nodes, inits, src = [], {}, "x"
    if case["blocked"]:  # a 1x1 conv first, so that the pool reads a channel-blocked tensor
        inits["w1"] = rand(c, c, 1, 1, seed=case["seed"])
        nodes.append(helper.make_node("Conv", ["x", "w1"], ["t"], kernel_shape=[1, 1]))
        src = "t"
    nodes.append(helper.make_node(case["kind"], [src], ["y"], **attrs))
    model = make_model(nodes, {"x": [1, c, h, w]}, {"y": None}, inits)
    check(model, {"x": rand(1, c, h, w, seed=case["seed"] + 1)})


@st.composite
def broadcast_cases(draw):
    rank = draw(st.integers(1, 4))
    shape = [draw(st.integers(1, 6)) for _ in range(rank)]
    other = [d if draw(st.booleans()) else 1 for d in shape][draw(st.integers(0, rank - 1)):]
    swap = draw(st.booleans())
    return dict(op=draw(st.sampled_from(["Add", "Sub", "Mul", "Div"])), a=other if swap else shape,
                b=shape if swap else other, const=draw(st.booleans()), seed=draw(st.integers(0, 1000)))


@EXAMPLES
@given(broadcast_cases())
def test_elementwise_with_broadcasting(case):
    a_shape, b_shape = case["a"], case["b"]
    out = list(np.broadcast_shapes(tuple(a_shape), tuple(b_shape)))
    b_val = rand(*b_shape, seed=case["seed"])
    if case["op"] == "Div":
        b_val = np.where(np.abs(b_val) < 0.2, 0.5, b_val).astype(np.float32)
    inits = {"b": b_val} if case["const"] else {}
    inputs = {"a": a_shape} if case["const"] else {"a": a_shape, "b": b_shape}
    nodes = [helper.make_node(case["op"], ["a", "b"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]
    model = make_model(nodes, inputs, {"y": out}, inits)
    feeds = {"a": rand(*a_shape, seed=case["seed"] + 1)}
    if not case["const"]:
        feeds["b"] = b_val
    check(model, feeds)


@EXAMPLES
@given(st.integers(1, 4), st.data())
def test_softmax_along_any_axis_both_opset_semantics(rank, data):
    shape = [data.draw(st.integers(1, 7)) for _ in range(rank)]
    axis = data.draw(st.integers(-rank, rank - 1))
    opset = data.draw(st.sampled_from([11, 13]))
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], {"x": shape}, {"y": shape},
                       opset=opset)
    check(model, {"x": rand(*shape, seed=rank, scale=3.0)}, opset_note=f"(opset {opset})")


@EXAMPLES
@given(st.integers(0, 3), st.lists(st.integers(1, 4), min_size=2, max_size=3), st.integers(0, 1000))
def test_concat_along_each_axis(axis, sizes, seed):
    base = [2, 3, 4, 5]
    shapes = [[s if d == axis else base[d] for d in range(4)] for s in sizes]
    inputs = {f"x{k}": s for k, s in enumerate(shapes)}
    nodes = [helper.make_node("Concat", list(inputs), ["y"], axis=axis)]
    model = make_model(nodes, inputs, {"y": None})
    check(model, {name: rand(*s, seed=seed + k) for k, (name, s) in enumerate(inputs.items())})


@EXAMPLES
@given(st.lists(st.integers(-1, 2), min_size=6, max_size=6), st.floats(-2, 2, width=32), st.integers(0, 99))
def test_pad_constant_value_and_crop(pads, value, seed):
    shape = [3, 4, 5]
    out = [d + pads[i] + pads[i + 3] for i, d in enumerate(shape)]
    inits = {"pads": np.array(pads, np.int64), "v": np.array(value, np.float32)}
    model = make_model([helper.make_node("Pad", ["x", "pads", "v"], ["y"])], {"x": shape}, {"y": out}, inits)
    check(model, {"x": rand(*shape, seed=seed)})


@EXAMPLES
@given(st.sampled_from([1, 2, 3]), st.integers(1, 9), st.integers(1, 40), st.integers(1, 33), st.data())
def test_matmul_of_runtime_tensors_with_batch_broadcast(batch, m, k, n, data):
    a_shape = [batch, m, k] if data.draw(st.booleans()) else [m, k]
    b_shape = [batch, k, n] if data.draw(st.booleans()) else [k, n]
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a_shape, "b": b_shape}, {"y": None})
    check(model, {"a": rand(*a_shape, seed=m), "b": rand(*b_shape, seed=n)})


@EXAMPLES
@given(st.integers(1, 6), st.integers(1, 50), st.integers(1, 40), st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from([1.0, 0.5]), st.sampled_from([1.0, -2.0]))
def test_gemm_of_runtime_tensors(m, k, n, ta, tb, with_c, alpha, beta):
    a_shape = [k, m] if ta else [m, k]
    b_shape = [n, k] if tb else [k, n]
    inputs = {"a": a_shape, "b": b_shape}
    ins = ["a", "b"]
    feeds = {"a": rand(*a_shape, seed=1), "b": rand(*b_shape, seed=2)}
    if with_c:
        inputs["c"] = [1, n]
        ins.append("c")
        feeds["c"] = rand(1, n, seed=3)
    node = helper.make_node("Gemm", ins, ["y"], transA=int(ta), transB=int(tb), alpha=alpha, beta=beta)
    check(make_model([node], inputs, {"y": [m, n]}), feeds)


@EXAMPLES
@given(st.integers(1, 5), st.sampled_from([8, 16, 20, 64]), st.sampled_from([1, 3, 7]), st.sampled_from([10, 32, 1000]),
       st.booleans())
def test_global_pool_flatten_dense_head(n, c, hw, classes, relu):
    """The classifier of a CNN: GlobalAveragePool (blocked), Flatten (free), Gemm with constant weights."""
    inits = {"w1": rand(c, c, 1, 1, seed=1, scale=0.5), "wd": rand(classes, c, seed=2, scale=0.2),
             "bd": rand(classes, seed=3)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["t"], kernel_shape=[1, 1]),
             helper.make_node("GlobalAveragePool", ["t"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "wd", "bd"], ["z"], transB=1)]
    nodes.append(helper.make_node("Relu" if relu else "Identity", ["z"], ["y"]))
    check(make_model(nodes, {"x": [n, c, hw, hw]}, {"y": [n, classes]}, inits), {"x": rand(n, c, hw, hw, seed=4)})


def test_batchnorm_slice_reshape_and_cast_on_the_host():
    c = 6
    inits = {"s": rand(c, seed=1), "b": rand(c, seed=2), "m": rand(c, seed=3),
             "v": (np.abs(rand(c, seed=4)) + 0.5).astype(np.float32),
             "starts": np.array([1, 0], np.int64), "ends": np.array([5, 100], np.int64),
             "axes": np.array([2, 3], np.int64), "steps": np.array([2, 3], np.int64),
             "shape": np.array([2, -1], np.int64)}
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["t"], epsilon=1e-3),
             helper.make_node("Slice", ["t", "starts", "ends", "axes", "steps"], ["u"]),
             helper.make_node("Reshape", ["u", "shape"], ["y"])]
    model = make_model(nodes, {"x": [2, c, 7, 8]}, {"y": None}, inits)
    check(model, {"x": rand(2, c, 7, 8, seed=5)})


def test_op_without_generated_code_runs_through_numpy():
    inits = {"idx": np.array([[0, 2], [1, 1]], np.int64)}
    model = make_model([helper.make_node("Gather", ["x", "idx"], ["y"], axis=1, name="pick")], {"x": [3, 4]},
                       {"y": None}, inits)
    sess = check(model, {"x": rand(3, 4)})
    _, figures, _ = sess.device.run({"x": rand(3, 4)})
    assert [layer["kernel"] for layer in figures["layers"]] == ["numpy"] and figures["numpy_steps"] == 1


@EXAMPLES
@given(st.integers(0, 2), st.lists(st.integers(0, 3), min_size=4, max_size=4),
       st.lists(st.integers(0, 1), min_size=4, max_size=4), st.sampled_from([1, 3]), st.sampled_from([1, 2]),
       st.integers(0, 99))
def test_convolutions_read_their_pads_from_the_producers_halo(p1, pads2, pads3, k3, s3, seed):
    """conv1's output feeds two padded convolutions (different pads, kernels and strides): conv1 writes it
    inside a zero border as wide as the widest pad, and both read from it at their own offsets."""
    inits = {"w1": rand(16, 3, 3, 3, seed=seed, scale=0.3), "w2": rand(16, 16, 3, 3, seed=seed + 1, scale=0.2),
             "w3": rand(8, 16, k3, k3, seed=seed + 2, scale=0.2)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3], pads=[p1] * 4, name="c1"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y2"], kernel_shape=[3, 3], pads=pads2, name="c2"),
             helper.make_node("Conv", ["r", "w3"], ["y3"], kernel_shape=[k3, k3], pads=pads3, strides=[s3, s3],
                              name="c3")]
    model = make_model(nodes, {"x": [1, 3, 9, 8]}, {"y2": None, "y3": None}, inits)
    sess = check(model, {"x": rand(1, 3, 9, 8, seed=seed + 3)})
    halos = {t.name: t.layout.halo for t in sess.device.plan.tensors}
    assert halos["r"] == max(*pads2, *pads3)
    assert [step.node for step in sess.device.plan.steps if step.kernel.name == "pad"] == (["c1"] if p1 else [])
