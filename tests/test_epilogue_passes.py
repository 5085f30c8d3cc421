"""Fewer compute-unit cycles for the same epilogue, exactly: vector steps whose rows the compute unit holds
(``alu.vec_chunks``) and residual steps refitted to take the add that follows them (``alu._refit``)."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

import weft
from weft.compiler.backend import alu
from weft.compiler.backend.schedule import Schedule, vector_chunks
from weft.config import load_config
from weft.core.epilogue import run_steps
from weft.hw.structure import SRC_ROWS
from weft.isa.arith import wrap

from .test_backend_random import _model
from .test_e2e import assert_bit_exact
from .test_frontend_util import rand

R = np.arange(-128, 128, dtype=np.int64)  # every value of a narrowed int8 residual


def _executions(kernel) -> list[tuple[int, int]]:
    """(dst, src) of every execution of an ALU kernel, in order."""
    out = []
    for i in range(kernel.iter_out):
        for j in range(kernel.iter_in):
            for u in kernel.uops:
                out.append((int(u["dst"]) + i * kernel.dst_factor[0] + j * kernel.dst_factor[1],
                            int(u["src"]) + i * kernel.src_factor[0] + j * kernel.src_factor[1]))
    return out


@pytest.mark.parametrize("tn, toc, pix, ro", [(1, 16, 49, 1), (2, 3, 5, 4), (1, 2, 224, 1), (1, 20, 1, 1),
                                              (1, 9, 3, 1)])
def test_vector_steps_pair_every_tile_row_with_its_vector_row(tn, toc, pix, ro):
    tile = alu.Tile(100, tn, toc, pix, ro)
    vec = 2000
    chunks = alu.vec_chunks(tile)
    kernels = [alu._held_kernel(tile, vec, first, count) for first, count in chunks] or [alu._vec_kernel(tile, vec)]
    pairs = [p for k in kernels for p in _executions(k)]
    want = {(tile.base + ((n * toc + o) * pix + p) * ro + s, vec + o * ro + s)
            for n in range(tn) for o in range(toc) for p in range(pix) for s in range(ro)}
    assert len(pairs) == len(want) and set(pairs) == want
    for k in kernels if chunks else []:  # the rows the compute unit keeps in registers
        assert k.src_factor == (0, 0) and len(k.uops) <= SRC_ROWS
        dst = [d for d, _ in _executions(k)]
        assert all(a != b for a, b in itertools.pairwise(dst))  # no consecutive-execution hazard


def test_wide_vector_steps_split_only_where_it_saves_cycles():
    assert vector_chunks(16, 49) == 2 and vector_chunks(8, 49) == 1 and vector_chunks(5, 1) == 1
    assert vector_chunks(20, 1) == 0  # one execution per vector row: rereading them costs less than 3 instructions


@pytest.mark.parametrize("k, add, shift, after", [
    (24324, 128, 8, 128),  # ResNet-50's case: 128 << 8 does not fit the immediate, 24324 = 4 * 6081 does
    (4, 2, 2, 3), (-6, 1, 1, -5), (3, 0, 0, 7), (24329, 1024, 11, 128),
])
def test_refit_is_exact_on_every_residual_value_or_declines(k, add, shift, after):
    c = load_config("default")
    sub = (("mul_imm", k), ("add_imm", add), ("shr_imm", shift))
    refit = alu._refit(sub, after, (-32768, 32767), 128, c.acc_width)
    if k == 24329:  # 2**11 does not divide the factor and the constant is too wide: no 3-step form
        assert refit is None
        return
    assert refit is not None and len(refit) <= len(sub)
    assert all(kind.endswith("_imm") and -32768 <= op <= 32767 for kind, op in refit)
    assert np.array_equal(run_steps(R, refit, c.acc_width), wrap(run_steps(R, sub, c.acc_width) + after, c.acc_width))


def test_simplify_refits_a_residual_whose_add_has_no_vector_to_go_to():
    c = load_config("default")
    steps = (("add_imm", 1), ("shr_imm", 1), ("mul_imm", 649), ("add_imm", 16384), ("shr_imm", 15),
             ("residual", (("mul_imm", 24324), ("add_imm", 128), ("shr_imm", 8))), ("add_imm", 128),
             ("shr_imm", 8), ("max_imm", 0))
    simple = alu.simplify(steps, c)
    assert len(simple) == len(steps) - 1
    res = np.repeat(R[:, None], 3, axis=1)
    acc = np.random.default_rng(0).integers(-(1 << 24), 1 << 24, size=res.shape)
    assert np.array_equal(run_steps(acc, simple, c.acc_width, res), run_steps(acc, steps, c.acc_width, res))


@pytest.mark.parametrize("residual", [False, True])
def test_a_wide_output_tile_runs_its_vector_steps_in_chunks_bit_exact(residual):
    """256 output channels (16 blocks) in one tile: each vector step runs as two instructions of 8 blocks."""
    layer = (1, 1, [0, 0, 0, 0], 4, 4, 16, 256, 1, "none", residual)
    chosen = Schedule(tile_h=4, tile_w=4, tile_oc=16, tile_ic=1, vthreads=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        art = weft.compile(_model(*layer), config="default", calibration=[{"x": rand(1, 16, 4, 4, seed=s)}
                                                                           for s in range(2)],
                           schedules={"conv": chosen})
    meta = next(x for x in art.sections["accel"].meta["layers"] if x["name"] == "conv")
    roles = meta["instructions_by_role"]
    steps = next(n for n in art.graph.nodes if n.name == "conv").attrs["epilogue"]
    rq_steps = sum(1 if kind == "rq_vec" else sum(k == "rq_vec" for k, _ in op) if kind == "residual" else 0
                   for kind, op in steps)
    assert rq_steps >= 1
    assert roles["epilogue rq_vec"] == 2 * rq_steps * meta["tasks"]
    assert_bit_exact(art, {"x": rand(1, 16, 4, 4, seed=9) - 0.3}, timing=True)


def test_refit_leaves_wide_residuals_alone():
    """An int16 residual has 65,536 values: the pairwise refit would need 2**31 pairs (gigabytes), so it
    declines at once and the add stays a step of its own."""
    sub = (("mul_imm", 3), ("add_imm", 5), ("shr_imm", 2))
    assert alu._refit(sub, 7, (-(1 << 15), (1 << 15) - 1), top=1 << 15, acc_width=32) is None
    # int8 still refits: folding + 7 into the add (5 + (7 << 2) = 33) is exact
    assert alu._refit(sub, 7, (-(1 << 15), (1 << 15) - 1), top=1 << 7, acc_width=32) is not None


@pytest.mark.parametrize("residual", [False, True])
def test_a_tile_starts_from_its_bias_bit_exact(residual):
    """A convolution whose epilogue adds a bias first sets its tile to the bias (MOV from the held vector rows)
    instead of resetting it, and drops the add: one pass fewer, the same integers (additions wrap, so the
    bias may come before the GEMMs)."""
    from onnx import helper

    from .test_frontend_util import make_model

    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu")]
    inits = {"w": rand(48, 16, 3, 3, seed=1) * 0.3, "b": rand(48, seed=2)}
    y = "r"
    if residual:  # a second convolution with a bias, whose epilogue adds the first one's output
        nodes += [helper.make_node("Conv", ["r", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
                  helper.make_node("Add", ["c2", "r"], ["s"], name="add"),
                  helper.make_node("Relu", ["s"], ["y2"], name="relu2")]
        inits |= {"w2": rand(48, 48, 3, 3, seed=3) * 0.1, "b2": rand(48, seed=4)}
        y = "y2"
    model = make_model(nodes, {"x": [1, 16, 6, 5]}, {y: None}, inits)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        art = weft.compile(model, config="default", calibration=[{"x": rand(1, 16, 6, 5, seed=s)} for s in range(2)])
    started = 0
    for meta in art.sections["accel"].meta["layers"]:
        node = next(n for n in art.graph.nodes if n.name == meta["name"])
        roles = meta["instructions_by_role"]
        if node.op == "qconv2d" and alu.bias_start(node.attrs["epilogue"]) is not None:
            assert "start from the bias" in roles and "reset the output tile" not in roles
            assert roles.get("epilogue add_vec", 0) == roles.get("epilogue add_imm", 0) == 0
            started += 1
    assert started == (2 if residual else 1)
    assert_bit_exact(art, {"x": rand(1, 16, 6, 5, seed=9) - 0.3}, timing=True)


def test_a_tile_without_bias_starts_from_its_first_reduction_step_bit_exact():
    """A 1x1 convolution without a bias (one multi-valued reduction axis, the input blocks): the tile's first
    step is a GEMM that overwrites its rows, the rest accumulate; no reset pass, the same integers."""
    from onnx import helper

    from .test_frontend_util import make_model

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = make_model(nodes, {"x": [1, 64, 6, 5]}, {"y": None}, {"w": rand(32, 64, 1, 1, seed=1) * 0.2})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        art = weft.compile(model, config="default", calibration=[{"x": rand(1, 64, 6, 5, seed=s)} for s in range(2)])
    (meta,) = art.sections["accel"].meta["layers"]
    roles = meta["instructions_by_role"]
    assert roles["convolution tile, first step"] == meta["tasks"] and "reset the output tile" not in roles
    assert_bit_exact(art, {"x": rand(1, 64, 6, 5, seed=9) - 0.3}, timing=True)
