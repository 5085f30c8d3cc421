"""Grouped and depthwise convolutions on the accelerator: the super-group mapping, the integer kernel, and
MobileNetV2- and ResNeXt-style models where fsim equals the reference interpreter to the bit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from weft.compiler import models
from weft.compiler.backend.schedule import LayerGeom, Schedule, usage
from weft.compiler.groups import SuperGroups, dense_super_weights, super_groups
from weft.core.float_ops import conv2d
from weft.core.ir import Node, Value
from weft.core.qkernels import Widths, qconv2d

from .test_e2e import _compile, _shape, assert_bit_exact
from .test_frontend_util import cosine, make_model, ort_run, rand

CONFIGS = ["tiny", "default"]


@pytest.mark.parametrize(("group", "cin", "cout", "block", "want"), [
    (16, 16, 16, 16, SuperGroups(1, 1, 1)),  # depthwise: one diagonal tile per block
    (72, 72, 72, 16, SuperGroups(5, 1, 1)),  # depthwise, 72 channels padded to 80
    (32, 128, 128, 16, SuperGroups(8, 1, 1)),  # ResNeXt 32x4d: four groups per tile
    (32, 256, 256, 4, SuperGroups(32, 2, 2)),  # 8 channels per group, blocks of 4: groups of whole blocks
    (8, 8, 16, 4, SuperGroups(2, 2, 1)),  # channel multiplier 2
    (4, 24, 24, 4, SuperGroups(2, 3, 3)),  # 6 channels per group: pairs of groups fill 3 blocks
    (5, 15, 15, 4, SuperGroups(1, 4, 4)),  # never aligned inside the padding: dense, zeros outside groups
])
def test_super_groups(group, cin, cout, block, want):
    assert super_groups(group, cin, cout, block) == want


@pytest.mark.parametrize(("group", "cin", "cout", "block"), [(4, 24, 24, 4), (8, 8, 16, 4), (5, 15, 15, 4),
                                                              (21, 21, 21, 16)])
def test_dense_super_weights_compute_the_grouped_convolution(group, cin, cout, block):
    """Each super-group's dense matrix over its own input blocks gives the grouped convolution."""
    w = rand(cout, cin // group, 3, 3, seed=1).astype(np.float64)
    x = rand(1, cin, 5, 5, seed=2).astype(np.float64)
    dense, sg = dense_super_weights(w, group, block)
    xp = np.zeros((1, sg.count * sg.in_blocks * block, 5, 5))
    xp[:, :cin] = x
    got = conv2d(xp, dense, None, (1, 1), (1, 1, 1, 1), group=sg.count)[:, :cout]
    np.testing.assert_allclose(got, conv2d(x, w, None, (1, 1), (1, 1, 1, 1), group=group), atol=1e-9)


def test_integer_kernel_on_logical_grouped_weights():
    """The reference kernel on (O, C/G, kh, kw) weights: each output channel sums its own group only."""
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (1, 6, 4, 4)).astype(np.int8)
    w = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    node = Node("qconv2d", ["x", "w"], ["y"], {"kernel": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1),
                                                "group": 2, "epilogue": ()}, "conv")
    ins = [Value("x", (1, 6, 4, 4), "int8", 1.0), None]
    out = Value("y", (1, 4, 4, 4), "int32", 1.0)
    got = qconv2d(node, [x, w], ins, [out], Widths(8, 8, 32, 32))[0]
    want = np.rint(conv2d(x.astype(np.float64), w.astype(np.float64), None, (1, 1), (1, 1, 1, 1), group=2))
    np.testing.assert_array_equal(got, want)


def _grouped_model(cin: int, cout: int, group: int, stride: int, pads: list[int], batch: int = 1) -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="gconv", group=group, kernel_shape=[3, 3],
                              strides=[stride, stride], pads=pads),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    inits = {"w": rand(cout, cin // group, 3, 3, seed=3) * 0.4, "b": rand(cout, seed=4) * 0.1}
    return make_model(nodes, {"x": [batch, cin, 9, 9]}, {"y": None}, inits)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize(("cin", "cout", "group", "stride", "pads", "batch"), [
    (12, 12, 2, 1, [1, 1, 1, 1], 1),  # 6 channels per group: not a multiple of any block
    (64, 64, 2, 1, [1, 1, 1, 1], 1),  # 32 channels per group: more than a block
    (21, 21, 21, 2, [1, 0, 2, 1], 1),  # depthwise, 21 channels, stride 2, asymmetric pads
    (8, 16, 8, 1, [0, 0, 0, 0], 1),  # depthwise with channel multiplier 2
    (24, 24, 4, 2, [1, 1, 1, 1], 3),  # batch blocks outside the channel blocks
])
def test_grouped_shapes_bit_exact(config, cin, cout, group, stride, pads, batch):
    model = _grouped_model(cin, cout, group, stride, pads, batch)
    art = _compile(model, config)
    feeds = {"x": rand(batch, cin, 9, 9, seed=7)}
    sim = assert_bit_exact(art, feeds)
    assert sim.stats["accel_mac_fraction"] == 1.0
    assert cosine(sim.intermediate("y"), ort_run(model, feeds)[0]) > 0.99
    layer = next(x for x in art.sections["accel"].meta["layers"] if x["name"] == "gconv")
    block = max(art.config.block_in, art.config.block_out)
    sg = super_groups(group, cin, cout, block)
    assert (layer["geometry"]["groups"], layer["geometry"]["icb"]) == (sg.count, sg.in_blocks)


@pytest.fixture(scope="module")
def grouped_models() -> dict[str, onnx.ModelProto]:
    return {"mobilenet_v2": models.mobilenet_v2(), "resnext": models.resnext()}


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", ["mobilenet_v2", "resnext"])
def test_grouped_models_on_the_accelerator(grouped_models, name, config):
    model = grouped_models[name]
    art = _compile(model, config)
    input_name, shape = _shape(model)
    feeds = {input_name: rand(*shape, seed=7)}
    sim = assert_bit_exact(art, feeds)
    stats = sim.stats
    assert stats["accel_mac_fraction"] >= 0.95
    assert stats["macs"] == models.count_macs(model)  # grouped layers count their real MACs
    assert cosine(sim.intermediate(art.graph.outputs[0]), ort_run(model, feeds)[0]) >= 0.99
    grouped = [n for n in art.graph.nodes if n.op == "qconv2d" and "group" in n.attrs]
    assert grouped and all(n.attrs["target"] == "accel" for n in grouped)
    geometry = {x["name"]: x["geometry"] for x in art.sections["accel"].meta["layers"]}
    block = max(art.config.block_in, art.config.block_out)
    for node in grouped:  # every super-group reduces over its own input blocks only
        g, (cg, cout) = geometry[node.name], node.attrs["channels"]
        assert g["icb"] == super_groups(node.attrs["group"], cg * node.attrs["group"], cout, block).in_blocks
        assert g["icb"] * g["groups"] == art.graph.values[node.inputs[0]].shape[1]
        if cg == 1:  # depthwise: one input block per output block
            assert g["icb"] == 1
    # The schedule's model of a grouped layer's GEMM work is what the simulator executed.
    layers = {x["name"]: x for x in stats["layers"]}
    for layer in art.sections["accel"].meta["layers"]:
        geom = LayerGeom(**{**layer["geometry"], "pads": tuple(layer["geometry"]["pads"])})
        u = usage(geom, Schedule.from_dict(layer["schedule"]), art.config)
        assert u.gemm_execs * art.config.macs_per_cycle == layers[layer["name"]]["accel_macs"], layer["name"]
