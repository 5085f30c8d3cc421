"""Batch > 1 with block_in != block_out (``rect``: 2 x 8 in x 4 out): activations sit in DRAM in the row
order of the rows that move them (:func:`weft.core.layout.to_rows`), a value written in out rows and read by
a convolution gets an inp-row copy from its producer's relayout program, and whole models run bit-exact with
the reference (odd image sizes, grouped convolutions and element-wise layers too). The slow ones: ResNet-18
on fsim, the digits CNN on the RTL (Verilator)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

import weft
from weft.compiler import models
from weft.config import PRESETS, AcceleratorConfig
from weft.core.layout import from_rows, reordered, row_order_refusal, to_rows

from .test_backend_random import _model, layers
from .test_e2e import _compile, _shape, assert_bit_exact
from .test_frontend_util import make_model, rand


def _batch2(name: str):
    if name == "digits_cnn":
        return models.train_digits_cnn(epochs=1, batch=2)  # the weights' quality does not matter here
    return models.MODELS[name](batch=2)


@pytest.mark.parametrize("name", ["awkward_cnn", "mobilenet_v2", "reshape_net"])
def test_rect_runs_odd_shapes_grouped_and_elementwise_layers_bit_exact(name):
    model = _batch2(name)
    art = _compile(model, "rect")
    assert all(n.attrs["target"] == "accel" for n in art.graph.nodes
               if n.op in ("qconv2d", "qmaxpool", "qavgpool", "qalu"))
    input_name, shape = _shape(model)
    assert_bit_exact(art, {input_name: rand(*shape, seed=7)})


def test_each_dma_row_of_a_row_order_is_contiguous():
    x = np.arange(3 * 2 * 8).reshape(3, 2, 8)  # three tiles of batch 2 x block 8
    for rows in (2, 4, 8):
        moved = to_rows(x, rows).reshape(3, 8 // rows, 2 * rows)  # the DMA's rows of (batch, rows)
        for k in range(8 // rows):
            np.testing.assert_array_equal(moved[:, k], x[:, :, k * rows:(k + 1) * rows].reshape(3, -1))
        np.testing.assert_array_equal(from_rows(to_rows(x, rows), rows), x)
    single = np.arange(3 * 8).reshape(3, 1, 8)
    np.testing.assert_array_equal(to_rows(single, 4), single)  # batch 1: the packed order already
    assert (reordered(2, 8, 4), reordered(2, 8, 8), reordered(1, 8, 4)) == (True, False, False)


def test_every_preset_keeps_its_activations_in_row_orders():
    assert all(row_order_refusal(config) is None for config in PRESETS.values())
    refusal = row_order_refusal(PRESETS["rect"].replace(batch=4))
    assert refusal is not None and "batch=2" in refusal


@pytest.mark.parametrize("config", [PRESETS["tiny"], PRESETS["default"].replace(name="default_b2", batch=2)])
def test_batch_one_and_square_configs_keep_the_packed_order(config):
    art = _compile(models.mlp(batch=2), config)
    meta = art.sections["accel"].meta
    assert meta["layers"] and not any("rows" in info or "copies" in info for info in meta["values"].values())
    assert not any("relayout" in layer for layer in meta["layers"])


@pytest.mark.parametrize("name", ["mlp", "digits_cnn", "small_resnet"])
def test_rect_runs_batch_two_models_bit_exact(name):
    model = _batch2(name)
    art = _compile(model, "rect")
    assert all(n.attrs["target"] == "accel" for n in art.graph.nodes if n.op in ("qconv2d", "qmaxpool", "qavgpool"))
    input_name, shape = _shape(model)
    assert shape[0] == 2
    sim = assert_bit_exact(art, {input_name: rand(*shape, seed=7)}, timing=True)
    meta = art.sections["accel"].meta
    copied = {name for name, info in meta["values"].items() if info["copies"]}
    producers = {layer["output"] for layer in meta["layers"] if "relayout" in layer}
    assert copied and producers <= copied  # a copy the host writes (its producer runs there) has no program
    stats = {layer["name"]: layer for layer in sim.stats["layers"]}
    parts = {name: b - a for x in meta["layers"] if "chain" in x for name, a, b in
             zip(x["chain"]["layers"], [0, *x["chain"]["ends"][:-1]], x["chain"]["ends"], strict=True)}
    for layer in meta["layers"]:  # the relayout programs run after their layer and count in its figures
        if layer["name"] in parts:  # (its part of its chain's program; a layer with relayout programs runs its own)
            assert "relayout" not in layer and stats[layer["name"]]["insn_count"] == parts[layer["name"]]
            continue
        relayouts = layer.get("relayout", ())
        assert stats[layer["name"]]["insn_count"] == layer["insn_count"] + sum(r["insn_count"] for r in relayouts)
    assert sim.stats["cycles"] > 0


@pytest.mark.slow
def test_resnet18_batch_two_on_rect_is_bit_exact():
    model = models.resnet18(batch=2)
    art = _compile(model, "rect")
    assert all(n.attrs["target"] == "accel" for n in art.graph.nodes if n.op in ("qconv2d", "qmaxpool", "qavgpool"))
    input_name, shape = _shape(model)
    sim = assert_bit_exact(art, {input_name: rand(*shape, seed=0)}, timing=True)
    print(f"\nResNet-18, batch 2 on rect: {sim.stats['cycles']:,} cycles")


@pytest.mark.slow
@pytest.mark.rtl
def test_digits_cnn_batch_two_on_rect_through_the_rtl_equals_fsim():
    from .test_cosim_slow import _rtl_against_fsim

    model = _batch2("digits_cnn")
    input_name, shape = _shape(model)
    rows = _rtl_against_fsim(_compile(model, "rect"), {input_name: rand(*shape, seed=3)})
    assert len(rows) == 3


@st.composite
def unequal_blocks(draw) -> AcceleratorConfig:
    """Batch 2 with one GEMM block twice the other (the ratio the relayout converts), random buffers."""
    block_in, block_out = draw(st.sampled_from([(8, 4), (4, 8), (16, 8), (8, 16)]))
    row = {"inp": 2 * block_in, "wgt": block_out * block_in * 8, "acc": 2 * block_out * 4}
    sizes = {k: draw(st.integers(7, 10)) for k in row}  # log2 rows
    return AcceleratorConfig(
        name="unequal", batch=2, block_in=block_in, block_out=block_out,
        inp_buff_bytes=row["inp"] << sizes["inp"], wgt_buff_bytes=row["wgt"] << sizes["wgt"] >> 3,
        acc_buff_bytes=row["acc"] << sizes["acc"], uop_buff_bytes=4 << draw(st.integers(8, 11)))


def _then_conv(model):
    """`model` (output "y") followed by a 3x3 convolution reading it: its output needs the relayout."""
    graph = model.graph
    cout = graph.initializer[0].dims[0]
    nodes = [*graph.node, helper.make_node("Conv", ["y", "w_next"], ["z"], name="next", pads=[1, 1, 1, 1])]
    inits = {t.name: np.frombuffer(t.raw_data, np.float32).reshape(t.dims) if t.raw_data else
             np.asarray(t.float_data, np.float32).reshape(t.dims) for t in graph.initializer}
    inits["w_next"] = rand(5, cout, 3, 3, seed=11) * 0.4
    shape = [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]
    return make_model(nodes, {"x": shape}, {"z": None}, inits)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(unequal_blocks(), layers())
def test_random_layers_and_a_consumer_on_unequal_blocks_with_batch_two(config, layer):
    _, _, _, h, w, cin, _, batch, _, _ = layer
    model = _then_conv(_model(*layer))
    cal = [{"x": rand(batch, cin, h, w, seed=s)} for s in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        art = weft.compile(model, config=config, calibration=cal)
    assert_bit_exact(art, {"x": rand(batch, cin, h, w, seed=9) - 0.3})
