"""The reference interpreter of quantized graphs: layouts change nothing but the layout, integer layers
match a plain integer model of the same arithmetic, and intermediates are available per layer."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import weft
from weft.compiler import models
from weft.compiler.onnx_import import import_onnx
from weft.compiler.pipeline import build_pipeline, run_pipeline
from weft.config import PRESETS
from weft.core.epilogue import narrow, run_steps
from weft.core.ir import Graph
from weft.core.layout import pack_act, pack_weights, unpack_act, unpack_weights
from weft.core.reference import run_reference

from .test_frontend_util import make_model, rand

SAME_WIDTHS = ["default", "tiny", "rect", "zcu104"]


def _stages(model, config, batches):
    """The graph right after quantization (logical layout) and the final, packed one."""
    kept: dict[str, Graph] = {}
    pipeline = build_pipeline("accel", PRESETS[config], batches)
    final = run_pipeline(import_onnx(model), pipeline, trace=lambda p, g: kept.setdefault(p.name, g))
    return kept["quantize"], final


@pytest.mark.parametrize("config", ["default", "rect"])
def test_packing_changes_only_the_layout(config):
    model = models.awkward_cnn(batch=3)
    feeds = {"input": rand(3, 3, 29, 29, seed=1)}
    logical, packed = _stages(model, config, [{"input": rand(3, 3, 29, 29, seed=k)} for k in range(2)])
    a = run_reference(logical, feeds, keep_intermediates=True)
    b = run_reference(packed, feeds, keep_intermediates=True)
    np.testing.assert_array_equal(a.outputs["logits"], b.outputs["logits"])
    compared = 0
    for name, value in packed.values.items():
        if value.packed and name in b.values and name in a.values:  # (qim2col's output comes after quantize)
            np.testing.assert_array_equal(unpack_act(b.values[name], value.logical), a.values[name], err_msg=name)
            compared += 1
    assert compared > 10


def test_same_widths_give_the_same_integers_on_every_config():
    """Blocks, batch and buffer sizes change the packing, never the arithmetic."""
    model = models.small_resnet(batch=2, widths=(8, 24, 40))
    cal = {"input": rand(2, 2, 3, 32, 32, seed=3)}
    x = {"input": rand(2, 3, 32, 32, seed=4)}
    outs = [weft.InferenceSession(weft.compile(model, config=c, calibration=cal)).run(None, x)[0] for c in SAME_WIDTHS]
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


def _naive_qconv(x: np.ndarray, w: np.ndarray, stride, pads, steps, residual=None) -> np.ndarray:
    """Integer convolution by loops over output pixels (int64), then the epilogue and narrowing."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    t, l, b, r = pads
    xp = np.zeros((n, c, h + t + b, wd + l + r), np.int64)
    xp[:, :, t:t + h, l:l + wd] = x
    ho, wo = (h + t + b - kh) // stride[0] + 1, (wd + l + r - kw) // stride[1] + 1
    acc = np.zeros((n, o, ho, wo), np.int64)
    for i in range(ho):
        for j in range(wo):
            window = xp[:, :, i * stride[0]:i * stride[0] + kh, j * stride[1]:j * stride[1] + kw]
            acc[:, :, i, j] = np.einsum("nckl,ockl->no", window, w.astype(np.int64))
    acc_nhwc = acc.transpose(0, 2, 3, 1)
    res = None if residual is None else residual.astype(np.int64).transpose(0, 2, 3, 1)
    return narrow(run_steps(acc_nhwc, steps, 32, res), 8).transpose(0, 3, 1, 2)


