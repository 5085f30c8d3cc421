"""Amaranth-simulator tests of the accelerator's building blocks, against the functional simulator's
kernels (the oracle) or a few lines of numpy."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import Module, Signal, signed
from amaranth.sim import Simulator

from weft.config import PRESETS
from weft.hw.axi import ReadArbiter
from weft.hw.datapath import (
    GEMM_LATENCY,
    MULT18X18D,
    AluRow,
    GemmCore,
    alu_lane_first,
    alu_lane_last,
    alu_lane_mid,
    alu_multiplicands,
    alu_selects,
    multiplier_top,
    packs_weight_pairs,
    saturate_row,
    sign_extend_row,
)
from weft.hw.dma import RowPacker, RowUnpacker
from weft.hw.dsp import fits_mult18x18d, registered_product
from weft.hw.fetch import Fetch, check_insn, range_bits, sram_range
from weft.hw.queues import LutFIFO
from weft.hw.regs import ErrorCode
from weft.hw.unit import TokenQueue
from weft.isa import AluOp, MemId, Opcode, arith, encode_insns, make_insns
from weft.isa.arith import pack, unpack
from weft.sim.kernels import alu_apply


def _run(dut, bench, clock: bool = True) -> None:
    sim = Simulator(dut)
    if clock:
        sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def _row(values: np.ndarray, width: int) -> int:
    return int.from_bytes(pack(np.asarray(values), width).tobytes(), "little")


def _values(row: int, nbytes: int, width: int) -> np.ndarray:
    return unpack(np.frombuffer(row.to_bytes(nbytes, "little"), dtype=np.uint8), width).astype(np.int64)


def _feeder(dut, commands: list[tuple[int, int]]):
    """A testbench that sends the (lane, count) `commands` to a row unpacker's or packer's cmd stream."""

    async def feed(ctx):
        for lane, count in commands:
            ctx.set(dut.cmd.payload.lane, lane)
            ctx.set(dut.cmd.payload.count, count)
            ctx.set(dut.cmd.valid, 1)
            await ctx.tick().until(dut.cmd.ready)
        ctx.set(dut.cmd.valid, 0)

    return feed


def test_token_queue_counts_pushes_and_pops_up_to_its_depth():
    dut = TokenQueue(depth=3)

    async def bench(ctx):
        assert ctx.get(dut.has_room) and not ctx.get(dut.has_token)
        for level in (1, 2, 3):
            ctx.set(dut.push, 1)
            await ctx.tick()
            assert ctx.get(dut.level) == level
        ctx.set(dut.push, 0)
        assert ctx.get(dut.has_token) and not ctx.get(dut.has_room)
        ctx.set(dut.pop, 1)
        ctx.set(dut.push, 1)  # both at once: the level holds
        await ctx.tick()
        assert ctx.get(dut.level) == 3
        ctx.set(dut.push, 0)
        await ctx.tick().repeat(3)
        assert ctx.get(dut.level) == 0 and not ctx.get(dut.has_token)

    _run(dut, bench)


@pytest.mark.parametrize("depth", [1, 2, 3, 4, 5, 16])
def test_lut_fifo_matches_amaranths_buffered_fifo_cycle_for_cycle(depth):
    """LutFIFO keeps its storage's flags in registers; under random writes and reads it shows what
    amaranth's SyncFIFOBuffered shows, every cycle (its ports and cycles are the timing model's)."""
    from amaranth.lib.fifo import SyncFIFOBuffered

    m = Module()
    m.submodules.ours = ours = LutFIFO(width=8, depth=depth)
    m.submodules.theirs = theirs = SyncFIFOBuffered(width=8, depth=depth)
    rng = np.random.default_rng(depth)
    seen = {"reads": 0}

    async def bench(ctx):
        for cycle in range(600):
            w_en, r_en, data = (int(x) for x in (rng.random() < 0.6, rng.random() < 0.5, rng.integers(256)))
            for q in (ours, theirs):
                ctx.set(q.w_en, w_en)
                ctx.set(q.w_data, data)
                ctx.set(q.r_en, r_en)
            got = [(ctx.get(q.w_rdy), ctx.get(q.r_rdy), ctx.get(q.level)) for q in (ours, theirs)]
            assert got[0] == got[1], f"cycle {cycle}: (w_rdy, r_rdy, level) {got[0]} != {got[1]}"
            if got[0][1]:
                assert ctx.get(ours.r_data) == ctx.get(theirs.r_data), f"cycle {cycle}"
                seen["reads"] += r_en
            await ctx.tick()

    _run(m, bench)
    assert seen["reads"] > 100


def test_lut_fifo_keeps_its_storage_in_lut_ram():
    """The queues' timing rests on the storage not being a block RAM (whose read data comes too late)."""
    from amaranth.back import rtlil

    queue = LutFIFO(width=8, depth=16)
    text = rtlil.convert(queue, ports=[queue.w_data, queue.w_en, queue.w_rdy, queue.r_data, queue.r_en, queue.r_rdy])
    assert 'attribute \\ram_style "distributed"' in text


