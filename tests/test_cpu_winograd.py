"""Winograd F(2x2, 3x3) and F(4x4, 3x3) on the cpu backend: which convolutions take which, and their results
against the float reference and onnxruntime (relative error <= 1e-4) on even and odd sizes, pads, halos,
fused epilogues and residuals."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import weft
from weft.compiler.llvm import nn, winograd
from weft.compiler.llvm.graph import plan_graph
from weft.compiler.llvm.jit import build
from weft.compiler.llvm.layout import Layout
from weft.compiler.llvm.target import Target, host_target
from weft.compiler.llvm.winograd import (
    TRANSFORMS,
    pack_winograd_weights,
    winograd_applies,
    winograd_kernel,
    winograd_tile,
)
from weft.core.float_ops import conv2d, fused_conv
from weft.core.ir import Graph, Node, Value
from weft.runtime import InferenceSession

from .test_frontend_util import make_model, ort_run

RTOL = 1e-4


def rand(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


def test_which_convolutions_take_winograd():
    spec = nn.ConvSpec(1, 16, 10, 10, 16, 3, 3, (1, 1), 8, 8)
    assert winograd_applies(spec)
    assert winograd_applies(nn.ConvSpec(1, 16, 9, 9, 16, 3, 3, (1, 1), 8, 8))  # odd output: 7x7
    assert not winograd_applies(nn.ConvSpec(1, 16, 10, 10, 16, 3, 3, (2, 2), 8, 8))  # stride 2
    assert not winograd_applies(nn.ConvSpec(1, 16, 10, 10, 16, 1, 1, (1, 1), 8, 8))  # 1x1
    assert not winograd_applies(nn.ConvSpec(1, 3, 10, 10, 16, 3, 3, (1, 1), 1, 8))  # a plain NCHW input


AVX2 = Target("avx2", "x86_64-unknown-linux-gnu", "generic", "", 32, 16)
AVX512 = Target("avx512", "x86_64-unknown-linux-gnu", "generic", "", 64, 32)


def test_which_tile_each_convolution_takes():
    """F(4x4) where its tiles are many enough to reuse its 36 weights per filter, F(2x2) elsewhere, and
    neither where the tiles are too few to keep the target's vectors busy with the weights loaded (0: the
    direct kernel)."""
    def tile(n: int, hw: int, target: Target = AVX2) -> int:
        return winograd_tile(nn.ConvSpec(n, 16, hw + 2, hw + 2, 16, 3, 3, (1, 1), 8, 8), target)

    assert tile(1, 56) == tile(1, 28) == tile(1, 24) == 4
    assert tile(1, 14) == tile(1, 7) == tile(1, 20) == 2
    assert tile(2, 14) == 4  # two images: 32 tiles
    assert tile(1, 6) == 0  # 9 tiles of F(2x2): fewer than 2 per AVX2 lane
    # AVX-512's 16 lanes: ResNet's 7x7 layers (16 tiles) go to the direct kernel, 14x14 (49) keep F(2x2)
    assert tile(1, 56, AVX512) == tile(1, 28, AVX512) == 4
    assert tile(1, 14, AVX512) == 2 and tile(1, 7, AVX512) == 0 and tile(2, 7, AVX512) == 2


def test_transforms_compute_a_convolution():
    """Each F(m x m, 3x3)'s matrices: A^T [(G g G^T) * (B^T d B)] A is the valid 3x3 correlation of d."""
    rng = np.random.default_rng(0)
    for m, (bt, g, at) in TRANSFORMS.items():
        d, w = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((3, 3))
        bt_, at_ = np.array(bt, float), np.array(at, float)
        y = at_ @ ((g @ w @ g.T) * (bt_ @ d @ bt_.T)) @ at_.T
        want = np.array([[np.sum(d[i:i + 3, j:j + 3] * w) for j in range(m)] for i in range(m)])
        np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize(("c", "o", "h", "w"), [(16, 16, 8, 8), (8, 24, 7, 7), (24, 8, 5, 9), (16, 32, 1, 1),
                                                (8, 8, 13, 6)])