@pytest.mark.parametrize("config", ["default", "rect", "tiny"])
def test_qconv2d_matches_a_loop_over_pixels(config):
    cfg = PRESETS[config]
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", strides=[2, 2], pads=[2, 1, 0, 3]),
         helper.make_node("Add", ["c", "r"], ["s"], name="add"), helper.make_node("Relu", ["s"], ["y"], name="relu")],
        {"x": [3, 5, 9, 8], "r": [3, 7, 5, 5]}, {"y": None}, {"w": rand(7, 5, 3, 3, seed=2)})
    cal = [{"x": rand(3, 5, 9, 8, seed=k), "r": rand(3, 7, 5, 5, seed=50 + k)} for k in range(3)]
    art = weft.compile(model, config=cfg, calibration=cal)
    g = art.graph
    conv = g.node("conv")
    assert conv.op == "qconv2d" and len(conv.inputs) == 3
    # The input comes from the host with 5 channels: the host gathers the 3x3 windows (weft.compiler.im2col)
    # and the accelerator runs a 1x1 convolution over their 45 channels; together they are this conv.
    unfold = g.producers()[conv.inputs[0]]
    assert unfold.op == "qim2col" and conv.attrs["kernel"] == (1, 1)
    sess = weft.InferenceSession(art)
    feeds = {"x": rand(3, 5, 9, 8, seed=8), "r": rand(3, 7, 5, 5, seed=9)}
    sess.run(None, feeds, keep_intermediates=True)
    xq, rq, yq = (unpack_act(sess.intermediate(v), g.values[v].logical) for v in (unfold.inputs[0], conv.inputs[2],
                                                                                   conv.outputs[0]))
    # The GEMM adds the bias: weight columns past the 45 window channels meet qim2col's constant channels.
    constants = np.array(unfold.attrs["constants"], np.int64)
    w_all = unpack_weights(g.constants[conv.inputs[1]], 7, 45 + constants.size)[:, :, 0, 0]
    w = w_all[:, :45].reshape(7, 3, 3, 5).transpose(0, 3, 1, 2)
    bias = (("add_vec", w_all[:, 45:].astype(np.int64) @ constants),) if constants.size else ()
    steps = tuple((k, v[:7] if isinstance(v, np.ndarray) else v) for k, v in (*bias, *conv.attrs["epilogue"]))
    steps = tuple((k, tuple((kk, vv[:7] if isinstance(vv, np.ndarray) else vv) for kk, vv in v)) if k == "residual"
                  else (k, v) for k, v in steps)
    np.testing.assert_array_equal(yq, _naive_qconv(xq, w, (2, 2), (2, 1, 0, 3), steps, rq))
    assert yq.min() >= 0 and yq.max() > 0  # the ReLU is in the epilogue


def test_maxpool_padding_never_wins():
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                         pads=[1, 1, 1, 1], name="pool")], {"x": [1, 3, 5, 5]}, {"y": None})
    x = -np.abs(rand(1, 3, 5, 5, seed=1)) - 0.5  # all negative: a zero pad would win
    art = weft.compile(model, calibration={"x": x})
    got = weft.InferenceSession(art).run(None, {"x": x})[0]
    scale = art.graph.values[art.graph.node("pool").outputs[0]].scale
    from .test_frontend_util import ort_run

    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], atol=scale / 2 + 1e-6)
    assert got.max() < 0


def test_layout_helpers_round_trip():
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (3, 21, 4, 5)).astype(np.int8)
    packed = pack_act(x, batch=2, block=8)
    assert packed.shape == (2, 3, 4, 5, 2, 8)
    np.testing.assert_array_equal(unpack_act(packed, x.shape), x)
    w = rng.integers(-8, 8, (10, 21, 3, 3)).astype(np.int8)
    pw = pack_weights(w, 4, 8, 16, 24)
    assert pw.shape == (4, 3, 3, 3, 4, 8)
    np.testing.assert_array_equal(unpack_weights(pw, 10, 21), w)
    assert not unpack_weights(pw)[10:].any() and not unpack_weights(pw)[:, 21:].any()


def test_run_reference_records_every_layer():
    art = weft.compile(models.mlp(), calibration={"input": rand(4, 4, 64, seed=1)})
    result = run_reference(art.graph, {"input": rand(4, 64)}, keep_intermediates=True)
    assert [r["name"] for r in result.layers] == [n.name for n in art.graph.nodes]
    for row in result.layers:
        assert set(row) == {"name", "op", "target", "macs", "shape", "seconds"}
    assert sum(r["macs"] for r in result.layers) == models.count_macs(models.mlp())
    for node in art.graph.nodes:
        assert result.values[node.outputs[0]].shape == art.graph.values[node.outputs[0]].shape
