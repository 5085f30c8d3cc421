"""Quantized graphs on the "cpu" device: every integer layer bit-exact with the reference interpreter (the
oracle), on several configs, and the ALU epilogue semantics against :func:`run_steps` for random step
lists at every accumulator width."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import weft
from weft.compiler import models
from weft.compiler.llvm.expr import Buffer
from weft.compiler.llvm.host_quant import Epilogue
from weft.compiler.llvm.host_quant import narrow as narrow_expr
from weft.compiler.llvm.jit import build
from weft.compiler.llvm.te import Kernel, compute
from weft.config import PRESETS
from weft.core.epilogue import narrow, run_steps
from weft.core.errors import CalibrationWarning
from weft.runtime import InferenceSession

from .test_frontend_util import make_model, rand


def _quantized(model, config, batches: int = 4):
    inp = model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    cal = np.random.default_rng(1).standard_normal((batches, *shape)).astype(np.float32)
    return weft.compile(model, config=config, calibration={inp.name: cal}), inp.name, shape


def _same_as_reference(art, name, shape, seed: int = 0) -> int:
    """Run both devices; every integer value equal to the bit, floats equal or within float32 rounding.
    Returns how many integer values were compared."""
    x = {name: rand(*shape, seed=seed)}
    ref, cpu = InferenceSession(art, device="ref"), InferenceSession(art, device="cpu", threads=2)
    ref.run(None, x, keep_intermediates=True)
    cpu.run(None, x, keep_intermediates=True)
    compared = 0
    for node in art.graph.nodes:
        out = node.outputs[0]
        a, b = ref.intermediate(out), cpu.intermediate(out)
        assert a.shape == b.shape and a.dtype == b.dtype, out
        if np.issubdtype(a.dtype, np.integer):
            np.testing.assert_array_equal(b, a, err_msg=f"{node.name} ({node.op})")
            compared += 1
        else:  # float host layers (softmax): float32 rounding of another exp
            np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7, err_msg=f"{node.name} ({node.op})")
    return compared


@pytest.mark.parametrize("name,config", [
    ("small_resnet", "default"), ("awkward_cnn", "default"), ("awkward_cnn", "tiny"), ("vgg_small", "int4w"),
    ("mlp", "zcu104"), ("reshape_net", "tiny"), ("awkward_cnn", "a16"), ("small_resnet", "w2"),
])
def test_quantized_models_bit_exact_with_the_reference(name, config):
    cfg = {"a16": PRESETS["default"].replace(name="a16", inp_width=16, out_width=16),
           "w2": PRESETS["default"].replace(name="w2", wgt_width=2)}.get(config, config)
    art, inp, shape = _quantized(models.MODELS[name](), cfg)
    assert "qconv2d" in art.graph.op_counts()
    assert _same_as_reference(art, inp, shape) >= 3


def test_every_integer_op_kind_is_covered():
    """awkward_cnn has them all: qconv2d with residuals, integer pools, qalu, qconcat, quantize/dequantize
    around a float host layer."""
    art, inp, shape = _quantized(models.awkward_cnn(), "default")
    kinds = {"qconv2d", "qmaxpool", "qavgpool", "qalu", "qconcat", "quantize", "dequantize"}
    assert kinds <= set(art.graph.op_counts())
    _same_as_reference(art, inp, shape, seed=5)


def test_pad_and_reshape_layers_stay_exact():
    """qpad (a pad the max-pool cannot absorb) and qreshape between convolutions."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Pad", ["a", "pads"], ["b"], mode="constant"),
             helper.make_node("MaxPool", ["b"], ["c"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["c", "shape"], ["d"]),
             helper.make_node("Conv", ["d", "w2"], ["y"], kernel_shape=[1, 1])]
    inits = {"w1": rand(6, 3, 3, 3, seed=1, scale=0.3), "w2": rand(5, 12, 1, 1, seed=2, scale=0.3),
             "pads": np.array([0, 0, 1, 0, 0, 0, 0, 1], np.int64), "shape": np.array([1, 12, 3, 1], np.int64)}
    model = make_model(nodes, {"x": [1, 3, 5, 3]}, {"y": None}, inits)
    art, inp, shape = _quantized(model, "default")
    assert {"qpad", "qreshape"} <= set(art.graph.op_counts())
    _same_as_reference(art, inp, shape)


def test_sixteen_bit_accumulators_wrap_like_the_alu():
    config = PRESETS["default"].replace(name="acc16", acc_width=16)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], {"x": [1, 8, 4, 4]}, {"y": None},
                       {"w": rand(4, 8, 1, 1, seed=1) * 0.3})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        art, inp, shape = _quantized(model, config, batches=8)
    _same_as_reference(art, inp, shape, seed=9)


@st.composite
def epilogues(draw):
    acc_width = draw(st.sampled_from([16, 32]))
    channels = 16
    lim = 1 << (acc_width - 1)
    imm = st.integers(-(1 << 15), (1 << 15) - 1)
    vec = st.lists(st.integers(-lim, lim - 1), min_size=channels, max_size=channels).map(
        lambda v: np.array(v, np.int64))

    def step(depth: int):
        kinds = ["add_imm", "mul_imm", "shr_imm", "max_imm", "min_imm", "add_vec", "mul_vec", "max_vec", "min_vec"]
        if depth == 0:
            kinds.append("residual")
        kind = draw(st.sampled_from(kinds))
        if kind == "residual":
            return (kind, tuple(step(1) for _ in range(draw(st.integers(0, 2)))))
        if kind == "shr_imm":
            return (kind, draw(st.integers(0, acc_width - 1)))
        return (kind, draw(vec) if kind.endswith("_vec") else draw(imm))

    steps = tuple(step(0) for _ in range(draw(st.integers(1, 6))))
    out_width = draw(st.sampled_from([4, 8, 16]))
    return acc_width, steps, out_width


@settings(max_examples=25, deadline=None)
@given(epilogues(), st.integers(0, 2**31))
def test_epilogue_steps_match_the_alu_semantics(case, seed):
    acc_width, steps, out_width = case
    rows, channels = 8, 16
    lim = 1 << (acc_width - 1)
    rng = np.random.default_rng(seed)
    acc = rng.integers(-lim, lim, (rows, channels))
    res = rng.integers(-lim, lim, (rows, channels))
    epi = Epilogue(steps, acc_width)
    x, r = Buffer("x", (rows, channels), "i32"), Buffer("r", (rows, channels), "i32")
    dtype = "i8" if out_width <= 8 else "i16"
    y = compute("y", (rows, channels),
                lambda i, c: narrow_expr(epi.apply(x[i, c], c, lambda: r[i, c]), out_width, dtype))
    y.vectorize(y.axes[1])
    fn = build(Kernel("epi", [x, r, *epi.buffers], [y.out], [y]))
    got = np.empty((rows, channels), np.int8 if dtype == "i8" else np.int16)
    fn(acc.astype(np.int32), res.astype(np.int32), *epi.arrays, got)
    want = narrow(run_steps(acc, steps, acc_width, res), out_width)
    np.testing.assert_array_equal(got, want.astype(got.dtype))
