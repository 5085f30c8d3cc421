"""The host planner's own rewrites and kernels for DenseNet- and ResNet-50-shaped graphs: ChannelAffine chains
and their Relu in one pass, concatenations of channel-blocked tensors, and 1x1 convolutions as a product over
the pixel axis (bit-identical to the direct kernel), against the float reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import weft
from weft.compiler.fusion import fuse_host_affine
from weft.compiler.llvm import nn
from weft.compiler.llvm.graph import plan_graph
from weft.compiler.llvm.jit import build
from weft.compiler.llvm.pointwise import pointwise_applies, pointwise_kernel
from weft.compiler.llvm.target import Target, host_target
from weft.core.ir import Graph, Node, Value
from weft.runtime import InferenceSession

from .test_frontend_util import make_model, ort_run

RTOL = 1e-4


def rand(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


def affine_chain() -> Graph:
    """x -> affine -> affine -> relu -> y, and the first affine's output also read by a second branch."""
    shape = (1, 16, 5, 5)
    nodes = [Node("ChannelAffine", ["x", "s0", "t0"], ["a"], {}, "a0"),
             Node("ChannelAffine", ["a", "s1", "t1"], ["b"], {}, "a1"),
             Node("ChannelAffine", ["b", "s2", "t2"], ["c"], {}, "a2"),
             Node("Relu", ["c"], ["y"], {}, "r")]
    g = Graph("t", inputs=["x"], outputs=["y"], nodes=nodes, values={"x": Value("x", shape, "float32")})
    for v in "abcy":
        g.values[v] = Value(v, shape, "float32")
    for k in range(3):
        g.set_constant(f"s{k}", rand(16, seed=k) * 0.5 + 1)
        g.set_constant(f"t{k}", rand(16, seed=k + 10))
    return g


def test_affine_chains_and_their_relu_become_one_node():
    g = affine_chain()
    fused = fuse_host_affine(g)
    assert [(n.op, n.attrs.get("act")) for n in fused.nodes] == [("ChannelAffine", "relu")]
    assert fused.nodes[0].outputs == ["y"] and [n.op for n in g.nodes] == ["ChannelAffine"] * 3 + ["Relu"]
    x = rand(1, 16, 5, 5, seed=3)
    want = x.astype(np.float64)
    for k in range(3):
        want = want * g.constants[f"s{k}"][:, None, None] + g.constants[f"t{k}"][:, None, None]
    plan = plan_graph(g)
    assert [s.kernel.name for s in plan.steps] == ["affine"]
    assert rel_err(plan.run({"x": x})[0]["y"], np.maximum(want, 0)) <= RTOL


def test_an_affine_read_twice_is_kept():
    g = affine_chain()
    g.outputs = ["y", "a"]
    assert [(n.op, n.attrs.get("act")) for n in fuse_host_affine(g).nodes] == [("ChannelAffine", None),
                                                                              ("ChannelAffine", "relu")]


def test_densenet_block_against_onnxruntime():
    """A stem convolution, then pre-activation dense layers (Mul/Add BatchNorm, Relu, 1x1 and 3x3
    convolutions) and their Concats, as the light DenseNet writes them: no layout conversion is planned
    around the concatenations. The growth is one channel block of this machine (8 floats on AVX2, 16 on
    AVX-512), as DenseNet's 32 is a whole number of blocks on either."""
    growth = host_target().lanes(4)
    c = 2 * growth
    inits = {"stem": rand(c, 3, 3, 3, seed=1, scale=0.3)}
    nodes, x = [helper.make_node("Conv", ["x", "stem"], ["s"], kernel_shape=[3, 3], pads=[1] * 4)], "s"
    for k in range(3):
        ch = c + k * growth
        inits.update({f"m{k}": rand(1, ch, 1, 1, seed=k) * 0.3 + 1, f"a{k}": rand(1, ch, 1, 1, seed=k + 5),
                      f"w{k}": rand(16, ch, 1, 1, seed=k + 9, scale=0.2), f"v{k}": rand(growth, 16, 3, 3, seed=k)})
        nodes += [helper.make_node("Mul", [x, f"m{k}"], [f"p{k}"]),
                  helper.make_node("Add", [f"p{k}", f"a{k}"], [f"q{k}"]),
                  helper.make_node("Relu", [f"q{k}"], [f"r{k}"]),
                  helper.make_node("Conv", [f"r{k}", f"w{k}"], [f"c{k}"], kernel_shape=[1, 1]),
                  helper.make_node("Relu", [f"c{k}"], [f"d{k}"]),
                  helper.make_node("Conv", [f"d{k}", f"v{k}"], [f"e{k}"], kernel_shape=[3, 3], pads=[1] * 4),
                  helper.make_node("Concat", [x, f"e{k}"], [f"cat{k}"], axis=1)]
        x = f"cat{k}"
    nodes.append(helper.make_node("Relu", [x], ["y"]))
    model = make_model(nodes, {"x": [1, 3, 12, 12]}, {"y": None}, inits)
    feeds = {"x": rand(1, 3, 12, 12, seed=4)}
    sess = InferenceSession(weft.compile(model, target="cpu"), device="cpu", threads=2)
    assert rel_err(sess.run(None, feeds)[0], ort_run(model, feeds)[0]) <= RTOL
    kernels = [s.kernel.name for s in sess.device.plan.steps]
    assert "convert" not in kernels and "concat" not in kernels  # each part written in place


