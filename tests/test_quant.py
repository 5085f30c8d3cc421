"""Integer quantization: ALU epilogue semantics (checked against the functional simulator's ALU), the
multiplier/shift solver (accurate, and provably never wrapping), weights and scales, config widths."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import weft
from weft.compiler import models
from weft.compiler.onnx_import import import_onnx
from weft.compiler.pipeline import build_pipeline, run_pipeline
from weft.compiler.requant import build_epilogue, solve_rescale, solve_rq
from weft.config import PRESETS
from weft.core.epilogue import EpilogueOverflow, bounds, check_steps, narrow, run_steps
from weft.core.layout import act_block, unpack_weights
from weft.core.reference import run_reference
from weft.isa import AluOp, layout_of
from weft.isa.arith import rq_pack
from weft.sim.kernels import alu_apply

from .test_frontend_util import make_model, rand

CFG = PRESETS["default"]
IMM = layout_of(CFG).formats["alu"].field("imm")
IMM_RANGE = (IMM.min, IMM.max)
_OPS = {"add": AluOp.ADD, "mul": AluOp.MUL, "shr": AluOp.SHR, "max": AluOp.MAX, "min": AluOp.MIN, "rq": AluOp.RQ}


def _on_fsim_alu(acc: np.ndarray, steps, acc_width: int, residual: np.ndarray | None = None) -> np.ndarray:
    """Run an epilogue with the functional simulator's ALU kernel, the way the back end will: the
    accumulator rows, vectors in extra rows used as src, residual rows transformed then added."""
    rows, lanes = acc.shape
    work = np.zeros((rows * 2 + 1, lanes), np.int64)
    work[:rows] = acc
    dst, vec_row = np.arange(rows), rows * 2

    def apply(target: np.ndarray, steps_) -> None:
        for kind, operand in steps_:
            if kind == "residual":
                work[rows:2 * rows] = residual
                apply(np.arange(rows, 2 * rows), operand)
                alu_apply(work, AluOp.ADD, target, np.arange(rows, 2 * rows), 0, acc_width, work.shape[0])
                continue
            op = _OPS[kind.split("_")[0]]
            if kind.endswith("_imm"):
                alu_apply(work, op, target, None, operand, acc_width, work.shape[0])
            else:
                work[vec_row] = operand
                alu_apply(work, op, target, np.full(rows, vec_row), 0, acc_width, work.shape[0])

    apply(dst, steps)
    return work[:rows]


def _random_steps(rng: np.random.Generator, lanes: int, depth: int = 0) -> tuple:
    steps = []
    for _ in range(8):
        kind = str(rng.choice(["add_imm", "mul_imm", "shr_imm", "max_imm", "min_imm", "add_vec", "mul_vec",
                               "max_vec", "min_vec", "rq_vec"] + (["residual"] if depth == 0 else [])))
        if kind == "residual":
            steps.append((kind, _random_steps(rng, lanes, 1)))
        elif kind == "shr_imm":
            steps.append((kind, int(rng.integers(0, 32))))
        elif kind == "rq_vec":
            steps.append((kind, rq_pack(rng.integers(-(1 << 17), 1 << 17, lanes), rng.integers(0, 64, lanes),
                                        rng.integers(0, 2, lanes), 32)))
        elif kind.endswith("_imm"):
            steps.append((kind, int(rng.integers(IMM.min, IMM.max + 1))))
        else:
            steps.append((kind, rng.integers(-(2**31), 2**31, lanes)))
    return tuple(steps)


def test_epilogue_semantics_equal_the_simulator_alu():
    rng = np.random.default_rng(0)
    for trial in range(40):
        lanes = 16
        acc = rng.integers(-(2**31), 2**31, (5, lanes))
        residual = rng.integers(-128, 128, (5, lanes))
        steps = _random_steps(rng, lanes)
        want = _on_fsim_alu(acc, steps, 32, residual)
        np.testing.assert_array_equal(run_steps(acc, steps, 32, residual), want, err_msg=f"trial {trial}: {steps}")


def _exact(x: np.ndarray, steps, residual: np.ndarray | None = None) -> np.ndarray:
    """The epilogue in unbounded integers (no wrap): equal to run_steps exactly when nothing overflows."""
    acc = x.astype(object)
    for kind, v in steps:
        op = kind.split("_")[0]
        if kind == "residual":
            acc = acc + _exact(residual, v)
            continue
        v = v.astype(object) if isinstance(v, np.ndarray) else v
        if kind == "rq_vec":  # the fields as the ISA packs them for 32-bit accumulators: m 18, s 6, ReLU 1
            m = np.array([((int(p) & 0x3FFFF) ^ 0x20000) - 0x20000 for p in v], dtype=object)
            s = np.array([(int(p) >> 18) & 63 for p in v], dtype=object)
            relu = np.array([(int(p) >> 24) & 1 for p in v], dtype=object)
            rounded = (acc * m + np.array([(1 << int(k)) >> 1 for k in s], dtype=object)) // 2 ** s
            acc = np.where(relu == 1, np.maximum(rounded, 0), rounded)
            continue
        acc = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "shr": lambda a, b: a >> b,
               "max": np.maximum, "min": np.minimum}[op](acc, v)
    return acc


@pytest.mark.parametrize("seed", range(6))
def test_requantization_is_accurate_and_never_wraps(seed):
    rng = np.random.default_rng(seed)
    channels = 24
    bound = rng.integers(1 << 8, 1 << 24, channels)
    real = rng.uniform(0.3, 3.0, channels) * 127 / bound * rng.uniform(1, 8)  # output range a few times 127
    bias = rng.integers(-1000, 1000, channels)
    kwargs = {"residual_real": rng.uniform(0.2, 2.0, channels)} if seed % 2 else {}
    steps = build_epilogue(real=real, bound=bound, acc_width=32, out_width=8, imm_range=IMM_RANGE, lo=0, hi=127,
                           bias=bias, **kwargs)
    check_steps(steps, channels, 32, IMM_RANGE)
    x = np.concatenate([rng.integers(-bound, bound + 1, (2000, channels)), bound[None], -bound[None]])
    residual = rng.integers(-128, 128, x.shape) if seed % 2 else None
    got = run_steps(x, steps, 32, residual)
    np.testing.assert_array_equal(got, _exact(x, steps, residual).astype(np.int64))  # no wrap anywhere
    want = (x + bias) * real + (residual * kwargs["residual_real"] if seed % 2 else 0)
    err = np.abs(narrow(got, 8).astype(np.int64) - np.clip(np.round(want), 0, 127))
    assert err.max() <= 1 and err.mean() < 0.01


@pytest.mark.parametrize("seed", range(4))
def test_rq_bounds_hold_every_value(seed):
    """bounds() of an RQ step contains RQ of every value of its input interval (ends included), per channel."""
    rng = np.random.default_rng(seed)
    lo, hi = np.sort(rng.integers(-(1 << 24), 1 << 24, (2, 8)), axis=0)
    packed = rq_pack(rng.integers(-(1 << 17), 1 << 17, 8), rng.integers(12, 40, 8), rng.integers(0, 2, 8), 32)
    got_lo, got_hi = bounds((("rq_vec", packed),), lo, hi, 32)
    x = np.concatenate([lo[None], hi[None], rng.integers(lo, hi + 1, (500, 8))])
    y = run_steps(x, (("rq_vec", packed),), 32)
    assert np.all(y >= got_lo) and np.all(y <= got_hi)
    assert np.all((y == got_lo).any(axis=0)) and np.all((y == got_hi).any(axis=0))  # tight at the ends


def test_rq_epilogue_is_one_pass_and_no_less_precise():
    """A plain layer's requantization with RQ: the bias and one RQ carrying the ReLU, more precise than the
    shift-multiply-shift form it replaces."""
    rng = np.random.default_rng(7)
    channels = 32
    bound = rng.integers(1 << 12, 1 << 22, channels)
    real = rng.uniform(0.3, 3.0, channels) * 127 / bound
    bias = rng.integers(-1000, 1000, channels)
    steps = build_epilogue(real=real, bound=bound, acc_width=32, out_width=8, imm_range=IMM_RANGE, lo=0, hi=127,
                           bias=bias, pixels=3136)
    assert [k for k, _ in steps] == ["add_vec", "rq_vec"]
    packed, error = solve_rq(real, bound + np.abs(bias), 32, 8, relu=True)
    assert np.array_equal(packed, steps[1][1])
    old = solve_rescale(real, bound + np.abs(bias), 32, 8)
    assert error <= old.error


@pytest.mark.parametrize("seed", range(4))
def test_a_residual_the_gemm_scales_is_accurate_and_never_wraps(seed):
    """With residual_scale (a convolution's GEMM adds the residual times c): the residual's steps are that
    product alone, nothing wraps, and the result is as accurate as the fixed-point form."""
    rng = np.random.default_rng(seed)
    channels = 24
    bound = rng.integers(1 << 8, 1 << 22, channels)
    real = rng.uniform(0.3, 3.0, channels) * 127 / bound
    bias = rng.integers(-1000, 1000, channels)
    r_real = np.full(channels, rng.uniform(0.2, 2.0))
    steps = build_epilogue(real=real, bound=bound, acc_width=32, out_width=8, imm_range=IMM_RANGE, lo=0, hi=127,
                           bias=bias, residual_real=r_real, residual_scale=127, pixels=784)
    check_steps(steps, channels, 32, IMM_RANGE)
    assert ("residual", (("mul_imm", 127),)) in [(k, v) for k, v in steps if k == "residual"]
    x = np.concatenate([rng.integers(-bound, bound + 1, (4000, channels)), bound[None], -bound[None]])
    residual = rng.integers(-128, 128, x.shape)
    got = run_steps(x, steps, 32, residual)
    np.testing.assert_array_equal(got, _exact(x, steps, residual).astype(np.int64))  # no wrap anywhere
    want = (x + bias) * real + residual * r_real
    err = np.abs(narrow(got, 8).astype(np.int64) - np.clip(np.round(want), 0, 127))
    assert err.max() <= 1 and err.mean() < 0.01
    # the quantizer may not use it where c is small (int4 weights: c = 7), since its rounding is in 1/c units
    coarse = build_epilogue(real=real, bound=bound, acc_width=32, out_width=8, imm_range=IMM_RANGE, lo=0, hi=127,
                            bias=bias, residual_real=np.full(channels, 2.0), residual_scale=7, pixels=784)
    assert ("residual", (("mul_imm", 7),)) not in [(k, v) for k, v in coarse if k == "residual"]


def test_solver_uses_immediates_for_shared_factors():
    rs = solve_rescale(np.full(4, 1 / 49), np.full(4, 49 * 128), 32, 8, imm_max=IMM.max)
    assert np.all(rs.multiplier == rs.multiplier[0]) and rs.multiplier[0] <= IMM.max
    # a small layer (a global pooling: one pixel a channel) keeps immediates, where RQ would need a vector load
    steps = build_epilogue(real=np.full(4, 1 / 49), bound=np.full(4, 49 * 128), acc_width=32, out_width=8,
                           imm_range=IMM_RANGE, lo=-128, hi=127, pixels=1)
    assert all(kind.endswith("_imm") for kind, _ in steps)
    # a large one takes RQ's single pass
    steps = build_epilogue(real=np.full(4, 1 / 49), bound=np.full(4, 49 * 128), acc_width=32, out_width=8,
                           imm_range=IMM_RANGE, lo=-128, hi=127, pixels=56 * 56)
    assert [kind for kind, _ in steps] == ["rq_vec"]


def test_overflow_is_detected_and_reported():
    with pytest.raises(EpilogueOverflow, match=r"step 1 \(mul_imm\) may reach"):
        bounds((("add_imm", 5), ("mul_imm", 30000)), np.array([-(2**20)]), np.array([2**20]), 32)
    with pytest.raises(EpilogueOverflow):
        solve_rescale(np.array([1e6]), np.array([2**30]), 32, 8)
    with pytest.raises(ValueError, match=r"step 0 \(add_imm\) immediate 40000 is outside"):
        check_steps((("add_imm", 40000),), 4, 32, IMM_RANGE)
    with pytest.raises(ValueError, match="needs an integer vector of 4 channels"):
        check_steps((("mul_vec", np.ones(3, np.int32)),), 4, 32, IMM_RANGE)


def _compiled(model, config=CFG, shape=(1, 3, 32, 32), batches=4):
    cal = {model.graph.input[0].name: rand(batches, *shape, seed=11)}
    return weft.compile(model, config=config, calibration=cal)


def test_weights_are_per_channel_symmetric_at_the_config_width():
    for config, wmax in ((CFG, 127), (PRESETS["int4w"], 7)):
        art = _compiled(models.small_resnet(), config)
        for node in art.graph.nodes:
            if node.op != "qconv2d":
                continue
            assert art.graph.values[node.inputs[1]].dtype == f"int{config.wgt_width}"
            w = unpack_weights(art.graph.constants[node.inputs[1]], *node.attrs["channels"][::-1])
            per_channel = np.abs(w.reshape(w.shape[0], -1)).max(axis=1)
            assert per_channel.max() == wmax and np.all(per_channel[per_channel > 0] >= wmax - 1)


def test_int4_weights_still_track_the_float_model():
    from .test_frontend_util import cosine, ort_run

    model = models.small_resnet()
    art = _compiled(model, PRESETS["int4w"], batches=8)
    sess = weft.InferenceSession(art)
    x = rand(1, 3, 32, 32, seed=5)
    assert cosine(sess.run(None, {"input": x})[0], ort_run(model, {"input": x})[0]) > 0.95


def test_epilogues_are_proven_for_every_input():
    """Recheck the quantizer's proof from the artifact alone: with the worst-case accumulator of each
    conv's int8 weights, no epilogue step can leave the 32-bit accumulator."""
    art = _compiled(models.small_resnet())
    for node in art.graph.nodes:
        if node.op != "qconv2d":
            continue
        w = unpack_weights(art.graph.constants[node.inputs[1]]).astype(np.int64)
        worst = np.abs(w.reshape(w.shape[0], -1)).sum(axis=1) * 128
        residual = (np.full(w.shape[0], -128), np.full(w.shape[0], 127))
        bounds(node.attrs["epilogue"], -worst, worst, 32, residual=residual)


def test_scales_are_shared_where_values_only_move():
    art = _compiled(models.awkward_cnn(), shape=(1, 3, 29, 29))
    g = art.graph
    for node in g.nodes:
        if node.op in ("qmaxpool", "qconcat", "qreshape", "qpad"):
            scales = {g.values[x].scale for x in [*node.inputs, *node.outputs]}
            assert len(scales) == 1, node
    concat = next(n for n in g.nodes if n.op == "qconcat")
    assert len(concat.inputs) == 3


def test_padded_channels_stay_zero_through_every_layer():
    art = _compiled(models.awkward_cnn(), shape=(1, 3, 29, 29))
    sess = weft.InferenceSession(art)
    sess.run(None, {"input": rand(1, 3, 29, 29, seed=2)}, keep_intermediates=True)
    block = act_block(CFG)
    checked = 0
    for name, value in art.graph.values.items():
        if not value.packed or name in art.graph.constants:
            continue
        packed = sess.intermediate(name)
        c = value.logical[1]
        lanes = packed.transpose(0, 4, 2, 3, 1, 5).reshape(-1, packed.shape[1] * block)
        assert not np.any(lanes[:, c:]), name
        checked += c % block != 0
    assert checked >= 3  # the model has channel counts 5, 24, 69... that are not block multiples


def test_sixteen_bit_accumulator_falls_back_to_calibrated_ranges():
    """acc_width=16 cannot hold a worst-case 1x1 conv sum of 8 channels; calibrated sums fit, so the
    quantizer uses twice their range and the model still runs."""
    config = PRESETS["default"].replace(name="acc16", acc_width=16)
    w = rand(4, 8, 1, 1, seed=1) * 0.3
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="c")], {"x": [1, 8, 4, 4]}, {"y": None},
                       {"w": w})
    art = weft.compile(model, config=config, calibration={"x": rand(8, 1, 8, 4, 4, seed=3)})
    x = rand(1, 8, 4, 4, seed=9)
    y = weft.InferenceSession(art).run(None, {"x": x})[0]
    want = np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0])
    assert np.corrcoef(y.ravel(), want.ravel())[0, 1] > 0.99


