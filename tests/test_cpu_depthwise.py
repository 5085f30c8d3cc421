"""Depthwise and grouped convolutions on the cpu backend as PyTorch exports them (Conv with a `group`
attribute, weights (C, C/group, kh, kw), bias, a following Relu or Clip(0, 6)), on random shapes against
onnxruntime (relative error <= 1e-4); and torchvision's full-size MobileNetV2 at a small input size."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import weft
from weft.compiler import models
from weft.runtime import InferenceSession

from .test_frontend_util import make_model, ort_run

RTOL = 1e-4


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


def grouped_model(rng: np.random.Generator, c: int, o: int, group: int, hw: tuple[int, int], k: int, stride: int,
                  pads: list[int], act: str, opset: int = 13):
    inits = {"w": (rng.standard_normal((o, c // group, k, k)) * 0.3).astype(np.float32),
             "b": rng.standard_normal(o).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if act else "y"], group=group, pads=pads,
                              strides=[stride, stride], kernel_shape=[k, k])]
    if act == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif act == "relu6":  # nn.ReLU6 as the exporter writes it
        inits["lo"], inits["hi"] = np.array(0, np.float32), np.array(6, np.float32)
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    return make_model(nodes, {"x": [1, c, *hw]}, {"y": None}, inits, opset=opset)


def _cases() -> list[tuple]:
    """Random shapes, seeded: depthwise (group = C) and 1 < group < C, strides 1 and 2, kernels 3 and 5,
    symmetric and asymmetric pads, with and without an activation."""
    rng = np.random.default_rng(18)
    cases = []
    for k in range(12):
        per_group = [1, 1, 1, 2, 4, 8][k % 6]  # input channels per group: depthwise half of the time
        groups = int(rng.choice([3, 8, 16, 24, 40]))
        c = groups * per_group
        o = c * (2 if k == 5 else 1)  # one channel multiplier of 2
        kernel = 5 if k % 4 == 3 else 3
        pads = [kernel // 2] * 4 if k % 3 else [int(p) for p in rng.integers(0, kernel // 2 + 1, 4)]
        hw = (int(rng.integers(5, 17)), int(rng.integers(5, 17)))
        cases.append((c, o, groups, hw, kernel, 1 + k % 2, pads, ["", "relu", "relu6"][k % 3]))
    return cases


@pytest.mark.parametrize(("c", "o", "group", "hw", "k", "stride", "pads", "act"), _cases())
def test_grouped_conv_against_onnxruntime(c, o, group, hw, k, stride, pads, act):
    rng = np.random.default_rng(c * 7 + o + k)
    model = grouped_model(rng, c, o, group, hw, k, stride, pads, act)
    feeds = {"x": rng.standard_normal((1, c, *hw)).astype(np.float32)}
    sess = InferenceSession(weft.compile(model, target="cpu"), device="cpu", threads=2)
    got = sess.run(None, feeds)[0]
    assert all(layer["kernel"] == "llvm" for layer in sess.stats["layers"])
    assert rel_err(got, ort_run(model, feeds)[0]) <= RTOL


def test_depthwise_layers_run_the_depthwise_kernel():
    """group == C takes the depthwise kernel (channels in the vector lanes), with the Clip fused into it."""
    model = grouped_model(np.random.default_rng(0), 32, 32, 32, (8, 8), 3, 1, [1] * 4, "relu6")
    artifact = weft.compile(model, target="cpu")
    assert [n.op for n in artifact.graph.nodes] == ["FusedConv"]  # Clip fused: no separate step
    sess = InferenceSession(artifact, device="cpu", threads=1)
    assert [s.kernel.name for s in sess.device.plan.steps] == ["pad", "dwconv"]  # the input padded, then one kernel


def test_full_size_mobilenet_v2_against_onnxruntime():
    """torchvision's MobileNetV2 (all 17 inverted residuals, 1280-channel last conv) on a 64x64 input."""
    model = models.mobilenet_v2_224(image=64)
    assert models.count_parameters(model) == models.count_parameters(models.mobilenet_v2_224(image=32))
    feeds = {"input": np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype(np.float32)}
    sess = InferenceSession(weft.compile(model, target="cpu"), device="cpu", threads=2)
    assert rel_err(sess.run(None, feeds)[0], ort_run(model, feeds)[0]) <= RTOL
