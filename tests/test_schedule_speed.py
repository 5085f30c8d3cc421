"""The back end's cycle savings keep every result exact: the epilogue folding (``alu.simplify``), the
residual tiles and pooling windows copied in by an identity GEMM (``schedule.copies_by_gemm``), and the
before/after table of ``weft report --baseline``."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import weft
from weft.cli import main
from weft.compiler.backend import alu, dma
from weft.compiler.backend.schedule import LayerGeom, Schedule, copies_by_gemm, usage
from weft.config import AcceleratorConfig, load_config
from weft.core.accel_section import accel_section
from weft.core.epilogue import run_steps
from weft.isa import MemId
from weft.isa.arith import pack
from weft.isa.encoding import decode_insns
from weft.runtime.report import compare, format_comparison
from weft.sim.dram import Dram

from .driver_util import rtl_equals_fsim
from .test_backend import _run_loads
from .test_backend_random import _model
from .test_e2e import assert_bit_exact
from .test_frontend_util import make_model, rand

# ResNet-18's residual epilogue (layer1.0.conv2 on `default`): the add_imm 128 after the residual folds in.
RESNET_STEPS = (("add_vec", np.array([-17071, 16596], dtype=np.int32)), ("shr_imm", 6),
                ("mul_vec", np.array([10834, 33560], dtype=np.int32)), ("add_imm", 1024), ("shr_imm", 11),
                ("residual", (("mul_imm", 29432), ("add_imm", 64), ("shr_imm", 7))), ("add_imm", 128),
                ("shr_imm", 8), ("max_imm", 0))


def _all_residuals(channels: int) -> np.ndarray:
    return np.repeat(np.arange(-128, 128, dtype=np.int64)[:, None], channels, axis=1)


@pytest.mark.parametrize("steps", [
    RESNET_STEPS,
    (("residual", (("mul_imm", 3), ("add_imm", 5))), ("add_imm", -7), ("max_imm", 0)),
    (("residual", (("shr_imm", 1),)), ("add_imm", 9)),  # nothing to fold into: kept
    (("residual", (("mul_imm", 29432), ("add_imm", 128), ("shr_imm", 8))), ("add_imm", 128)),  # imm too wide
    # too wide for the immediate: an add_vec of the constant instead (the downsampling shortcuts' case)
    (("add_vec", np.array([5, -9])), ("residual", (("mul_imm", 27468), ("add_imm", 128), ("shr_imm", 8))),
     ("add_imm", 128), ("shr_imm", 8)),
])
def test_simplify_gives_the_same_results_in_fewer_or_equal_steps(steps):
    c = load_config("default")
    simple = alu.simplify(steps, c)
    assert len(simple) <= len(steps)
    rng = np.random.default_rng(0)
    res = _all_residuals(2)
    acc = rng.integers(-(1 << 20), 1 << 20, size=res.shape)
    assert np.array_equal(run_steps(acc, simple, c.acc_width, res), run_steps(acc, steps, c.acc_width, res))


def test_simplify_folds_resnets_residual_offset():
    simple = alu.simplify(RESNET_STEPS, load_config("default"))
    assert [k for k, _ in simple].count("add_imm") == 1
    assert dict(simple)["residual"][1] == ("add_imm", 64 + (128 << 7))
    wide = (*RESNET_STEPS[:5], ("residual", (("mul_imm", 27468), ("add_imm", 128), ("shr_imm", 8))), *RESNET_STEPS[6:])
    kind, vec = dict(alu.simplify(wide, load_config("default")))["residual"][1]
    assert kind == "add_vec" and vec.tolist() == [128 + (128 << 8)] * 2


@pytest.mark.parametrize("origin, extent", [((0, 1, 1, 0), (2, 2, 3, 5)), ((1, 0, 0, 0), (1, 3, 1, 7)),
                                            ((0, 0, 2, 1), (2, 3, 1, 4))])
def test_box_transfers_of_every_other_row(origin, extent):
    """A view of every other image row (every_other_row): the box's rows are the tensor's even rows, even
    where the box covers whole view rows (which are not contiguous in DRAM)."""
    c = load_config("tiny")
    shape = (2, 3, 7, 7)  # n, c, h, w in inp rows
    view = (2, 3, 4, 7)
    strides = (3 * 7 * 7, 7 * 7, 2 * 7, 1)
    elems = c.batch * c.block_in
    tensor = np.random.default_rng(1).integers(-128, 128, (*shape, elems))
    dram = Dram(int(np.prod(shape)) * elems + 64 * 1024)
    dram.write(64 * 16, pack(tensor.reshape(-1, elems), 8))
    moves = dma.merge(c, dma.box_transfers(c, MemId.INP, view, 64 * 16 // elems, origin, extent, 0, strides))
    got = _run_loads(c, moves, dram)[:int(np.prod(extent))].reshape(*extent, elems)
    want = tensor[:, :, ::2][tuple(slice(o, o + e) for o, e in zip(origin, extent, strict=True))]
    np.testing.assert_array_equal(got, want)


def test_copies_by_gemm_needs_square_blocks():
    geom = LayerGeom("x", "conv", 1, 1, 1, 1, 1, 4, 4, 4, 4, residual=True)
    assert copies_by_gemm(geom, load_config("default"))
    assert not copies_by_gemm(geom, AcceleratorConfig(block_in=16, block_out=8))
    assert not copies_by_gemm(LayerGeom("x", "conv", 1, 1, 1, 1, 1, 4, 4, 4, 4), load_config("default"))


def test_a_copy_that_does_not_fit_falls_back_to_the_compute_units_load():
    """A pooling window too large for a thread's inp rows still runs, loaded as acc_narrow rows."""
    c = load_config("default").replace(inp_buff_bytes=1024)  # 64 inp rows, 32 per thread
    pool = LayerGeom("p", "maxpool", 1, 1, 1, 1, 1, 16, 16, 8, 8, kh=3, kw=3, sh=2, sw=2, pads=(1, 1, 1, 1))
    small, large = Schedule(tile_h=1, tile_w=4), Schedule(tile_h=4, tile_w=8)
    assert usage(pool, small, c).copies and not usage(pool, large, c).copies
    assert usage(pool, large, c).inp == 0 and usage(pool, large, c).acc_bytes > 0 == usage(pool, small, c).acc_bytes