def test_a_relu_after_a_tensor_add_joins_its_epilogue():
    """Add of two convs that both have other readers cannot fuse in float; its ReLU then folds into the
    integer Add's epilogue, with the same integers as the separate layer."""
    nodes = [helper.make_node(op, ins, [out], name=name) for op, ins, out, name in (
        ("Conv", ["x", "w1"], "a", "c1"), ("Conv", ["x", "w2"], "b", "c2"), ("Add", ["a", "b"], "s", "add"),
        ("Relu", ["s"], "r", "relu"), ("Add", ["r", "a"], "t", "add2"), ("Add", ["t", "b"], "y", "add3"))]
    weights = {"w1": rand(4, 3, 1, 1, seed=1), "w2": rand(4, 3, 1, 1, seed=2)}
    model = make_model(nodes, {"x": [1, 3, 5, 5]}, {"y": None}, weights)
    kept: dict = {}
    pipeline = build_pipeline("accel", CFG, [{"x": rand(1, 3, 5, 5, seed=k)} for k in range(3)])
    final = run_pipeline(import_onnx(model), pipeline, trace=lambda p, g: kept.setdefault(p.name, g))
    assert [n.name for n in kept["quantize"].nodes if n.op == "qalu"] == ["add", "relu", "add2", "add3"]
    assert final.node("add").attrs["epilogue"][-1] == ("max_imm", 0) and "relu" not in [n.name for n in final.nodes]
    x = {"x": rand(1, 3, 5, 5, seed=9)}
    np.testing.assert_array_equal(run_reference(final, x).outputs["y"], run_reference(kept["quantize"], x).outputs["y"])


