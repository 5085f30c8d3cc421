"""Whole models through the back end onto the functional simulator: every accelerator layer's DRAM output
equals the reference interpreter's packed integers, to the bit, for every test model and config."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import helper

import weft
from weft.compiler import models
from weft.compiler.backend import BackendError, Schedule
from weft.config import PRESETS, AcceleratorConfig
from weft.runtime.fsim_device import timing_model

from .test_frontend_util import cosine, make_model, ort_run, rand

CONFIGS = ["tiny", "default", "zcu104"]
MODELS = ["small_resnet", "vgg_small", "mlp", "awkward_cnn", "reshape_net", "digits_cnn"]


@pytest.fixture(scope="module")
def onnx_models() -> dict[str, onnx.ModelProto]:
    built = {name: models.MODELS[name]() for name in MODELS if name != "digits_cnn"}
    built["digits_cnn"] = models.train_digits_cnn(epochs=1)  # the weights' quality does not matter here
    return built


def _shape(model: onnx.ModelProto) -> tuple[str, list[int]]:
    inp = model.graph.input[0]
    return inp.name, [d.dim_value for d in inp.type.tensor_type.shape.dim]


def _compile(model: onnx.ModelProto, config, **options):
    name, shape = _shape(model)
    rng = np.random.default_rng(1)
    cal = {name: rng.standard_normal((2, *shape)).astype(np.float32)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return weft.compile(model, config=config, calibration=cal, **options)


def assert_bit_exact(art, feeds, timing: bool = False) -> weft.InferenceSession:
    """fsim and ref agree on every accelerator layer's output and on the model's outputs (the fsim session
    is returned, holding the run; `timing` asks the timing model for cycles too)."""
    ref = weft.InferenceSession(art, device="ref")
    sim = weft.InferenceSession(art, device="fsim", timing=timing)
    want = ref.run(None, feeds, keep_intermediates=True)
    got = sim.run(None, feeds, keep_intermediates=True)
    accel = [n for n in art.graph.nodes if n.attrs.get("target") == "accel"]
    assert accel
    for node in accel:
        out = node.outputs[0]
        np.testing.assert_array_equal(sim.intermediate(out), ref.intermediate(out), err_msg=f"layer {node.name}")
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    return sim


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", MODELS)
def test_fsim_equals_ref_on_every_model_and_config(onnx_models, name, config):
    model = onnx_models[name]
    art = _compile(model, config)
    input_name, shape = _shape(model)
    sim = assert_bit_exact(art, {input_name: rand(*shape, seed=7)})
    stats = sim.stats
    assert stats["accel_mac_fraction"] == 1.0
    meta = art.sections["accel"].meta
    assert {layer["name"] for layer in meta["layers"]} == {n.name for n in art.graph.nodes
                                                          if n.attrs.get("target") == "accel"}
    counts = {r["name"]: r["insn_count"] for r in stats["layers"] if r["target"] == "accel"}
    for layer in meta["layers"]:  # the static checks ran on every stream; each ran (a chain as one program)
        assert layer["checked_executions"] > 0
        if "chain" in layer:
            assert sum(counts[name] for name in layer["chain"]["layers"]) == layer["chain"]["insn_count"]
        elif "chain_head" not in layer:
            assert layer["insn_count"] == counts[layer["name"]]


def test_resnet18_runs_every_convolution_on_the_accelerator():
    model = models.resnet18()
    art = _compile(model, "default")
    x = {"input": rand(1, 3, 224, 224, seed=3)}
    sim = assert_bit_exact(art, x, timing=True)
    stats = sim.stats
    convs = [layer for layer in stats["layers"] if layer["op"] == "qconv2d"]
    assert len(convs) == 21 and all(layer["target"] == "accel" for layer in convs)
    # the host quantizes the image and gathers conv1's 7x7x3 windows into 147 channels (weft.compiler.im2col)
    assert {layer["op"] for layer in stats["layers"] if layer["target"] == "host"} == {"quantize", "qim2col",
                                                                                       "dequantize"}
    assert stats["accel_mac_fraction"] == 1.0 and stats["macs"] == models.count_macs(model)
    # the max-pool runs in conv1's epilogue (weft.compiler.pool_fusion): no layer, no DRAM pass of its own
    assert not any(layer["op"] == "qmaxpool" for layer in stats["layers"])
    assert next(n for n in art.graph.nodes if n.name == "conv1").attrs["pooled"] == "maxpool"
    first = convs[0]
    assert first["insns"]["alu"] > 0
    assert first["name"] == "conv1" and first["accel_macs"] >= first["macs"]  # 147 channels padded to the block
    assert first["bytes"]["wgt"] > 0 and first["bytes"]["inp"] > 0 and first["bytes"]["out"] > 0
    assert cosine(sim.intermediate(art.graph.outputs[0]), ort_run(model, x)[0]) > 0.99
    if timing_model() is not None:  # cycles per layer, and a GEMM utilization that makes sense
        assert stats["cycles"] == sum(layer["cycles"] for layer in stats["layers"] if layer["target"] == "accel")
        for layer in convs:
            assert 0 < layer["accel_macs"] / (layer["cycles"] * PRESETS["default"].macs_per_cycle) <= 1
    meta = art.sections["accel"].meta
    shared = {}
    for layer in meta["layers"]:  # identical layers share one micro-op block in DRAM
        shared.setdefault((layer["uop_addr"]), []).append(layer["name"])
    assert any({"layer1.0.conv1", "layer1.1.conv1"} <= set(names) for names in shared.values())


def _awkward_model() -> onnx.ModelProto:
    """Negative max-pool inputs with padding, avg-pool, a standalone residual add with a clip, a 5x5
    stride-2 convolution with asymmetric pads, 13 channels, batch 3."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv5", strides=[2, 2], pads=[2, 1, 0, 3]),
        helper.make_node("MaxPool", ["c1"], ["p1"], name="pool_neg", kernel_shape=[3, 3], strides=[1, 1],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["p1", "c1"], ["s1"], name="add"),
        helper.make_node("Clip", ["s1", "lo", "hi"], ["r1"], name="clip"),
        helper.make_node("AveragePool", ["r1"], ["a1"], name="avg", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["a1", "w2"], ["y"], name="conv1x1"),
    ]
    inits = {"w1": rand(13, 5, 5, 5, seed=2) * 0.3, "w2": rand(6, 13, 1, 1, seed=4),
             "lo": np.array(-1.0, np.float32), "hi": np.array(2.0, np.float32)}
    return make_model(nodes, {"x": [3, 5, 17, 15]}, {"y": None}, inits)