@pytest.mark.parametrize("case", ["in_place", "input_part", "twice", "batch2", "output_part"])
def test_concatenations_in_place_or_copied(case):
    """Parts computed by the plan are written straight into the concatenation (no copy): chained, read by
    later layers and kept as intermediates, they hold their own values. A graph input as a part, the same
    part twice, or a batch of two (whose channel blocks are not one range) keep the copy."""
    b = host_target().lanes(4)
    n = 2 if case == "batch2" else 1
    inits = {"w0": rand(b, b, 1, 1, seed=1), "w1": rand(b, b, 3, 3, seed=2, scale=0.2),
             "w1b": rand(b, 2 * b, 1, 1, seed=4, scale=0.3), "w2": rand(b, 3 * b, 1, 1, seed=3, scale=0.3)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["p"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["p"], ["pr"]),
             helper.make_node("Conv", ["pr", "w1"], ["c"], kernel_shape=[3, 3], pads=[1] * 4)]
    first = {"input_part": ["x", "c"], "twice": ["c", "c"]}.get(case, ["p", "c"])
    nodes += [helper.make_node("Concat", first, ["cat1"], axis=1),
              helper.make_node("Sigmoid", ["cat1"], ["s"]),
              helper.make_node("Conv", ["s", "w1b"], ["d"], kernel_shape=[1, 1]),
              helper.make_node("Concat", ["cat1", "d"], ["cat2"], axis=1),
              helper.make_node("Conv", ["cat2", "w2"], ["y"], kernel_shape=[1, 1])]
    outputs = {"y": None, "c": None} if case == "output_part" else {"y": None}
    model = make_model(nodes, {"x": [n, b, 6, 6]}, outputs, inits)
    feeds = {"x": rand(n, b, 6, 6, seed=5)}
    sess = InferenceSession(weft.compile(model, target="cpu"), device="cpu", threads=2)
    want = ort_run(model, feeds)
    for _ in range(2):
        got = sess.run(None, feeds, keep_intermediates=True)
        for g_, w_ in zip(got, want, strict=True):
            assert rel_err(g_, w_) <= RTOL
    kernels = [s.kernel.name for s in sess.device.plan.steps]
    copies = 2 if case == "batch2" else (1 if case in ("input_part", "twice") else 0)
    assert kernels.count("concat") == copies, kernels
    if case == "in_place":  # the parts' own values, read through their views
        plan = sess.device.plan
        values = plan.values()
        whole = values["cat2"]
        assert np.array_equal(values["cat1"], whole[:, :2 * b]) and np.array_equal(values["d"], whole[:, 2 * b:])
        assert np.array_equal(values["c"], whole[:, b:2 * b]) and np.array_equal(values["p"], whole[:, :b])


#: (input blocks, output blocks, map size, stride, output halo), blocks of the host's vector width
POINTWISE_SHAPES = [(4, 8, 7, 1, 0), (2, 3, 14, 2, 0), (3, 2, 7, 1, 1), (2, 4, 5, 2, 0), (4, 2, 3, 1, 2)]


@pytest.mark.parametrize(("cb", "ob", "hw", "stride", "halo"), POINTWISE_SHAPES)
def test_pointwise_is_bit_identical_to_the_direct_kernel(cb, ob, hw, stride, halo):
    """Whether or not the rule picks it on this machine, the pixel-axis product computes the direct
    kernel's sums in the direct kernel's order."""
    target = host_target()
    b = target.lanes(4)
    out = (hw - 1) // stride + 1
    spec = nn.ConvSpec(1, cb * b, hw, hw, ob * b, 1, 1, (stride, stride), b, b, out=(out, out), out_halo=halo)
    direct = nn.conv_kernel("conv", spec, target, act="relu")
    packed = pointwise_kernel("pconv", spec, target, act="relu")
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(b.shape).astype(np.float32) for b in direct.params[:-1]]
    want = np.zeros(direct.params[-1].shape, np.float32)
    got = [np.zeros(b.shape, np.float32) for b in packed.params[len(args):]]
    build(direct)(*args, want, nthreads=2)
    build(packed)(*[a.reshape(b.shape) for a, b in zip(args, packed.params, strict=False)], *got, nthreads=2)
    assert np.array_equal(got[0], want)


def test_pointwise_rule_on_the_machine_it_was_measured_on():
    """On AVX2 (Zen 4, where the rule was measured) small maps take the pixel-axis product: their rows leave
    the direct kernel short tiles."""
    avx2 = Target("avx2", "x86_64-unknown-linux-gnu", "generic", "", 32, 16)
    for cb, ob, hw, stride, halo in POINTWISE_SHAPES:
        out = (hw - 1) // stride + 1
        spec = nn.ConvSpec(1, cb * 8, hw, hw, ob * 8, 1, 1, (stride, stride), 8, 8, out=(out, out), out_halo=halo)
        assert pointwise_applies(spec, avx2), spec
