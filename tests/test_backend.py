"""The accelerator back end's parts: loop nests and folding, schedules, DMA boxes, tokens and the static
checks. Whole models on the functional simulator are in test_e2e.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from weft.compiler.backend import check, dma, schedule
from weft.compiler.backend.program import Stream
from weft.compiler.backend.te import Access as A
from weft.compiler.backend.te import Axis, Compute, Expr, Nest, fold, split, split_single_row, tile_box, var
from weft.compiler.backend.vthread import inject_sync
from weft.config import PRESETS, AcceleratorConfig
from weft.isa import MemId, semantics
from weft.isa.arith import loop_indices, pack, unpack
from weft.sim.dram import Dram
from weft.sim.fsim import run_program


def _executions(nest: Nest) -> np.ndarray:
    """(dst, src, wgt) of every execution of a nest, by plain loops."""
    grids = np.meshgrid(*[np.arange(a.extent) for a in nest.axes], indexing="ij")
    point = {a.name: g.reshape(-1) for a, g in zip(nest.axes, grids, strict=True)}
    cols = [sum((k * point[n] for n, k in e.coef), np.full(point[nest.axes[0].name].shape, e.const))
            for e in (nest.dst, nest.src, nest.wgt)]
    return np.stack(cols, axis=1)


def _kernel_executions(kernel) -> np.ndarray:
    cols = [loop_indices(kernel.uops[f].astype(np.int64), kernel.iter_out, kernel.iter_in,
                         *getattr(kernel, f"{f}_factor")) for f in ("dst", "src", "wgt")]
    return np.stack(cols, axis=1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.booleans()), min_size=1, max_size=6), st.integers(0, 2**16))
def test_fold_runs_every_execution_once_without_the_hazard(axes, seed):
    """The folded instruction enumerates exactly the nest's executions, and no two consecutive ones write
    one accumulator row when the destination is one-to-one on the spatial axes."""
    rng = np.random.default_rng(seed)
    ax = tuple(Axis(f"a{k}", e, red) for k, (e, red) in enumerate(axes))
    spatial = [a for a in ax if not a.reduce]
    if not spatial or all(a.extent == 1 for a in spatial):
        spatial = [Axis("s", 2)]
        ax = (*ax, spatial[0])
    step, dst = 1, Expr(const=int(rng.integers(0, 50)))
    for a in reversed(spatial):  # a row-major, one-to-one destination layout
        dst = dst + var(a.name) * step
        step *= a.extent
    src = Expr(tuple((a.name, int(rng.integers(0, 7))) for a in ax), int(rng.integers(0, 9)))
    wgt = Expr(tuple((a.name, int(rng.integers(0, 4))) for a in ax), 0)
    nest = Nest(ax, dst, src, wgt)
    kernel = fold(nest)
    got, want = _kernel_executions(kernel), _executions(nest)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.unique(got, axis=0, return_counts=True)[1],
                                  np.unique(want, axis=0, return_counts=True)[1])
    np.testing.assert_array_equal(np.unique(got, axis=0), np.unique(want, axis=0))
    assert not np.any(got[1:, 0] == got[:-1, 0])
    assert len(kernel.uops) <= nest.executions


def test_fold_refuses_a_reduction_into_one_row_and_the_split_alternates():
    nest = Nest((Axis("k", 6, True),), Expr(const=3), var("k") + 10, var("k"))
    with pytest.raises(ValueError, match="one destination row"):
        fold(nest)
    kernel = split_single_row(nest, spare_row=9)[0]
    assert kernel.uops["dst"].tolist() == [3, 9, 3, 9, 3, 9]
    assert kernel.uops["src"].tolist() == list(range(10, 16))


def test_split_and_tile_box_give_the_tile_window():
    """A 3x3 stride-2 convolution's input window for a 4x5 output tile, with its origin per tile."""
    c = Compute("conv", (Axis("oh", 8), Axis("ow", 10), Axis("ky", 3, True), Axis("kx", 3, True)),
                {"inp": A("inp", (var("oh") * 2 + var("ky") - 1, var("ow") * 2 + var("kx") - 1))},
                {"inp": (16, 20)})
    c = split(split(c, "oh", 4), "ow", 5)
    assert [a.name for a in c.axes] == ["oh.o", "oh.i", "ow.o", "ow.i", "ky", "kx"]
    box = tile_box(c, "inp", ["oh.i", "ow.i", "ky", "kx"])
    assert box.extent == (9, 11)
    assert box.origin_at({"oh.o": 0, "ow.o": 0}) == (-1, -1)
    assert box.origin_at({"oh.o": 1, "ow.o": 1}) == (7, 9)
    sram = box.sram(100)
    assert sram.value({"oh.i": 1, "ow.i": 2, "ky": 2, "kx": 0}) == 100 + (2 + 2) * 11 + 4
    with pytest.raises(ValueError, match="does not divide"):
        split(c, "ky", 2)