@pytest.mark.parametrize("clients", [1, 2, 3, 4])
def test_read_arbiter_ready_names_the_client_it_grants(clients):
    """The arbiter's round-robin rule is written twice: as the grant (which selects ARADDR, ARLEN, ARID)
    and, for timing, as each client's ready on its own. Under random requests (every request pattern
    after every last grant) the one client that sees its request taken is the one granted, in round-robin
    order after the last grant."""
    dut = ReadArbiter(clients=clients, addr_bits=32, data_bits=64)
    rng = np.random.default_rng(clients)

    async def bench(ctx):
        for k, client in enumerate(dut.clients):  # each client's address names it
            ctx.set(client.ar.payload.addr, 0x1000 * (k + 1))
        last = 0  # the reset's last grant: client 1 goes first
        patterns = set()
        for _ in range(1500):
            valid = [int(v) for v in rng.integers(0, 2, size=clients)]
            for client, v in zip(dut.clients, valid, strict=True):
                ctx.set(client.ar.valid, v)
            ctx.set(dut.axi.arready, int(rng.random() < 0.7))
            busy = ctx.get(dut.axi.arvalid)
            taken = [k for k, c in enumerate(dut.clients) if ctx.get(c.ar.valid) and ctx.get(c.ar.ready)]
            if busy or not any(valid):
                assert taken == []
            else:
                expected = next((last + step) % clients for step in range(1, clients + 1)
                                if valid[(last + step) % clients])
                assert taken == [expected], (last, valid, taken)
                patterns.add((last, tuple(valid)))
            await ctx.tick()
            if taken:
                assert ctx.get(dut.axi.arid) == taken[0] and ctx.get(dut.axi.araddr) == 0x1000 * (taken[0] + 1)
                last = taken[0]
        assert len(patterns) == clients * (2 ** clients - 1)  # every request pattern after every last grant

    _run(dut, bench)


