"""Random layers on random configs: convolution shapes (kernel, stride, asymmetric pads, channels, batch),
pooling and residual adds, compiled for random buffer sizes and GEMM shapes, must run on the functional
simulator exactly as the reference interpreter computes them. A few examples run by default; the sweep
is marked slow."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import helper

import weft
from weft.config import AcceleratorConfig

from .test_e2e import assert_bit_exact
from .test_frontend_util import make_model, rand


@st.composite
def configs(draw) -> AcceleratorConfig:
    block_in = draw(st.sampled_from([4, 8, 16]))
    block_out = draw(st.sampled_from([4, 8, 16]))
    # batch 2 runs when the blocks are equal or one is twice the other (core.layout.row_order_refusal)
    ratio = max(block_in, block_out) // min(block_in, block_out)
    batch = draw(st.sampled_from([1, 2])) if ratio in (1, 2) else 1
    row = {"inp": batch * block_in, "wgt": block_out * block_in * 8, "acc": batch * block_out * 4}
    sizes = {k: draw(st.integers(7, 10)) for k in row}  # log2 rows
    return AcceleratorConfig(
        name="random", batch=batch, block_in=block_in, block_out=block_out,
        inp_buff_bytes=row["inp"] << sizes["inp"], wgt_buff_bytes=row["wgt"] << sizes["wgt"] >> 3,
        acc_buff_bytes=row["acc"] << sizes["acc"], uop_buff_bytes=4 << draw(st.integers(8, 11)),
        cmd_queue_depth=draw(st.sampled_from([4, 16, 512])), token_queue_depth=draw(st.sampled_from([2, 8, 256])),
    )


@st.composite
def layers(draw) -> tuple:
    k = draw(st.sampled_from([1, 2, 3, 5, 7]))
    stride = draw(st.integers(1, 3))
    pads = [draw(st.integers(0, k - 1)) for _ in range(4)]
    h, w = draw(st.integers(k, 14)), draw(st.integers(k, 14))
    cin, cout = draw(st.integers(1, 20)), draw(st.integers(1, 20))
    batch = draw(st.integers(1, 3))
    pool = draw(st.sampled_from(["none", "max", "avg"]))
    return k, stride, pads, h, w, cin, cout, batch, pool, draw(st.booleans())


def _model(k, stride, pads, h, w, cin, cout, batch, pool, residual):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", strides=[stride, stride], pads=pads)]
    ho = (h + pads[0] + pads[2] - k) // stride + 1
    wo = (w + pads[1] + pads[3] - k) // stride + 1
    inits = {"w": rand(cout, cin, k, k, seed=k + cout) * 0.4}
    y = "c"
    if residual:  # conv(x) + conv'(x): a residual add of two accelerator outputs
        nodes.append(helper.make_node("Conv", ["x", "w2"], ["c2"], name="conv2", strides=[stride, stride], pads=pads))
        nodes.append(helper.make_node("Add", ["c", "c2"], ["s"], name="add"))
        inits["w2"] = rand(cout, cin, k, k, seed=3) * 0.4
        y = "s"
    if pool != "none" and min(ho, wo) >= 2:
        op = "MaxPool" if pool == "max" else "AveragePool"
        attrs = {"pads": [1, 0, 1, 1]} if pool == "max" else {}
        nodes.append(helper.make_node(op, [y], ["p"], name="pool", kernel_shape=[2, 2], strides=[1, 2], **attrs))
        y = "p"
    nodes.append(helper.make_node("Relu", [y], ["y"], name="relu"))
    return make_model(nodes, {"x": [batch, cin, h, w]}, {"y": None}, inits)


def _check(config: AcceleratorConfig, layer: tuple) -> None:
    _, _, _, h, w, cin, _, batch, _, _ = layer
    model = _model(*layer)
    cal = [{"x": rand(batch, cin, h, w, seed=s)} for s in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        art = weft.compile(model, config=config, calibration=cal)
    # A layer that fits no tiling of the config's buffers runs on the host instead, still bit-exact.
    event("a layer fell back to the host" if art.graph.meta["fallbacks"] else "ran")
    assert_bit_exact(art, {"x": rand(batch, cin, h, w, seed=9) - 0.3})


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), layers())
def test_random_layers_on_random_configs(config, layer):
    _check(config, layer)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), layers())
def test_random_layers_on_random_configs_sweep(config, layer):
    _check(config, layer)
