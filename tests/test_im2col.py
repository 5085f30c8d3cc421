"""Host im2col (:mod:`weft.compiler.im2col`): a host-fed convolution with few input channels becomes a
``qim2col`` host layer and a 1x1 convolution over the gathered windows; the rewrite is exact (the int8
result is the un-rewritten convolution's, to the bit), and every device computes the same values."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import helper

import weft
from weft.compiler.calibrate import split_batches
from weft.compiler.im2col import bias_columns, unfolds
from weft.compiler.onnx_import import import_onnx
from weft.compiler.pipeline import build_pipeline, run_pipeline
from weft.config import PRESETS
from weft.core.artifact import Artifact, ArtifactError
from weft.core.layout import unpack_act
from weft.core.reference import run_reference

from .artifact_util import members_of, rezip
from .test_frontend_util import make_model, rand


def _stem(h: int = 20, w: int = 18, cin: int = 3, kernel: int = 7, stride: int = 2, pads=(3, 3, 3, 3),
          group: int = 1, cout: int = 8, seed: int = 0):
    """A stem the way PyTorch exports one: Conv (bias, pads, stride), BatchNormalization, Relu, then a
    3x3 convolution, so the rewritten layer's output feeds another accelerator layer."""
    rng = np.random.default_rng(seed)
    inits = {
        "w": (rng.standard_normal((cout, cin // group, kernel, kernel)) * 0.2).astype(np.float32),
        "b": (rng.standard_normal(cout) * 0.3).astype(np.float32),
        "gamma": rng.uniform(0.5, 1.5, cout).astype(np.float32),
        "beta": (rng.standard_normal(cout) * 0.1).astype(np.float32),
        "mean": (rng.standard_normal(cout) * 0.1).astype(np.float32),
        "var": rng.uniform(0.5, 1.5, cout).astype(np.float32),
        "w2": (rng.standard_normal((cout, cout, 3, 3)) * 0.2).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv1", kernel_shape=[kernel, kernel],
                         strides=[stride, stride], pads=list(pads), group=group),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"], name="bn1"),
        helper.make_node("Relu", ["n"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    ]
    return make_model(nodes, {"x": (2, cin, h, w)}, {"y": None}, inits)


def _calibration(model, seed: int = 1) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": rand(3, *shape, seed=seed)}


def _compiled_graphs(model, config):
    """The accel graph with and without the im2col pass."""
    cal = _calibration(model)
    graph = import_onnx(model, None, {"x": cal["x"].shape[1:]})
    pipeline = build_pipeline("accel", config, split_batches(cal, graph))
    without = [p for p in pipeline if p.name != "im2col_host_convs"]
    assert len(without) == len(pipeline) - 1
    return run_pipeline(graph, pipeline), run_pipeline(graph, without)


def test_the_rule_asks_for_a_shorter_reduction():
    assert unfolds(3, (7, 7), 16) and unfolds(3, (7, 7), 4) and unfolds(3, (3, 3), 16)
    assert not unfolds(16, (3, 3), 16)  # already dense
    assert not unfolds(15, (3, 3), 16)  # 135 channels need 9 blocks either way
    assert not unfolds(3, (1, 1), 16)  # nothing to gather


@pytest.mark.parametrize("wgt_max,reach", [(127, 40000), (7, 9000), (1, 1000)])
def test_bias_columns_split_every_bias_they_reach_exactly(wgt_max, reach):
    rng = np.random.default_rng(wgt_max)
    bias = np.concatenate([rng.integers(-reach, reach, 200), [0, 1, -1, 127, -128, reach, -reach]])
    values, weights = bias_columns(bias, 13, 127, wgt_max)
    assert values[0] == 1 and max(values) <= 127 and np.abs(weights).max() <= wgt_max
    np.testing.assert_array_equal(weights @ np.array(values), bias)
    assert bias_columns(bias, len(values) - 1, 127, wgt_max) is None  # the fewest constants that reach
    assert bias_columns(np.array([200]), 1, 127, 127) is None  # one constant, 1, reaches 127


@pytest.mark.parametrize("config", ["tiny", "default", "rect"])
def test_the_rewrite_is_exact(config):
    """The rewritten conv's int8 output equals the original conv's (reference interpreter, both graphs
    in the accelerator's packed layout), and so does the model's."""
    cfg = PRESETS[config]
    model = _stem()
    new, old = _compiled_graphs(model, cfg)
    conv = new.node("conv1")
    unfold = new.producers()[conv.inputs[0]]
    assert unfold.op == "qim2col" and unfold.attrs["target"] == "host"
    assert conv.attrs["target"] == "accel"
    assert conv.attrs["kernel"] == (1, 1) and conv.attrs["strides"] == (1, 1) and conv.attrs["channels"] == (147, 8)
    assert "qim2col" not in old.op_counts() and old.node("conv1").attrs["kernel"] == (7, 7)
    # default and rect have spare channels in the last block: the GEMM adds the bias there
    constants = unfold.attrs["constants"]
    assert (len(constants) > 0) == (config != "tiny")
    assert len(conv.attrs["epilogue"]) == len(old.node("conv1").attrs["epilogue"]) - (len(constants) > 0)
    feeds = {"x": rand(2, 3, 20, 18, seed=4, scale=2.0)}  # beyond the calibrated range: saturated inputs too
    got = run_reference(new, feeds, keep_intermediates=True)
    want = run_reference(old, feeds, keep_intermediates=True)
    y = conv.outputs[0]
    assert y == old.node("conv1").outputs[0]
    logical = new.values[y].logical
    np.testing.assert_array_equal(unpack_act(got.values[y], logical), unpack_act(want.values[y], logical))
    np.testing.assert_array_equal(got.outputs["y"], want.outputs["y"])


@pytest.mark.parametrize("config", ["tiny", "default", "rect", "zcu104", "pynq", "int4w"])
def test_fsim_equals_the_reference(config):
    model = _stem(pads=(3, 2, 1, 3))  # asymmetric pads
    art = weft.compile(model, config=config, calibration=_calibration(model))
    assert art.graph.op_counts()["qim2col"] == 1
    feeds = {"x": rand(2, 3, 20, 18, seed=5)}
    ref, sim = weft.InferenceSession(art, device="ref"), weft.InferenceSession(art, device="fsim")
    want = ref.run(None, feeds, keep_intermediates=True)
    got = sim.run(None, feeds, keep_intermediates=True)
    for node in art.graph.nodes:
        if node.attrs["target"] == "accel" or node.op == "qim2col":
            out = node.outputs[0]
            np.testing.assert_array_equal(sim.intermediate(out), ref.intermediate(out), err_msg=node.name)
    np.testing.assert_array_equal(got[0], want[0])


def test_the_cpu_device_runs_the_host_kernel_bit_exact():
    model = _stem(kernel=3, stride=1, pads=(1, 1, 1, 1))
    art = weft.compile(model, config="default", calibration=_calibration(model))
    assert art.graph.op_counts()["qim2col"] == 1
    feeds = {"x": rand(2, 3, 20, 18, seed=6)}
    ref, cpu = weft.InferenceSession(art, device="ref"), weft.InferenceSession(art, device="cpu", threads=1)
    ref.run(None, feeds, keep_intermediates=True)
    cpu.run(None, feeds, keep_intermediates=True)
    for node in art.graph.nodes:
        out = node.outputs[0]
        if node.op.startswith("q"):
            np.testing.assert_array_equal(cpu.intermediate(out), ref.intermediate(out), err_msg=node.name)


@pytest.mark.parametrize("cin,group", [(3, 3), (16, 1)])
def test_grouped_and_dense_inputs_are_left_alone(cin, group):
    """A grouped host-fed conv, and one whose channels already fill the block, keep their form."""
    model = _stem(cin=cin, group=group, kernel=3, stride=1, pads=(1, 1, 1, 1), cout=6)
    art = weft.compile(model, config="default", calibration=_calibration(model))
    assert "qim2col" not in art.graph.op_counts() and art.graph.node("conv1").attrs["kernel"] == (3, 3)
    feeds = {"x": rand(2, cin, 20, 18, seed=7)}
    want = weft.InferenceSession(art, device="ref").run(None, feeds)
    np.testing.assert_array_equal(weft.InferenceSession(art, device="fsim").run(None, feeds)[0], want[0])


def test_the_artifact_round_trips(tmp_path):
    model = _stem()
    art = weft.compile(model, config="tiny", calibration=_calibration(model))
    loaded = Artifact.load(art.save(tmp_path / "stem.weft"))
    assert loaded.graph.node("conv1_im2col").attrs == art.graph.node("conv1_im2col").attrs
    feeds = {"x": rand(2, 3, 20, 18, seed=8)}
    np.testing.assert_array_equal(weft.InferenceSession(loaded, device="fsim").run(None, feeds)[0],
                                  weft.InferenceSession(art, device="ref").run(None, feeds)[0])


@pytest.mark.parametrize("constants", [[2**20], ["1"], "1,127", [True]])
def test_a_manifest_with_bad_constants_is_refused(constants):
    model = _stem()
    members = members_of(weft.compile(model, config="tiny", calibration=_calibration(model)).to_bytes())
    manifest = json.loads(members["manifest.json"])
    next(n for n in manifest["graph"]["nodes"] if n["op"] == "qim2col")["attrs"]["constants"] = constants
    members["manifest.json"] = json.dumps(manifest).encode()
    with pytest.raises(ArtifactError, match=r"attrs.constants' must be at most 1024 16-bit integers"):
        Artifact.from_bytes(rezip(members))