@pytest.mark.parametrize(("pool", "config", "residual_role", "window_role"), [
    # added times 127 by the epilogue's GEMM; a signed max-pool input pools an offset copy of its window
    ("max", "default", "add the residual (scaled identity)", "copy the input window"),
    # an average needs no offset: the ALU sums the window straight from its inp rows
    ("avg", "default", "add the residual (scaled identity)", "the window's first tap"),
    # 4-bit weights: 7 is too coarse, copied into its own rows
    ("max", "int4w", "copy the residual tile", "copy the input window"),
])
def test_residuals_and_windows_copied_by_the_gemm_stay_exact(pool, config, residual_role, window_role):
    layer = (3, 1, [1, 1, 1, 1], 9, 7, 5, 20, 2, pool, True)
    model = _model(*layer)
    cal = [{"x": rand(2, 5, 9, 7, seed=s)} for s in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        art = weft.compile(model, config=config, calibration=cal)
    roles = [role for layer in accel_section(art).layers for role in layer.record["instructions_by_role"]]
    assert residual_role in roles
    assert window_role in roles
    assert_bit_exact(art, {"x": rand(2, 5, 9, 7, seed=9) - 0.3})


@pytest.mark.parametrize("config, relu", [("default", True), ("default", False), ("tiny", True)])
def test_resnets_max_pool_stays_exact(config, relu):
    """The 3x3/2 max-pool (pads 1) as a layer of its own, bit-exact: on proven non-negative inputs straight
    from its inp rows (schedule.pool_reads_inp), on signed ones in the offset domain, separably
    (schedule.separable). (The convolution's output is an output of the model too, so the pool is not fused
    into it: weft.compiler.pool_fusion, tests/test_pool_fusion.py.)"""
    from onnx import helper

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1])]
    y = "c"
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["r"], name="relu"))
        y = "r"
    nodes.append(helper.make_node("MaxPool", [y], ["y"], name="pool", kernel_shape=[3, 3], strides=[2, 2],
                                  pads=[1, 1, 1, 1]))
    model = make_model(nodes, {"x": [1, 3, 18, 14]}, {"y": None, y: None}, {"w": rand(20, 3, 3, 3, seed=2) * 0.4})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        art = weft.compile(model, config=config, calibration=[{"x": rand(1, 3, 18, 14, seed=s)} for s in range(2)])
    roles = [role for layer in accel_section(art).layers for role in layer.record["instructions_by_role"]]
    # after a ReLU the pool reads its window from inp rows; a signed input pools an offset copy separably
    assert ("the window's first tap" if relu else "pool over the window's columns") in roles
    assert_bit_exact(art, {"x": rand(1, 3, 18, 14, seed=9) - 0.3})