def test_data_movement_and_affine_layers_stay_integer():
    """Pad before a max-pool (not foldable), a 4-D reshape between convolutions, and `k - x` (an affine
    layer with negative scale) run as integer layers and still track onnxruntime."""
    from .test_frontend_util import cosine, ort_run

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="r1"),
        helper.make_node("Pad", ["r1", "pads", "pv"], ["p"], name="pad"),
        helper.make_node("MaxPool", ["p"], ["m"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["m", "shape"], ["rs"], name="reshape"),
        helper.make_node("Conv", ["rs", "w2"], ["c2"], name="c2"),
        helper.make_node("Sub", ["k", "c2"], ["y"], name="flip"),
    ]
    inits = {"w1": rand(8, 3, 3, 3, seed=1), "w2": rand(5, 4, 1, 1, seed=2), "shape": np.array([1, 4, 8, 4], np.int64),
             "pads": np.array([0, 0, 1, 0, 0, 0, 1, 2], np.int64), "pv": np.float32(0.25),
             "k": np.float32(0.5)}
    model = make_model(nodes, {"x": [1, 3, 6, 6]}, {"y": None}, inits)
    art = weft.compile(model, calibration={"x": rand(8, 1, 3, 6, 6, seed=3)})
    ops = {n.name: n.op for n in art.graph.nodes}
    assert (ops["pad"], ops["reshape"], ops["pool"]) == ("qpad", "qreshape", "qmaxpool")
    assert art.graph.node("c2").op == "qconv2d"  # Sub(k, conv) folded into the conv as a negative scale
    x = rand(1, 3, 6, 6, seed=4)
    assert cosine(weft.InferenceSession(art).run(None, {"x": x})[0], ort_run(model, {"x": x})[0]) > 0.99

    nodes = [helper.make_node("MaxPool", ["x"], ["m"], kernel_shape=[2, 2], name="pool"),
             helper.make_node("Sub", ["k", "m"], ["y"], name="flip")]
    k = np.array([0.5, -1, 2], np.float32).reshape(3, 1, 1)
    model = make_model(nodes, {"x": [1, 3, 6, 6]}, {"y": None}, {"k": k})
    art = weft.compile(model, calibration={"x": rand(8, 1, 3, 6, 6, seed=3)})
    assert art.graph.node("flip").op == "qalu" and art.graph.node("flip").attrs["source_op"] == "ChannelAffine"
    assert cosine(weft.InferenceSession(art).run(None, {"x": x})[0], ort_run(model, {"x": x})[0]) > 0.99