# ---- DMA ---------------------------------------------------------------------------------------------


def _run_loads(config: AcceleratorConfig, transfers, dram: Dram) -> np.ndarray:
    stream = Stream(config)
    for t in transfers:
        stream.transfer(t)
    stream.finish()
    inject_sync(stream.insns, config)
    from weft.sim.fsim import FunctionalSimulator

    sim = FunctionalSimulator(config)
    words_at = dram.size - 16 * len(stream.insns) - 64
    from weft.isa import encode_insns

    dram.write(words_at - words_at % 64, encode_insns(config, stream.array()))
    sim.run(dram, words_at - words_at % 64, len(stream.insns))
    return sim.inp


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from(["tiny", "default"]))
def test_box_transfers_load_the_padded_box(seed, name):
    """Random boxes of a 4-D tensor (with padding on the two inner dimensions, wide pads included) load
    into SRAM exactly as numpy pads them; the simulator is the judge."""
    c = PRESETS[name]
    rng = np.random.default_rng(seed)
    shape = tuple(int(v) for v in rng.integers(1, 5, 2)) + tuple(int(v) for v in rng.integers(1, 30, 2))
    extent = [int(rng.integers(1, s + 1)) for s in shape[:2]] + [int(rng.integers(1, 20)) for _ in range(2)]
    origin = [int(rng.integers(0, s - e + 1)) for s, e in zip(shape[:2], extent[:2], strict=True)]
    origin += [int(rng.integers(-18, s)) for s in shape[2:]]
    rows = int(np.prod(extent))
    assume(rows <= c.inp_rows)
    elems = c.batch * c.block_in
    tensor = rng.integers(-128, 128, (*shape, elems))
    dram = Dram(int(np.prod(shape)) * elems + 64 * 1024)
    dram.write(64 * 16, pack(tensor.reshape(-1, elems), 8))
    base = 64 * 16 // (elems * c.inp_width // 8)
    moves = dma.merge(c, dma.box_transfers(c, MemId.INP, shape, base, origin, extent, 0))
    got = _run_loads(c, moves, dram)[:rows].reshape(*extent, elems)
    padded = np.pad(tensor, [(0, 0), (0, 0), (20, 40), (20, 40), (0, 0)])
    sl = tuple(slice(o + (20 if d >= 2 else 0), o + (20 if d >= 2 else 0) + e)
               for d, (o, e) in enumerate(zip(origin, extent, strict=True)))
    np.testing.assert_array_equal(got, padded[sl])
    assert all(max(t.pads) <= 15 for t in moves)


def test_merge_joins_contiguous_rows_and_keeps_padded_ones():
    c = PRESETS["default"]
    moves = dma.box_transfers(c, MemId.INP, (1, 4, 8, 8, 1), 0, (0, 0, 0, 0, 0), (1, 4, 8, 8, 1), 0)
    assert dma.merge(c, moves) == [dma.Transfer(MemId.INP, 0, 0, 1, 256, 256)]
    padded = dma.box_transfers(c, MemId.INP, (1, 2, 8, 8, 1), 0, (0, 0, -1, -1, 0), (1, 2, 10, 10, 1), 0)
    assert len(dma.merge(c, padded)) == 2 and all(t.pads == (1, 1, 1, 1) for t in padded)
    with pytest.raises(ValueError, match="only the two innermost"):
        dma.box_transfers(c, MemId.INP, (2, 2, 8, 8, 1), 0, (-1, 0, -1, 0, 0), (2, 2, 8, 8, 1), 0)


# ---- schedules ---------------------------------------------------------------------------------------