def test_kernel_against_the_reference(c, o, h, w, tile):
    """The kernel alone on an input padded by 1 (sizes the tile does not divide clamp the last tile's reads
    inside the buffer)."""
    target = host_target()
    b = 8
    spec = nn.ConvSpec(1, c, h + 2, w + 2, o, 3, 3, (1, 1), b, b)
    x, wt, bias = rand(1, c, h + 2, w + 2, seed=1), rand(o, c, 3, 3, seed=2, scale=0.3), rand(o, seed=3)
    kernel = winograd_kernel("wconv", spec, target, act="clip", clip=(-1.0, 1.5), tile=tile)
    fn = build(kernel)
    y = np.zeros((1, o // b, h, w, b), np.float32)
    temps = [np.zeros(t.shape, np.float32) for t in kernel.temps]
    fn(Layout(b).to_numpy(x), pack_winograd_weights(wt, b, b, tile), bias.reshape(-1, b), y, *temps, nthreads=2)
    want = np.clip(conv2d(x.astype(np.float64), wt.astype(np.float64), bias.astype(np.float64), (1, 1),
                          (0, 0, 0, 0)), -1.0, 1.5)
    assert rel_err(Layout(b).from_numpy(y), want) <= RTOL


def conv_graph(n: int, c: int, o: int, h: int, w: int, pads: tuple[int, int, int, int], act: str, residual: bool,
               seed: int) -> tuple[Graph, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """conv3x3 (-> act) -> conv3x3 (+ residual) -> act: the first writes its output inside the second's halo."""
    t, l, b, r = pads
    h1, w1 = h + t + b - 2, w + l + r - 2
    h2, w2 = h1, w1  # the second convolution pads by 1
    attrs = {"strides": (1, 1), "act": act}
    nodes = [Node("FusedConv", ["x", "w0", "b0"], ["a"], {**attrs, "pads": pads}, name="c0"),
             Node("FusedConv", ["a", "w1", "b1"] + (["r"] if residual else []), ["y"],
                  {**attrs, "pads": (1, 1, 1, 1)}, name="c1")]
    feeds = {"x": rand(n, c, h, w, seed=seed)}
    if residual:
        feeds["r"] = rand(n, o, h2, w2, seed=seed + 1)
    g = Graph("t", inputs=list(feeds), outputs=["y"], nodes=nodes,
              values={k: Value(k, v.shape, "float32") for k, v in feeds.items()})
    g.values["a"] = Value("a", (n, o, h1, w1), "float32")
    g.values["y"] = Value("y", (n, o, h2, w2), "float32")
    consts = {"w0": rand(o, c, 3, 3, seed=seed + 2, scale=0.3), "b0": rand(o, seed=seed + 3),
              "w1": rand(o, o, 3, 3, seed=seed + 4, scale=0.2), "b1": rand(o, seed=seed + 5)}
    if act == "clip":
        for node in nodes:
            node.attrs["clip"] = (0.0, 6.0)
    for k, v in consts.items():
        g.set_constant(k, v)
    return g, feeds, consts


@pytest.mark.parametrize(("n", "c", "o", "h", "w", "pads", "act", "residual"), [
    (1, 16, 16, 12, 12, (1, 1, 1, 1), "relu", True),
    (1, 8, 16, 7, 7, (1, 1, 1, 1), "clip", False),
    (2, 16, 8, 9, 6, (1, 1, 1, 1), "none", True),
    (1, 16, 16, 8, 8, (0, 0, 0, 0), "relu", False),  # no pads: the second convolution reads a halo of 1
    (1, 16, 24, 6, 6, (2, 2, 2, 2), "relu", False),  # pads wider than the halo a producer leaves
    (1, 16, 16, 6, 9, (0, 1, 1, 0), "none", False),  # asymmetric pads
    (1, 16, 16, 24, 24, (1, 1, 1, 1), "relu", True),  # 36 tiles: F(4x4)
    (1, 8, 16, 26, 23, (1, 1, 1, 1), "clip", False),  # F(4x4) with partial tiles on both axes
])
def test_chained_layers_against_the_reference(n, c, o, h, w, pads, act, residual, monkeypatch):
    """Winograd layers in a plan (halos, pads, residuals), each small map included: the rule that sends
    layers of few tiles to the direct kernel on wide vectors is lifted here."""
    monkeypatch.setattr(winograd, "TILES_PER_LANE", 0)
    g, feeds, consts = conv_graph(n, c, o, h, w, pads, act, residual, seed=7)
    plan = plan_graph(g)
    names = [s.kernel.name for s in plan.steps if s.node == "c1"]
    assert "wconv" in names, names
    top, left, bottom, right = pads
    tiles = n * -(-(h + top + bottom - 2) // 4) * -(-(w + left + right - 2) // 4)  # c1's output: c0's size
    m = 4 if tiles >= 32 else 2
    assert plan.algorithms["c1"] == f"winograd F({m}x{m})"
    got = plan.run(feeds, threads=2)[0]["y"]
    a = fused_conv(g.nodes[0], feeds["x"], consts["w0"], consts["b0"], None)
    want = fused_conv(g.nodes[1], a.astype(np.float32), consts["w1"], consts["b1"], feeds.get("r"))
    assert rel_err(got, want) <= RTOL


def test_onnx_resnet_block_against_onnxruntime():
    """A BasicBlock as PyTorch exports it (Conv, BatchNormalization, Relu, Add) through the importer."""
    rng = np.random.default_rng(3)

    def bn(name: str, c: int) -> dict[str, np.ndarray]:
        return {f"{name}.g": rng.uniform(0.5, 1.5, c).astype(np.float32), f"{name}.b": rand(c, seed=len(name)),
                f"{name}.m": rand(c, seed=c) * 0.1, f"{name}.v": rng.uniform(0.5, 2, c).astype(np.float32)}

    c = 32
    inits = {"w1": rand(c, c, 3, 3, seed=1, scale=0.1), "w2": rand(c, c, 3, 3, seed=2, scale=0.1),
             **bn("bn1", c), **bn("bn2", c)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1] * 4, kernel_shape=[3, 3]),
             helper.make_node("BatchNormalization", ["c1", "bn1.g", "bn1.b", "bn1.m", "bn1.v"], ["n1"]),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1] * 4, kernel_shape=[3, 3]),
             helper.make_node("BatchNormalization", ["c2", "bn2.g", "bn2.b", "bn2.m", "bn2.v"], ["n2"]),
             helper.make_node("Add", ["n2", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, {"x": [1, c, 14, 14]}, {"y": None}, inits)
    feeds = {"x": rand(1, c, 14, 14, seed=9)}
    sess = InferenceSession(weft.compile(model, target="cpu"), device="cpu", threads=2)
    assert rel_err(sess.run(None, feeds)[0], ort_run(model, feeds)[0]) <= RTOL
    # each layer's figures say what ran it: 14x14 makes 16 tiles of F(4x4), too few: F(2x2)
    algorithms = [layer.get("algorithm") for layer in sess.stats["layers"] if "Conv" in layer["op"]]
    assert algorithms == ["winograd F(2x2)"] * 2, sess.stats["layers"]