def test_the_residual_copy_fits_a_tight_token_queue():
    """Two token slots and four commands: a residual copied into its rows in the epilogue would make each task
    hold two tokens towards the load unit, and the stream deadlock; one loaded with the first stage and
    added by the epilogue's GEMM does not."""
    config = AcceleratorConfig(name="tight", block_in=4, block_out=4, uop_buff_bytes=1024, inp_buff_bytes=512,
                               wgt_buff_bytes=2048, acc_buff_bytes=2048, cmd_queue_depth=4, token_queue_depth=2)
    layer = (1, 1, [0, 0, 0, 0], 4, 8, 1, 2, 2, "none", True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = [{"x": rand(2, 1, 4, 8, seed=s)} for s in range(2)]
        art = weft.compile(_model(*layer), config=config, calibration=cal)
    assert not art.graph.meta["fallbacks"]
    roles = [role for layer in accel_section(art).layers for role in layer.record["instructions_by_role"]]
    assert "add the residual (scaled identity)" in roles  # loaded with the task's first stage, added at its end
    assert_bit_exact(art, {"x": rand(2, 1, 4, 8, seed=9) - 0.3})


def test_report_compares_with_a_baseline_table(tmp_path, capsys):
    before = [{"layer": "a", "op": "qconv2d", "cycles": 200, "utilization": 0.25},
              {"layer": "p", "op": "qmaxpool", "cycles": 50, "utilization": None}]
    after = [{"layer": "a", "op": "qconv2d", "cycles": 100, "utilization": 0.5},
             {"layer": "p", "op": "qmaxpool", "cycles": 40, "utilization": None},
             {"layer": "h", "op": "quantize", "cycles": None, "utilization": None}]
    rows = compare(before, after)
    assert [r["layer"] for r in rows] == ["a", "p"] and rows[0]["change"] == pytest.approx(-0.5)
    table = format_comparison(rows)
    assert "| a | 200 | 100 | -50.0% | 25.0% | 50.0% |" in table
    assert table.splitlines()[-1].startswith("| total (2 layers) | 250 | 140 |")
    art = weft.compile(_model(1, 1, [0, 0, 0, 0], 4, 4, 3, 4, 1, "none", False), config="tiny",
                       calibration=[{"x": rand(1, 3, 4, 4, seed=1)}])
    path = art.save(tmp_path / "m.weft")
    assert main(["report", str(path), "--json", str(tmp_path / "t.json")]) == 0
    assert main(["report", str(path), "--baseline", str(tmp_path / "t.json")]) == 0
    text = capsys.readouterr().out
    assert "gap" in text and "| total (" in text and "+0.0%" in text
    assert json.loads((tmp_path / "t.json").read_text())[0]["layer"]


@pytest.mark.rtl
def test_copies_by_gemm_on_the_rtl_equal_fsim_and_the_timing_model():
    """A convolution with a residual add and a max-pool, both copied in by the identity GEMM, through the
    driver on Verilator: bit-exact with fsim, each layer's cycles within 2% of the timing model's."""
    layer = (3, 1, [1, 1, 1, 1], 8, 8, 5, 8, 1, "max", True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = [{"x": rand(1, 5, 8, 8, seed=s)} for s in range(2)]
        art = weft.compile(_model(*layer), config="tiny", calibration=cal)
    feeds = {"x": rand(1, 5, 8, 8, seed=9) - 0.3}
    fsim, stats = rtl_equals_fsim(art, feeds, chains=False)  # (each layer's own program, its own cycles)
    for model, board in zip(fsim.stats["layers"], stats["layers"], strict=True):
        if model.get("cycles"):
            assert abs(model["cycles"] / board["cycles"] - 1) <= 0.02, (model["name"], model["cycles"], board["cycles"])


def test_a_large_convolution_keeps_the_fastest_of_the_cost_models_first_choices():
    """A convolution of at least TIMED_PRODUCTS block products: its default schedule is the fastest on the
    timing model of the first SCHEDULE_CHOICES the cost model ranks, so never slower than the first."""
    from weft.compiler.backend import codegen
    from weft.compiler.backend.schedule import ranked
    from weft.runtime.fsim_device import new_timing_model

    model = _model(3, 1, [1, 1, 1, 1], 28, 28, 64, 64, 1, "none", True)  # two 3x3 64->64 convolutions
    cal = [{"x": rand(1, 64, 28, 28, seed=s)} for s in range(2)]
    c = load_config("default")

    def cycles(art) -> dict[str, int]:
        sec, timer = accel_section(art), new_timing_model(c)
        return {layer.name: timer.simulate(decode_insns(c, sec.program_words(layer)), layer.insn_addr).cycles
                for layer in sec.layers}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        art = weft.compile(model, config=c, calibration=cal)
        meta = {x["name"]: x for x in art.sections["accel"].meta["layers"]}
        geom = LayerGeom(**{**meta["conv"]["geometry"], "pads": tuple(meta["conv"]["geometry"]["pads"])})
        assert codegen._block_products(geom) >= codegen.TIMED_PRODUCTS
        first = ranked(geom, c)[0]
        baseline = weft.compile(model, config=c, calibration=cal, schedules={"conv": first})
    assert cycles(art)["conv"] <= cycles(baseline)["conv"]
    assert_bit_exact(art, {"x": rand(1, 64, 28, 28, seed=9) - 0.3})