def test_huge_factors_clamp_the_accumulator_before_rescaling():
    """A factor so large that no shift can multiply the whole accumulator range: the epilogue first
    clamps to where the output saturates anyway, and stays exact to rounding."""
    real = np.array([40.0, 3.5, 0.0, 1000.0])
    bound = np.full(4, 1 << 28)
    bias = np.array([5, -7, 3, 0])
    steps = build_epilogue(real=real, bound=bound, acc_width=32, out_width=8, imm_range=IMM_RANGE, lo=-128, hi=127,
                           bias=bias)
    assert steps[1][0].startswith("max") and steps[2][0].startswith("min")
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.integers(-(1 << 28), 1 << 28, (500, 4)), rng.integers(-200, 200, (500, 4)),
                        bound[None], -bound[None]])
    got = narrow(run_steps(x, steps, 32), 8).astype(np.int64)
    np.testing.assert_array_equal(got, _exact(x, steps).astype(np.int64).clip(-128, 127))
    assert np.abs(got - np.clip(np.round((x + bias) * real), -128, 127)).max() <= 1


def test_sixteen_bit_activations_are_stored_as_int16():
    model = models.small_resnet(widths=(8, 16, 24))
    config = PRESETS["default"].replace(name="a16", inp_width=16, out_width=16)
    art = _compiled(model, config)
    g = art.graph
    conv = g.node("conv1")
    assert g.values[conv.outputs[0]].dtype == "int16" and g.constants[conv.inputs[1]].dtype == np.int8
    from .test_frontend_util import cosine, ort_run

    x = rand(1, 3, 32, 32, seed=5)
    assert cosine(weft.InferenceSession(art).run(None, {"input": x})[0], ort_run(model, {"input": x})[0]) > 0.999
    # 16-bit weights too: 16 x 16-bit products overflow a 32-bit accumulator after two terms, so the
    # convolutions stay float host layers.
    conv = _compiled(model, config.replace(name="w16", wgt_width=16)).graph.node("conv1")
    assert conv.op == "FusedConv" and conv.attrs["target"] == "host"
    assert conv.attrs["host_reason"].startswith("calibrated accumulator values reach")
