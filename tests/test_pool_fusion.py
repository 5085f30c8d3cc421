"""A max-pool fused into the convolution before it (weft.compiler.pool_fusion): every pool shape the
epilogue runs, odd and even rows, one and two virtual threads, several output-channel tiles and images,
bit-exact on fsim against the reference interpreter, and the same as the two layers apart (the host's
LLVM code runs them apart)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper

import weft
from weft.compiler.backend import Schedule
from weft.compiler.pool_fusion import POOLS, pool_of, unfuse_pools
from weft.compiler.verify import verify
from weft.core.errors import GraphError

from .driver_util import rtl_equals_fsim
from .test_e2e import assert_bit_exact
from .test_frontend_util import make_model, rand


def _model(size: int, pool: tuple[int, int, int], cin: int = 5, cout: int = 12, batch: int = 1,
           relu: bool = True):
    k, s, p = pool
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1])]
    y = "c"
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["r"], name="relu"))
        y = "r"
    nodes.append(helper.make_node("MaxPool", [y], ["y"], name="pool", kernel_shape=[k, k], strides=[s, s],
                                  pads=[p] * 4))
    inits = {"w": rand(cout, cin, 3, 3, seed=cout) * 0.4}
    return make_model(nodes, {"x": [batch, cin, size, size]}, {"y": None}, inits)


def _compile(model, config, schedules=None):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    cal = [{"x": rand(*shape, seed=s)} for s in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return weft.compile(model, config=config, calibration=cal, schedules=schedules), shape


def _fused(art) -> weft.core.ir.Node:
    assert not any(n.op == "qmaxpool" for n in art.graph.nodes), "the max-pool was not fused"
    (conv,) = [n for n in art.graph.nodes if n.op == "qconv2d"]
    assert pool_of(conv) is not None and conv.attrs["pooled"] == "pool"
    return conv


@pytest.mark.parametrize("pool", sorted(POOLS))
@pytest.mark.parametrize("size", [8, 9])
@pytest.mark.parametrize("relu", [True, False])
def test_every_fused_pool_is_exact(pool, size, relu):
    art, shape = _compile(_model(size, pool, relu=relu), "tiny")
    _fused(art)
    feeds = {"x": rand(*shape, seed=9) - 0.2}
    assert_bit_exact(art, feeds)
    # the same as the convolution and the max-pool apart: the host's code runs them so
    got = weft.InferenceSession(art, device="cpu").run(None, feeds)[0]
    want = weft.InferenceSession(art, device="ref").run(None, feeds)[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_batched_gemm_rows_and_narrow_output_blocks(pool):
    """`rect`: two images a GEMM row and 4-wide output blocks (two GEMM blocks a channel block), four images."""
    art, shape = _compile(_model(9, pool, cin=5, cout=20, batch=4), "rect")
    conv = _fused(art)
    geometry = next(m for m in art.sections["accel"].meta["layers"] if m["name"] == conv.name)["geometry"]
    assert geometry["ro"] == 2 and geometry["nb"] == 2
    assert_bit_exact(art, {"x": rand(*shape, seed=3) - 0.2})


@pytest.mark.parametrize("vthreads", [1, 2])
@pytest.mark.parametrize("pool", [(3, 2, 1), (3, 2, 0)])
def test_channel_tiles_images_and_threads(pool, vthreads):
    """Two images, output channels in several tiles of the tile's blocks, one thread or two (the pooled
    rows a window takes from the other thread)."""
    model = _model(10, pool, cin=3, cout=40, batch=2)
    sched = Schedule(tile_h=1, tile_w=10, tile_oc=1, tile_ic=1, vthreads=vthreads)
    art, shape = _compile(model, "tiny", schedules={"conv": sched})
    conv = _fused(art)
    meta = next(m for m in art.sections["accel"].meta["layers"] if m["name"] == conv.name)
    assert meta["schedule"]["vthreads"] == vthreads and meta["geometry"]["ocb"] > 1
    assert_bit_exact(art, {"x": rand(*shape, seed=3)}, timing=True)


@pytest.mark.parametrize("given", ["conv", "pool"])
def test_a_schedule_the_fusion_cannot_take_keeps_the_layers_apart(given):
    """Tiles other than whole rows given for the convolution, or a schedule given for the max-pool: the two
    stay layers of their own, each with what it was given."""
    sched = Schedule(tile_h=2, tile_w=8) if given == "conv" else Schedule(tile_h=2, tile_w=4, vthreads=1)
    art, shape = _compile(_model(8, (3, 2, 1)), "tiny", schedules={given: sched})
    assert [n.op for n in art.graph.nodes if n.attrs.get("target") == "accel"] == ["qconv2d", "qmaxpool"]
    layer = next(m for m in art.sections["accel"].meta["layers"] if m["name"] == given)
    assert Schedule.from_dict(layer["schedule"]) == sched
    assert_bit_exact(art, {"x": rand(*shape, seed=4)})


def test_a_pool_the_epilogue_does_not_run_stays_apart():
    model = _model(9, (3, 2, 1))
    model.graph.node[-1].attribute[-1].ints[:] = [1, 1, 1, 1]  # pads kept; stride 1 below
    for a in model.graph.node[-1].attribute:
        if a.name == "strides":
            a.ints[:] = [1, 1]
    art, shape = _compile(model, "tiny")
    assert any(n.op == "qmaxpool" for n in art.graph.nodes)
    assert_bit_exact(art, {"x": rand(*shape, seed=2)})


def test_unfusing_gives_back_the_two_layers_and_verify_names_a_bad_fused_node():
    art, _ = _compile(_model(8, (3, 2, 1)), "tiny")
    conv = _fused(art)
    apart = unfuse_pools(art.graph)
    ops = [n.op for n in apart.nodes if n.op in ("qconv2d", "qmaxpool")]
    assert ops == ["qconv2d", "qmaxpool"]
    # the artifact's graph is left as it was
    assert pool_of(conv) is not None and not any(n.op == "qmaxpool" for n in art.graph.nodes)
    bad = art.graph.copy()
    node = next(n for n in bad.nodes if n.name == conv.name)
    node.attrs["pool_kernel"] = (5, 5)
    with pytest.raises(GraphError, match=r"conv.*5x5/2 max-pool"):
        verify(bad)


def test_report_compares_a_fused_layer_with_both_layers_of_a_baseline_and_inspect_says_so(tmp_path, capsys):
    from weft.cli import main
    from weft.runtime.report import compare

    rows = compare([{"layer": "c", "cycles": 100, "utilization": 0.5}, {"layer": "p", "cycles": 50}],
                   [{"layer": "c", "op": "qconv2d", "cycles": 120, "utilization": 0.6, "pooled": "p"}])
    assert rows == [{"layer": "c + p", "op": "qconv2d", "cycles_before": 150, "cycles_after": 120,
                     "change": pytest.approx(-0.2), "utilization_before": 0.5, "utilization_after": 0.6}]
    art, _ = _compile(_model(8, (3, 2, 1)), "tiny")
    path = art.save(tmp_path / "m.weft")
    assert main(["inspect", str(path)]) == 0
    assert "with max-pool 'pool' in its epilogue" in capsys.readouterr().out
    sess = weft.InferenceSession(path, device="fsim")
    sess.run(None, {"x": rand(1, 5, 8, 8)})
    assert [r.get("pooled") for r in sess.stats["layers"] if r["name"] == "conv"] == ["pool"]


@pytest.mark.rtl
@pytest.mark.parametrize("pool, vthreads", [((3, 2, 1), 2), ((3, 2, 0), 1), ((2, 2, 0), 2)])
def test_fused_pools_on_the_rtl_equal_fsim_and_the_timing_model(pool, vthreads):
    """Each fused shape through the driver on Verilator (tiny): bit-exact with fsim, and with a DRAM that
    answers at once each layer's cycles within 0.5% of the timing model's (with the Pynq DRAM's pauses its
    fluid model of many one-row loads drifts by 2 to 3% here, pool or not)."""
    from weft.core.accel_section import accel_section
    from weft.isa.encoding import decode_insns
    from weft.sim.dram_timing import TIMINGS
    from weft.sim.timing import TimingModel

    model = _model(9, pool, cin=3, cout=12, batch=2)
    art, shape = _compile(model, "tiny", schedules={"conv": Schedule(tile_h=1, tile_w=9, tile_oc=3, tile_ic=1,
                                                                    vthreads=vthreads)})
    _fused(art)
    feeds = {"x": rand(*shape, seed=5) - 0.2}
    _, stats = rtl_equals_fsim(art, feeds, timing="ideal")
    section = accel_section(art)
    programs = {layer.name: layer for layer in section.layers}
    timed = TimingModel(art.config, TIMINGS["ideal"])
    for board in stats["layers"]:
        if board.get("cycles") and board["name"] in programs:
            layer = programs[board["name"]]
            ours = timed.simulate(decode_insns(art.config, section.program_words(layer)), layer.insn_addr).cycles
            assert abs(ours / board["cycles"] - 1) <= 0.005, (board["name"], ours, board["cycles"])