@pytest.mark.parametrize(("bus_bytes", "elem_bytes"), [(8, 4), (8, 2), (8, 8), (8, 32), (4, 16)])
def test_row_unpacker_extracts_elements_from_beats(bus_bytes, elem_bytes):
    rng = np.random.default_rng(elem_bytes)
    dut = RowUnpacker(bus_bytes=bus_bytes, elem_bytes=elem_bytes, count_bits=12)
    lanes = max(1, bus_bytes // elem_bytes)
    commands = [(int(rng.integers(0, lanes)), int(rng.integers(1, 7))) for _ in range(6)]
    memory = rng.integers(0, 256, 4096, dtype=np.uint8)
    beats, expected = [], []
    for lane, count in commands:  # the beats a burst reader would deliver for each command
        start = 64 * len(beats) + lane * elem_bytes
        first = start // bus_bytes * bus_bytes
        end = start + count * elem_bytes
        for addr in range(first, -(-end // bus_bytes) * bus_bytes, bus_bytes):
            beats.append(int.from_bytes(memory[addr:addr + bus_bytes].tobytes(), "little"))
        for k in range(count):
            a = start + k * elem_bytes
            expected.append(int.from_bytes(memory[a:a + elem_bytes].tobytes(), "little"))

    async def bench(ctx):
        got = []
        k = 0
        for cycle in range(2000):
            stall = cycle % 3 == 1  # back-pressure on the output and gaps on the input
            ctx.set(dut.elems.ready, not stall)
            ctx.set(dut.beats.valid, k < len(beats) and cycle % 5 != 2)
            ctx.set(dut.beats.payload, beats[k] if k < len(beats) else 0)
            took_beat = ctx.get(dut.beats.valid) and ctx.get(dut.beats.ready)
            if ctx.get(dut.elems.valid) and ctx.get(dut.elems.ready):
                got.append(ctx.get(dut.elems.payload))
            await ctx.tick()
            k += bool(took_beat)
            if len(got) == len(expected):
                break
        assert got == expected
        assert k == len(beats)  # every beat consumed, none left behind
        # and with every command done, the unpacker takes no more (Load2D's reader serves whichever of its
        # unpackers is ready: an idle one must not take a beat meant for another)
        ctx.set(dut.elems.ready, 1)
        ctx.set(dut.beats.valid, 1)
        for _ in range(4):
            assert not ctx.get(dut.beats.ready)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(_feeder(dut, commands), background=True)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize(("bus_bytes", "elem_bytes"), [(8, 4), (8, 1), (8, 8), (8, 16)])
def test_row_packer_builds_beats_and_byte_strobes(bus_bytes, elem_bytes):
    rng = np.random.default_rng(bus_bytes + elem_bytes)
    dut = RowPacker(bus_bytes=bus_bytes, elem_bytes=elem_bytes, count_bits=12)
    lanes = max(1, bus_bytes // elem_bytes)
    commands = [(int(rng.integers(0, lanes)), int(rng.integers(1, 9))) for _ in range(5)]
    elems = [int.from_bytes(rng.bytes(elem_bytes), "little") for _ in range(sum(c for _, c in commands))]
    expected, k = [], 0
    for lane, count in commands:
        image = bytearray(bus_bytes * (count + 2 + count * elem_bytes // bus_bytes))
        mask = bytearray(len(image))
        for n in range(count):
            pos = (lane + n) * elem_bytes
            image[pos:pos + elem_bytes] = elems[k].to_bytes(elem_bytes, "little")
            mask[pos:pos + elem_bytes] = b"\x01" * elem_bytes
            k += 1
        used = -(-((lane + count) * elem_bytes) // bus_bytes)
        for b in range(used):
            data = int.from_bytes(image[b * bus_bytes:(b + 1) * bus_bytes], "little")
            strb = sum(mask[b * bus_bytes + i] << i for i in range(bus_bytes))
            expected.append((data, strb))

    async def bench(ctx):
        got, n = [], 0
        for cycle in range(2000):
            ctx.set(dut.beats.ready, cycle % 4 != 3)
            ctx.set(dut.elems.valid, n < len(elems) and cycle % 3 != 1)
            ctx.set(dut.elems.payload, elems[n] if n < len(elems) else 0)
            took = ctx.get(dut.elems.valid) and ctx.get(dut.elems.ready)
            if ctx.get(dut.beats.valid) and ctx.get(dut.beats.ready):
                strb = ctx.get(dut.beats.payload.strb)
                data = ctx.get(dut.beats.payload.data)
                keep = sum(0xFF << (8 * i) for i in range(bus_bytes) if strb >> i & 1)
                got.append((data & keep, strb))
            await ctx.tick()
            n += bool(took)
            if len(got) == len(expected):
                break
        assert got == expected

    top = Module()  # whole-beat packing is combinational: give the simulation a clock to step
    top.submodules.dut = dut
    tick = Signal()
    top.d.sync += tick.eq(~tick)
    sim = Simulator(top)
    sim.add_clock(1e-6)
    if elem_bytes < bus_bytes:
        sim.add_testbench(_feeder(dut, commands), background=True)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize(("name", "packed"), [("tiny", True), ("tiny", False), ("rect", True), ("int4w", True)])
def test_gemm_core_matches_numpy_every_cycle(name, packed):
    c = PRESETS[name]
    dut = GemmCore(batch=c.batch, block_in=c.block_in, block_out=c.block_out, inp_width=c.inp_width,
                   wgt_width=c.wgt_width, packed=packed)
    assert dut.packed == packed  # every preset's widths fit two products per DSP
    rng = np.random.default_rng(1)
    hi_i, hi_w = 1 << (c.inp_width - 1), 1 << (c.wgt_width - 1)
    cases = [(rng.integers(-hi_i, hi_i, (c.batch, c.block_in)), rng.integers(-hi_w, hi_w, (c.block_out, c.block_in)))
             for _ in range(8)]
    cases.append((np.full((c.batch, c.block_in), -hi_i), np.full((c.block_out, c.block_in), -hi_w)))  # extremes

    async def bench(ctx):
        outputs = []
        for cycle in range(len(cases) + GEMM_LATENCY):
            if cycle < len(cases):
                x, w = cases[cycle]
                ctx.set(dut.inp, _row(x.reshape(-1), c.inp_width))
                ctx.set(dut.wgt, _row(w.reshape(-1), c.wgt_width))
            await ctx.tick()
            if cycle >= GEMM_LATENCY - 1:
                raw = ctx.get(dut.sums)
                outputs.append([(raw >> (k * dut.sum_bits) & ((1 << dut.sum_bits) - 1))
                                for k in range(c.batch * c.block_out)])
        for (x, w), got in zip(cases, outputs, strict=False):
            want = (x @ w.T).reshape(-1)
            got = [v - (1 << dut.sum_bits) if v >> (dut.sum_bits - 1) else v for v in got]
            assert got == want.tolist()

    _run(dut, bench)


def test_gemm_core_packs_two_weights_only_where_the_multiplier_takes_them():
    """An int8 pair (24 bits) fits a DSP48's 25-bit port, not an ECP5 MULT18X18D's 18 (the unpacked core's
    products are checked above)."""
    assert packs_weight_pairs(8, 8)
    assert not packs_weight_pairs(8, 8, MULT18X18D)
    assert packs_weight_pairs(8, 4, MULT18X18D)  # int4 weights: 16 bits


@pytest.mark.parametrize("width", [32, 16])
def test_alu_row_matches_the_functional_simulator_for_every_op(width):
    lanes = 4
    dut = AluRow(lanes=lanes, width=width)
    rng = np.random.default_rng(2)
    top = 1 << (width - 1)
    special = np.array([0, 1, -1, top - 1, -top, 31, -32, 32, 64, -33, 7, -7])
    cases = []
    for op in AluOp:
        for _ in range(6):
            a = rng.choice(np.r_[special, rng.integers(-top, top, 8)], lanes)
            b = rng.choice(np.r_[special, rng.integers(-top, top, 8)], lanes)
            imm = int(rng.integers(-(1 << 15), 1 << 15)) if rng.random() < 0.5 else None
            cases.append((op, a, b, imm))
    # RQ operands as the compiler packs them, the extremes of each field included: the largest product
    # (-2^(w-1) * -2^(mul_bits-1)), the shifts where the result becomes 0, ReLU on and off
    mul_bits, shift_bits = arith.rq_layout(width)
    m_top = 1 << (mul_bits - 1)
    for _ in range(24):
        a = rng.choice(np.r_[special, rng.integers(-top, top, 8)], lanes)
        m = rng.choice(np.r_[-m_top, m_top - 1, 0, 1, -1, rng.integers(-m_top, m_top, 8)], lanes)
        s = rng.choice(np.r_[0, 1, width + mul_bits - 2, width + mul_bits - 1, width + mul_bits,
                             (1 << shift_bits) - 1, rng.integers(0, width + mul_bits, 8)], lanes)
        cases.append((AluOp.RQ, a, arith.rq_pack(m, s, rng.integers(0, 2, lanes), width), None))

    async def bench(ctx):
        for op, a, b, imm in cases:
            ctx.set(dut.op, int(op))
            ctx.set(dut.use_imm, imm is not None)
            ctx.set(dut.imm, imm or 0)
            ctx.set(dut.dst, _row(a, width))
            ctx.set(dut.src, _row(b, width))
            acc = np.stack([a, b]).astype(np.int64)
            alu_apply(acc, int(op), np.array([0]), None if imm is not None else np.array([1]), imm or 0, width, 2)
            got = _values(ctx.get(dut.result), lanes * width // 8, width)
            assert got.tolist() == acc[0].tolist(), (op, a, b, imm)

    _run(dut, bench, clock=False)


@pytest.mark.parametrize("width", [16, 32])
def test_alu_products_registered_in_ecp5_multipliers_give_the_lanes_results(width):
    """The ECP5 flow registers the ALU's product operands inside MULT18X18D (weft.hw.dsp) a cycle ahead of
    the lane's other operands. Simulated with the primitive's model in its place, a lane whose products come
    from there gives what the functional simulator gives, op by op (the RQ extremes included)."""
    rng = np.random.default_rng(width)
    m = Module()
    op = Signal(3)
    a_next, b_next, a, b = (Signal(signed(width), name=n) for n in ("a_next", "b_next", "a", "b"))
    m.d.sync += [a.eq(a_next), b.eq(b_next)]
    selects = alu_selects(op)
    pairs = alu_multiplicands(a_next, b_next, multiplier_top(selects, b_next, width), width)
    products = [registered_product(m, x, y, primitive="MULT18X18D", model=True, name=f"mul_{k}")
                for k, (x, y) in enumerate(pairs)]
    # (every operand fits the primitive's signed 18 bits: the model, not the fabric fallback, multiplies)
    assert all(fits_mult18x18d(v) for pair in pairs for v in pair)
    first = alu_lane_first(m, selects, a, b, width, products=products)
    result = Signal(width)
    m.d.comb += result.eq(alu_lane_last(m, selects, first.result(b), alu_lane_mid(m, selects, first.kept,
                                                                                   first.parts, width), width))
    top = 1 << (width - 1)
    mul_bits, _ = arith.rq_layout(width)
    cases = [(op_, int(x), int(y)) for op_ in AluOp
             for x, y in [*rng.integers(-top, top, (24, 2)).tolist(), (-top, -top), (top - 1, -top), (-1, top - 1)]]
    cases += [(AluOp.RQ, int(x), int(arith.rq_pack(np.array([mm]), np.array([ss]), np.array([rr]), width)[0]))
              for x, mm, ss, rr in zip(rng.integers(-top, top, 40), rng.integers(-(1 << (mul_bits - 1)),
                                       1 << (mul_bits - 1), 40), rng.integers(0, width + mul_bits, 40),
                                       rng.integers(0, 2, 40), strict=True)]

    async def bench(ctx):
        for op_, x, y in cases:
            ctx.set(op, int(op_))
            ctx.set(a_next, x)
            ctx.set(b_next, y)
            await ctx.tick()
            ctx.set(a_next, int(rng.integers(-top, top)))  # (the next operands: the result is this cycle's)
            ctx.set(b_next, int(rng.integers(-top, top)))
            acc = np.array([[x], [y]], dtype=np.int64)
            alu_apply(acc, int(op_), np.array([0]), np.array([1]), 0, width, 2)
            got = ctx.get(result)
            assert (got - (1 << width) if got >= top else got) == int(acc[0, 0]), (op_, x, y)

    _run(m, bench)


def test_registered_product_instantiates_mult18x18d_with_its_input_registers():
    """The ECP5 netlist's ALU products: a MULT18X18D per product, both operands registered on CLK0 inside it,
    the spare clocks unconnected; an operand wider than the primitive's 18 signed bits falls back to the
    fabric."""
    from amaranth.back import rtlil

    m = Module()
    x, y, wide = Signal(16), Signal(signed(18)), Signal(18)
    out, fallback = Signal(40), Signal(40)
    m.d.comb += [out.eq(registered_product(m, x, y, primitive="MULT18X18D", name="fits")),
                 fallback.eq(registered_product(m, wide, y, primitive="MULT18X18D", name="spills"))]
    assert fits_mult18x18d(x) and fits_mult18x18d(y) and not fits_mult18x18d(wide)
    text = rtlil.convert(m, ports=[x, y, wide, out, fallback])
    assert text.count("cell \\MULT18X18D ") == 1
    for param in ("REG_INPUTA_CLK", "REG_INPUTB_CLK"):
        assert f'parameter \\{param} "CLK0"' in text
    assert 'parameter \\REG_OUTPUT_CLK "NONE"' in text and "connect \\CLK1 " not in text


@pytest.mark.parametrize("bus_bytes", [8, 16])
def test_burst_rules_split_at_4_kib_and_the_longest_burst(bus_bytes):
    """Every form of the burst rule (from the address, from the beats kept to its 4 KiB boundary, and the
    verdict that the next burst fits a room) against the rule in a few lines, at addresses around the
    boundary and counts whose upper bits alone tell them from a short one."""
    from weft.hw.axi import BOUNDARY_BYTES
    from weft.hw.dma import _burst_len, _burst_len_at_most, _paged_burst_len, _paged_burst_takes_all
    from weft.hw.structure import MAX_BURST

    def rule(addr: int, beats: int) -> int:
        return min(beats, MAX_BURST, (BOUNDARY_BYTES - addr % BOUNDARY_BYTES) // bus_bytes)

    m = Module()
    addr, beats, room = Signal(32), Signal(20), Signal(6)
    page = Signal(range(BOUNDARY_BYTES // bus_bytes + 1))
    length, paged, less, takes_all, at_most = Signal(20), Signal(20), Signal(20), Signal(), Signal()
    m.d.comb += [length.eq(_burst_len(addr, beats, bus_bytes, MAX_BURST)),
                 paged.eq(_paged_burst_len(page, beats, MAX_BURST)),
                 less.eq(_paged_burst_len(page, beats, MAX_BURST, less=1)),
                 takes_all.eq(_paged_burst_takes_all(page, beats, MAX_BURST)),
                 at_most.eq(_burst_len_at_most(addr, beats, room, bus_bytes, MAX_BURST))]
    edge = BOUNDARY_BYTES - MAX_BURST * bus_bytes  # the last start of a whole longest burst
    # every start from which fewer than a longest burst are left to the boundary (where the room's verdict
    # reads the offset's bits by parts), and a few further from it
    offsets = [0, bus_bytes, edge - bus_bytes, *range(edge, BOUNDARY_BYTES, bus_bytes)]
    counts = [1, 2, MAX_BURST - 1, MAX_BURST, MAX_BURST + 1, 1 << 5, (1 << 5) + 3, 1 << 10, (1 << 19) + 1]

    async def bench(ctx):
        for offset in offsets:
            for count in counts:
                for r in (*range(MAX_BURST + 2), 33, 63):
                    a = 0x1234_0000 + offset
                    ctx.set(addr, a)
                    ctx.set(beats, count)
                    ctx.set(page, (BOUNDARY_BYTES - offset) // bus_bytes)
                    ctx.set(room, r)
                    want = rule(a, count)
                    assert ctx.get(length) == want and ctx.get(paged) == want, (offset, count)
                    assert ctx.get(less) == want - 1 and ctx.get(takes_all) == (want == count), (offset, count)
                    assert ctx.get(at_most) == (want <= r), (offset, count, r)

    _run(m, bench, clock=False)


@pytest.mark.parametrize("bus_bytes", [8, 16])
def test_burst_reader_splits_requests_by_the_rule_and_never_overruns_its_buffer(bus_bytes):
    """A BurstReader against a memory that grants a burst when it likes (never the cycle after one, as the
    arbiter) and a consumer that takes when it likes: its bursts are the rule's split of each request (4 KiB
    boundaries crossed, starts on and next to one, requests back to back), it never asks for a beat its
    buffer has no room for (RREADY is high whenever a beat is offered), and the beats come out in order."""
    from weft.hw.axi import BOUNDARY_BYTES
    from weft.hw.dma import BurstReader
    from weft.hw.structure import MAX_BURST

    page = BOUNDARY_BYTES // bus_bytes
    reader = BurstReader(bus_bytes=bus_bytes, count_bits=12)
    base = 0x4000_0000
    requests = [(base + BOUNDARY_BYTES - 3 * bus_bytes, 40), (base, 1), (base + BOUNDARY_BYTES, MAX_BURST),
                (base + 2 * BOUNDARY_BYTES - MAX_BURST * bus_bytes, MAX_BURST + 1),
                (base + 3 * BOUNDARY_BYTES - bus_bytes, page + 5), (base + 7 * bus_bytes, 3),
                (base + 5 * BOUNDARY_BYTES - 17 * bus_bytes, 0), (base + 5 * BOUNDARY_BYTES - 17 * bus_bytes, 50)]

    def rule(addr: int, beats: int) -> list[tuple[int, int]]:
        bursts = []
        while beats:
            n = min(beats, MAX_BURST, (BOUNDARY_BYTES - addr % BOUNDARY_BYTES) // bus_bytes)
            bursts.append((addr, n))
            addr, beats = addr + n * bus_bytes, beats - n
        return bursts

    expected = [burst for request in requests for burst in rule(*request)]
    rng = np.random.default_rng(bus_bytes)

    async def bench(ctx):
        bursts, due, beats_out, waiting = [], [], [], list(requests)
        granted_last = False
        total = sum(beats for _, beats in requests)
        for _ in range(8 * total + 400):
            if len(beats_out) == total and not waiting:
                break
            grant = not granted_last and rng.random() < 0.6
            ctx.set(reader.bus.ar.ready, grant)
            offer = bool(due) and rng.random() < 0.8
            ctx.set(reader.bus.r.valid, offer)
            ctx.set(reader.bus.r.payload.data, due[0] if due else 0)
            ctx.set(reader.bus.r.payload.resp, 0)
            ctx.set(reader.beats.ready, rng.random() < 0.5)
            ctx.set(reader.cmd.valid, bool(waiting))
            if waiting:
                ctx.set(reader.cmd.payload.addr, waiting[0][0])
                ctx.set(reader.cmd.payload.beats, waiting[0][1])
            issued = grant and ctx.get(reader.bus.ar.valid)
            granted_last = issued
            if issued:
                addr, n = ctx.get(reader.bus.ar.payload.addr), ctx.get(reader.bus.ar.payload.len) + 1
                bursts.append((addr, n))
                due += [addr + k * bus_bytes for k in range(n)]
            if offer:
                assert ctx.get(reader.bus.r.ready), "a beat was asked for that the buffer has no room for"
                due.pop(0)
            if ctx.get(reader.beats.valid) and ctx.get(reader.beats.ready):
                beats_out.append(ctx.get(reader.beats.payload))
            if waiting and ctx.get(reader.cmd.ready):
                waiting.pop(0)
            await ctx.tick()
        assert bursts == expected
        assert beats_out == [addr + k * bus_bytes for addr, n in expected for k in range(n)]
        assert ctx.get(reader.idle)

    _run(reader, bench)


def test_saturation_and_sign_extension_rows():
    acc_w, out_w = 32, 8
    edges = [300, -300, 127, -128, 128, -129, 5, 0, -1, 255, -256, (1 << 31) - 1, -(1 << 31), 1 << 30, -(1 << 30)]
    values = np.array(edges + np.random.default_rng(0).integers(-(1 << 31), 1 << 31, 17).tolist()
                      + np.random.default_rng(1).integers(-400, 400, 32).tolist())
    lanes = len(values)
    m = Module()
    row = Signal(acc_w * lanes)
    narrow = Signal(out_w * lanes)
    m.d.comb += narrow.eq(saturate_row(row, acc_w, out_w))
    back = Signal(acc_w * lanes)
    m.d.comb += back.eq(sign_extend_row(narrow, out_w, acc_w))

    async def bench(ctx):
        ctx.set(row, _row(values, acc_w))
        clipped = np.clip(values, -128, 127)
        assert _values(ctx.get(narrow), lanes, out_w).tolist() == clipped.tolist()
        assert _values(ctx.get(back), lanes * 4, acc_w).tolist() == clipped.tolist()

    _run(m, bench, clock=False)


def _insn(**fields: int) -> np.ndarray:
    insns = make_insns(1)
    for name, value in fields.items():
        insns[0][name] = value
    return insns


@pytest.mark.parametrize(("fields", "last", "code"), [
    (dict(opcode=Opcode.FINISH), True, ErrorCode.NONE),
    (dict(opcode=Opcode.GEMM, uop_bgn=0, uop_end=1), False, ErrorCode.NONE),
    (dict(opcode=Opcode.LOAD, mem_id=MemId.INP, sram_base=250, y_size=1, x_size=6), False, ErrorCode.NONE),
    (dict(opcode=Opcode.LOAD, mem_id=MemId.INP, sram_base=251, y_size=1, x_size=6), False, ErrorCode.SRAM_RANGE),
    (dict(opcode=Opcode.LOAD, mem_id=MemId.INP, x_size=2, y_size=2, y_pad_0=15, x_pad_1=15), False,
     ErrorCode.SRAM_RANGE),
    (dict(opcode=Opcode.LOAD, mem_id=MemId.OUT, x_size=1, y_size=1), False, ErrorCode.ILLEGAL_MEM_ID),
    (dict(opcode=Opcode.STORE, mem_id=MemId.ACC, x_size=1, y_size=1), False, ErrorCode.ILLEGAL_MEM_ID),
    (dict(opcode=Opcode.LOAD, mem_id=MemId.WGT, x_size=1, y_size=1, x_pad_0=1), False, ErrorCode.BAD_PADDING),
    (dict(opcode=Opcode.LOAD, mem_id=MemId.WGT, x_size=0, x_pad_0=1), False, ErrorCode.NONE),  # a no-op
    (dict(opcode=Opcode.LOAD, mem_id=MemId.INP, pop_prev=1), False, ErrorCode.ILLEGAL_DEP_FLAG),
    (dict(opcode=Opcode.STORE, mem_id=MemId.OUT, push_next=1), False, ErrorCode.ILLEGAL_DEP_FLAG),
    (dict(opcode=Opcode.ALU, alu_op=7, uop_bgn=0, uop_end=1), False, ErrorCode.ILLEGAL_ALU_OP),
    (dict(opcode=Opcode.ALU, uop_bgn=3, uop_end=3), False, ErrorCode.UOP_RANGE),
    (dict(opcode=Opcode.GEMM, uop_bgn=0, uop_end=257), False, ErrorCode.UOP_RANGE),
    (dict(opcode=Opcode.FINISH), False, ErrorCode.FINISH_NOT_LAST),
    (dict(opcode=Opcode.GEMM, uop_bgn=0, uop_end=1), True, ErrorCode.NO_FINISH),
])
def test_fetch_checks_instructions_in_the_functional_simulators_order(fields, last, code):
    config = PRESETS["tiny"]
    word = int.from_bytes(encode_insns(config, _insn(**fields)), "little")
    _check_word(config, word, last, code)


@pytest.mark.parametrize("preset", ["tiny", "default"])
def test_the_sram_range_check_multiplies_only_the_low_bits_but_agrees_with_the_whole_product(preset):
    """fetch multiplies only the low range_bits of each side (a longer side overflows every memory): the
    verdict must be the whole product's on sides at, around and far past that width, on every room."""
    config = PRESETS[preset]
    bits = range_bits(config)
    side_bits = bits + 5
    m = Module()
    active, height, width = Signal(), Signal(side_bits), Signal(side_bits)
    room = Signal(signed(bits + 3))
    out = Signal()
    m.d.comb += out.eq(sram_range(active, room, height, width, bits))
    rng = np.random.default_rng(7)
    edges = [0, 1, 2, (1 << bits) - 1, 1 << bits, (1 << bits) + 1, (1 << side_bits) - 1]
    rooms = [-(1 << (bits + 2)), -1, 0, 1, (1 << (bits - 1)) + 3, (1 << bits) - 1]  # room <= a memory's rows
    cases = [(h, w, r) for h in edges for w in edges for r in rooms]
    cases += [(int(rng.integers(0, 1 << int(rng.integers(1, side_bits + 1)))),
               int(rng.integers(0, 1 << int(rng.integers(1, side_bits + 1)))),
               int(rng.integers(-(1 << (bits + 2)), 1 << bits))) for _ in range(1500)]

    async def bench(ctx):
        wrong = []
        for h, w, r in cases:
            for a in (0, 1):
                ctx.set(active, a)
                ctx.set(height, h)
                ctx.set(width, w)
                ctx.set(room, r)
                if ctx.get(out) != (a and h * w > r):
                    wrong.append((a, h, w, r))
        assert not wrong, wrong[:5]

    _run(m, bench, clock=False)


@pytest.mark.parametrize(("bus", "offset", "count"), [(64, 0, 3), (128, 16, 3), (256, 16, 3), (256, 16, 4), (256, 0, 4),
                                                    (512, 48, 2), (512, 16, 6)])
def test_fetch_reads_a_stream_that_starts_inside_a_beat(bus, offset, count):
    """On a bus wider than an instruction the stream may start in a beat's middle: fetch asks for exactly the
    beats from that beat to the stream's end and dispatches each word once, in order, with its index (and
    on narrower buses, where a word takes several beats, the same)."""
    config = PRESETS["tiny"].replace(bus_width=bus)
    B = bus // 8
    insns = make_insns(count)
    for k in range(count - 1):
        insns[k]["opcode"], insns[k]["uop_bgn"], insns[k]["uop_end"] = Opcode.GEMM, k, k + 1
    insns[-1]["opcode"] = Opcode.FINISH
    words = encode_insns(config, insns)
    base = 4 * B  # the stream's first beat
    dram = bytes(base + offset) + words + bytes(2 * B)
    dut = Fetch(config)
    bursts, got = [], []

    async def memory(ctx):  # AR always ready; R beats back to back, in order
        ar, r = dut.bus.ar, dut.bus.r
        ctx.set(ar.ready, 1)
        beats_out: list[tuple[int, bool]] = []  # (address, last) of the beats still to send
        async for *_, ar_valid, addr, length, r_ready in ctx.tick().sample(ar.valid, ar.payload.addr,
                                                                           ar.payload.len, r.ready):
            if beats_out and r_ready:
                beats_out.pop(0)
            if ar_valid:
                bursts.append((addr, length + 1))
                beats_out += [(addr + k * B, k == length) for k in range(length + 1)]
            ctx.set(r.valid, bool(beats_out))
            if beats_out:
                at, last = beats_out[0]
                ctx.set(r.payload.data, int.from_bytes(dram[at:at + B].ljust(B, bytes(1)), "little"))
                ctx.set(r.payload.last, last)

    async def bench(ctx):
        for q in dut.queues:
            ctx.set(q.ready, 1)
        ctx.set(dut.insn_addr, base + offset)
        ctx.set(dut.insn_count, count)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        for _ in range(40 * count):
            await ctx.tick()
            for q in dut.queues:
                if ctx.get(q.valid):
                    got.append((ctx.get(q.payload.index), ctx.get(q.payload.insn)))
            if ctx.get(dut.all_dispatched) and not ctx.get(dut.error):
                break
        assert not ctx.get(dut.error), (ctx.get(dut.error_code), ctx.get(dut.error_index), bursts, got)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(memory, background=True)
    sim.add_testbench(bench)
    sim.run()
    start = base + offset
    assert bursts[0][0] == start // B * B
    assert sum(beats for _, beats in bursts) == -(-(start % B + len(words)) // B), bursts
    assert got == [(k, int.from_bytes(words[16 * k:16 * (k + 1)], "little")) for k in range(count)]


def test_fetch_rejects_an_unknown_opcode():
    config = PRESETS["tiny"]
    word = int.from_bytes(encode_insns(config, _insn(opcode=Opcode.FINISH)), "little") | 0b111
    _check_word(config, word, True, ErrorCode.ILLEGAL_OPCODE)


def _check_word(config, word: int, last: bool, code: ErrorCode) -> None:
    m = Module()
    insn = Signal(128)
    is_last = Signal()
    got_code, _, _ = check_insn(m, config, insn, is_last)

    async def bench(ctx):
        ctx.set(insn, word)
        ctx.set(is_last, last)
        assert ctx.get(got_code) == code

    _run(m, bench, clock=False)
