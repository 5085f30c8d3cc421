"""The accumulator's single read port on the RTL: an ALU micro-op that reads acc[src] issues every
ALU_SRC_INTERVAL cycles (but for an instruction whose src rows stay in registers after its first sweep),
reads what the execution two ahead of it wrote, and the timing model counts the same cycles (the "ideal"
DRAM, where the model is exact)."""

from __future__ import annotations

import numpy as np
import pytest

from weft.config import PRESETS
from weft.isa import MemId, ProgramBuilder, encode_uops, uops_from
from weft.isa.arith import pack
from weft.isa.constants import AluOp, Opcode
from weft.isa.semantics import hazard_reach, row_bytes
from weft.sim.dram import Dram
from weft.sim.timing_calibrate import Stream, compare

#: Micro-ops of the late ops' streams: each revisits its row as soon as spec "hazard" allows.
_LATE = hazard_reach(Opcode.ALU, AluOp.MUL) + 1

pytestmark = pytest.mark.rtl

CONFIG = PRESETS["tiny"]


def alu_src_stream(op: str, triples: list[tuple[int, int, int]], iter_out: int, iter_in: int,
                   dst: tuple[int, int], src: tuple[int, int], seed: int, imm: int | None = None,
                   span: int = 1 << 12) -> Stream:
    """Random accumulators in [-span, span), one ALU instruction reading acc[src] (or taking `imm`) over
    `triples`, the outputs stored (saturated to out_width: a small span keeps the results visible)."""
    c, row = CONFIG, row_bytes(CONFIG)
    rng = np.random.default_rng(seed)
    dram = Dram(1 << 16)
    acc = rng.integers(-span, span, (32, c.batch * c.block_out))
    acc_addr = dram.alloc(acc.size * c.acc_width // 8, align=64)
    dram.write(acc_addr, pack(acc, c.acc_width).reshape(-1))
    uop_raw = np.frombuffer(encode_uops(c, uops_from(triples)), np.uint8)
    uop_addr = dram.alloc(uop_raw.size, align=64)
    dram.write(uop_addr, uop_raw)
    out_addr = dram.alloc(32 * row[MemId.OUT], align=64)
    p = ProgramBuilder()
    p.load(MemId.ACC, 0, acc_addr // row[MemId.ACC], 1, 32)
    p.load(MemId.UOP, 0, uop_addr // row[MemId.UOP], 1, len(triples))
    p.alu(op, 0, len(triples), iter_out, iter_in, dst=dst, src=src, imm=imm, deps=["push_next"])
    p.store(0, out_addr // row[MemId.OUT], 1, 32, deps=["pop_prev", "push_prev"])
    p.finish(deps=["pop_next"])
    operand = "src" if imm is None else f"imm {imm}"
    return Stream(f"alu {op} {operand} {len(triples)} uops x{iter_out}x{iter_in}", p.insns, dram)


def test_alu_micro_ops_reading_acc_src_take_two_cycles_each_and_see_writes_two_ahead():
    streams = [
        # e2 reads row 0 that e0 wrote, e3 row 1 that e1 wrote...: read-after-write at distance 2.
        alu_src_stream("add", [(0, 8, 0), (1, 9, 0), (2, 0, 0), (3, 1, 0), (4, 2, 0), (5, 3, 0)], 1, 1,
                       (0, 0), (0, 0), seed=1),
        alu_src_stream("max", [(0, 16, 0), (1, 17, 0), (2, 18, 0)], 3, 2, (6, 3), (1, 5), seed=2),
        alu_src_stream("shr", [(k, 31 - k, 0) for k in range(5)], 2, 1, (5, 0), (0, 0), seed=3),
        # Without src factors the src rows stay in registers after the first sweep; e2 writes row 3 that
        # u0 holds and e4 reads two later, e4 row 0 that u2 holds and e6 reads: the held rows follow F.
        alu_src_stream("add", [(0, 3, 0), (4, 5, 0), (3, 0, 0), (6, 7, 0)], 3, 1, (0, 0), (0, 0), seed=4),
        alu_src_stream("min", [(0, 3, 0), (4, 5, 0), (3, 0, 0), (6, 7, 0)], 2, 2, (0, 0), (0, 0), seed=5),
        # More micro-ops than registers: every execution reads.
        alu_src_stream("add", [(k, 20 + k, 0) for k in range(9)], 2, 1, (0, 0), (0, 0), seed=6),
        # One per cycle, a row every second execution (a pooling reduction): X takes the result two ahead
        # from Z; SHR, MUL and RQ (their results out of Z's logic) a row every fourth, from F's register.
        alu_src_stream("add", [(0, 0, 0), (1, 0, 0)], 4, 1, (0, 0), (0, 0), seed=7, imm=3, span=30),
        alu_src_stream("max", [(0, 0, 0), (1, 0, 0)], 2, 2, (0, 0), (0, 0), seed=8, imm=-5, span=30),
        alu_src_stream("mul", [(k, 0, 0) for k in range(_LATE)], 3, 1, (0, 0), (0, 0), seed=9, imm=-1, span=30),
        alu_src_stream("shr", [(k, 0, 0) for k in range(_LATE)], 3, 1, (0, 0), (0, 0), seed=10, imm=1, span=30),
        alu_src_stream("rq", [(k, 20 + k, 0) for k in range(_LATE)], 3, 1, (0, 0), (0, 0), seed=11, span=30),
        # acc[src] two ahead, one per cycle once the src rows are held: u2 reads row 0 that u0 wrote
        alu_src_stream("add", [(0, 5, 0), (1, 6, 0), (2, 0, 0)], 3, 1, (0, 0), (0, 0), seed=12, span=30),
    ]
    for c in compare(CONFIG, streams, timing="ideal"):
        assert not c.problem, f"{c.name}: the RTL differs from the functional simulator: {c.problem}"
        assert c.model == c.rtl, (c.name, {k: (c.model[k], c.rtl[k]) for k in c.model if c.model[k] != c.rtl[k]})