def _resnet_layers() -> list[schedule.LayerGeom]:
    out = [schedule.LayerGeom("conv1", "conv", 1, 1, 4, 1, 1, 224, 224, 112, 112, 7, 7, 2, 2, (3, 3, 3, 3),
                              vectors=3, alu_steps=6)]
    for ch, hw, stride in ((64, 56, 1), (128, 28, 2), (256, 14, 2), (512, 7, 2)):
        blocks = ch // 16
        out.append(schedule.LayerGeom(f"c{ch}", "conv", 1, blocks, blocks, 1, 1, hw, hw, hw, hw, 3, 3, 1, 1,
                                      (1, 1, 1, 1), residual=True, vectors=3, alu_steps=12))
        out.append(schedule.LayerGeom(f"d{ch}", "conv", 1, max(blocks // 2, 1), blocks, 1, 1, hw * stride,
                                      hw * stride, hw, hw, 1, 1, stride, stride))
    out.append(schedule.LayerGeom("pool", "maxpool", 1, 4, 4, 1, 1, 112, 112, 56, 56, 3, 3, 2, 2, (1, 1, 1, 1)))
    return out


@pytest.mark.parametrize("name", ["tiny", "default", "zcu104"])
def test_default_schedules_fit_the_buffers_of_each_config(name):
    c = PRESETS[name]
    for g in _resnet_layers():
        s = schedule.default_schedule(g, c)
        u = schedule.usage(g, s, c)
        assert u.inp <= c.inp_rows // s.vthreads and u.wgt <= c.wgt_rows // s.vthreads
        assert u.acc <= c.acc_rows // s.vthreads
        assert s.vthreads == 2
        assert g.ho % s.tile_h == 0 and g.wo % s.tile_w == 0 and g.ocb % s.tile_oc == 0 and g.icb % s.tile_ic == 0
        assert schedule.Schedule.from_dict(s.to_dict()) == s


def test_kernel_rows_split_into_reduction_steps():
    """A 7x7 kernel on tiny: whole, its weights fill half the weight buffer; split by rows, two threads fit."""
    c = PRESETS["tiny"]
    g = _resnet_layers()[0]
    whole = schedule.Schedule(tile_h=1, tile_w=8, tile_oc=1, tile_ic=1, vthreads=2)
    split_rows = schedule.Schedule(tile_h=1, tile_w=8, tile_oc=1, tile_ic=1, vthreads=2, tile_kh=1)
    assert not schedule.fits(g, whole, c) and schedule.fits(g, split_rows, c)
    u = schedule.usage(g, split_rows, c)
    assert u.stages == u.tasks * 7 and u.gemm_execs == schedule.usage(g, whole, c).gemm_execs
    assert schedule.default_schedule(g, c).vthreads == 2


def test_schedules_follow_the_config():
    """Halving the buffers shrinks the tiles; nothing about the default config is built in."""
    g = _resnet_layers()[1]
    big, small = PRESETS["default"], PRESETS["default"].replace(inp_buff_bytes=8192, acc_buff_bytes=32768,
                                                                 wgt_buff_bytes=65536, name="small")
    sb, ss = schedule.default_schedule(g, big), schedule.default_schedule(g, small)
    assert schedule.usage(g, ss, small).acc <= small.acc_rows // 2
    assert schedule.usage(g, ss, small).inp < schedule.usage(g, sb, big).inp
    space = list(schedule.space(g, small))
    assert ss in space and all(schedule.fits(g, s, small) for s in space)
    with pytest.raises(ValueError, match="unknown schedule field"):
        schedule.Schedule.from_dict({"tile_q": 3})


def test_a_layer_that_cannot_fit_names_itself():
    c = PRESETS["tiny"]
    g = schedule.LayerGeom("huge", "conv", 1, 1, 1, 1, 1, 64, 100, 2, 21, 40, 80, 1, 1)  # 80 weight rows/kernel row
    with pytest.raises(ValueError, match="layer 'huge': no tiling fits"):
        schedule.ranked(g, c)


# ---- tokens and static checks -------------------------------------------------------------------------


UOP_ROW = 1024  # where the helper's micro-ops sit in DRAM (in uop words)


def _double_buffered(config: AcceleratorConfig, tiles: int) -> tuple[Stream, Dram]:
    """Loads into two SRAM halves, GEMMs reading them and stores: the shape of every conv program."""
    from weft.compiler.backend.te import Kernel
    from weft.isa.encoding import UOP_DTYPE, encode_uops

    s = Stream(config)
    half = config.inp_rows // 2
    for k in range(tiles):
        h = k % 2
        s.transfer(dma.Transfer(MemId.INP, h * half, 0, 1, 4, 4))
        uops = np.zeros(4, dtype=UOP_DTYPE)
        uops["dst"], uops["src"] = np.arange(4) + 8 * h, np.arange(4) + h * half
        s.gemm(Kernel(uops, 1, 1, (0, 0), (0, 0), (0, 0)))
        s.transfer(dma.Transfer(MemId.OUT, 8 * h, 64, 1, 4, 4))
    program = s.program(UOP_ROW)
    inject_sync(program.insns, config)
    dram = Dram(1 << 16)
    dram.write(UOP_ROW * config.uop_bits // 8, encode_uops(config, s.uop_table()))
    return program, dram


def test_tokens_overlap_the_halves_and_balance():
    c = PRESETS["default"]
    s, dram = _double_buffered(c, 6)
    insns = s.array()
    peaks = check.check_tokens("t", insns, c)
    assert peaks["l2g"] >= 1 and peaks["s2g"] >= 1
    loads = insns[(insns["opcode"] == 0) & (insns["mem_id"] == int(MemId.INP))]
    assert loads["pop_next"].tolist()[:2] == [0, 0] and all(loads["pop_next"][2:])  # halves reused from tile 2
    compute = semantics.units(insns) == 1
    assert loads["push_next"].sum() == insns["pop_prev"][compute].sum()  # every l2g push is popped once
    stats = run_program(c, dram, insns)  # the simulator's race checks agree
    assert stats["tokens_left"] == dict.fromkeys(("l2g", "g2l", "g2s", "s2g"), 0)


def test_the_token_check_catches_a_missing_pop_and_a_deadlock():
    c = PRESETS["default"]
    insns = _double_buffered(c, 4)[0].array()
    broken = insns.copy()
    k = int(np.flatnonzero(broken["pop_prev"] & (broken["opcode"] == 2))[-1])
    broken["pop_prev"][k] = 0
    with pytest.raises(check.StreamError, match=r"unbalanced tokens|not ordered after") as err:
        check.check_tokens("layer_x", broken, c)
    assert "layer 'layer_x'" in str(err.value)
    stuck = insns.copy()
    first_load = int(np.flatnonzero(stuck["opcode"] == 0)[0])
    stuck["pop_next"][first_load] = 1  # waits for a GEMM that waits for it
    with pytest.raises(check.StreamError, match=f"instruction {first_load}: deadlock"):
        check.check_tokens("layer_x", stuck, c)


def test_the_hazard_check_names_the_instruction():
    from weft.isa import ProgramBuilder, uops_from

    c = PRESETS["default"]
    p = ProgramBuilder()
    p.gemm(0, 2, iter_out=3, dst=(1, 0), src=(1, 0), wgt=(0, 0))  # dst 0,1 then 1,2: 1 follows 1
    p.alu("add", 0, 1, iter_out=4, dst=(1, 0), src=(1, 0))  # reads the row the previous execution wrote
    p.finish()
    uops = uops_from([(0, 0, 0), (1, 1, 0)])
    with pytest.raises(check.StreamError, match="instruction 0: executions 1 and 2 both write acc row 1"):
        check.check_hazards("l", p.insns, uops, c)
    with pytest.raises(check.StreamError, match="instruction 0: execution 1 reads acc row 1"):
        check.check_hazards("l", p.insns[1:], uops_from([(1, 0, 0)]), c)
    with pytest.raises(check.StreamError, match="outside the 1 loaded"):
        check.check_hazards("l", p.insns, uops[:1], c)
    # rows 0, 1, 0, 1: fine for MAX, not for RQ, whose result comes two stages later
    q = ProgramBuilder()
    q.alu("max", 0, 2, iter_in=2, imm=0)
    q.alu("rq", 0, 2, iter_in=2, imm=1)
    q.finish()
    with pytest.raises(check.StreamError, match="instruction 1: executions 0 and 2 both write acc row 0"):
        check.check_hazards("l", q.insns, uops, c)


def test_unpack_of_pack_is_identity_for_dram_images():
    x = np.random.default_rng(0).integers(-8, 8, (5, 32))
    np.testing.assert_array_equal(unpack(pack(x, 4), 4), x)