@pytest.mark.parametrize("config", ["tiny", "default"])
def test_awkward_layers_are_exact(config):
    model = _awkward_model()
    art = _compile(model, config)
    layers = {n.name: n.attrs.get("target") for n in art.graph.nodes}
    assert layers["conv5"] == layers["pool_neg"] == layers["avg"] == "accel"
    x = {"x": rand(3, 5, 17, 15, seed=5) - 1.0}
    assert_bit_exact(art, x)
    pool_in = art.graph.values[art.graph.node("pool_neg").inputs[0]]
    sess = weft.InferenceSession(art, device="ref")
    sess.run(None, x, keep_intermediates=True)
    assert sess.intermediate(pool_in.name).min() < 0  # the pool really sees negative values


def test_latency_hiding_off_keeps_the_tiles_and_the_result(onnx_models):
    model = onnx_models["small_resnet"]
    on, off = _compile(model, "default"), _compile(model, "default", latency_hiding=False)
    x = {"input": rand(1, 3, 32, 32, seed=9)}
    assert_bit_exact(off, x)
    np.testing.assert_array_equal(weft.InferenceSession(on, device="fsim").run(None, x)[0],
                                  weft.InferenceSession(off, device="fsim").run(None, x)[0])
    for a, b in zip(on.sections["accel"].meta["layers"], off.sections["accel"].meta["layers"], strict=True):
        assert b["schedule"]["vthreads"] == 1
        assert {k: v for k, v in a["schedule"].items() if k != "vthreads"} == \
            {k: v for k, v in b["schedule"].items() if k != "vthreads"}


def test_schedules_can_be_given_per_layer_and_bad_ones_name_the_layer(onnx_models):
    model = onnx_models["vgg_small"]
    chosen = Schedule(tile_h=4, tile_w=8, tile_oc=1, tile_ic=1, order="pix_outer", vthreads=2)
    art = _compile(model, "default", schedules={"features.1.0.conv": chosen.to_dict()})
    layer = next(x for x in art.sections["accel"].meta["layers"] if x["name"] == "features.1.0.conv")
    assert Schedule.from_dict(layer["schedule"]) == chosen
    assert_bit_exact(art, {"input": rand(1, 3, 32, 32, seed=2)})
    rows = Schedule(tile_h=4, tile_w=8, tile_oc=1, tile_ic=1, vthreads=2, tile_kh=1)  # kernel rows one by one
    art = _compile(model, "default", schedules={"features.2.1.conv": rows})
    assert_bit_exact(art, {"input": rand(1, 3, 32, 32, seed=3)})
    too_big = Schedule(tile_h=32, tile_w=32, tile_oc=1, tile_ic=1, vthreads=2)  # 1024 acc rows + vectors > half
    with pytest.raises(BackendError, match=r"node 'features.0.1.conv' \(qconv2d\): no schedule lowers"):
        _compile(model, "default", schedules={"features.0.1.conv": too_big})
    with pytest.raises(ValueError, match="'nope', which is not an accelerator layer"):
        _compile(model, "default", schedules={"nope": chosen})


def test_a_config_that_cannot_run_a_layer_sends_it_to_the_host_saying_why(onnx_models):
    # batch 4 with blocks 8 in x 4 out: the DRAM rows of its activations cannot be converted between the
    # inp and out row orders on the accelerator (core.layout.row_order_refusal)
    art = _compile(onnx_models["mlp"], PRESETS["rect"].replace(batch=4))
    matmul = art.graph.node("layers.0.matmul")
    assert matmul.op == "qconv2d" and matmul.attrs["target"] == "host"
    assert matmul.attrs["host_reason"].startswith("config 'rect' has batch 4")
    assert art.sections["accel"].meta["layers"] == []


@pytest.mark.parametrize("config", [
    AcceleratorConfig(name="in8out4", block_in=8, block_out=4, uop_buff_bytes=4096, inp_buff_bytes=4096,
                      wgt_buff_bytes=8192, acc_buff_bytes=16384),
    AcceleratorConfig(name="in4out8", block_in=4, block_out=8, uop_buff_bytes=4096, inp_buff_bytes=4096,
                      wgt_buff_bytes=8192, acc_buff_bytes=16384),
    AcceleratorConfig(name="batch2", batch=2, block_in=8, block_out=8, uop_buff_bytes=4096, inp_buff_bytes=8192,
                      wgt_buff_bytes=8192, acc_buff_bytes=32768, token_queue_depth=4, cmd_queue_depth=8),
    PRESETS["int4w"],
], ids=lambda c: c.name)
def test_other_configs_adapt(onnx_models, config):
    """Non-square GEMMs (one packed block holds two GEMM blocks), batch 2, shallow queues, int4 weights."""
    for name in ("awkward_cnn", "reshape_net"):
        model = onnx_models[name]
        input_name, shape = _shape(model)
        assert_bit_exact(_compile(model, config), {input_name: rand(*shape, seed=11)})
