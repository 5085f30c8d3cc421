"""Random legal programs: they run on every preset, and the fast simulator agrees bit for bit with a slow
reference written from the spec (one micro-op execution at a time, a plain round-robin scheduler)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weft.config import PRESETS, AcceleratorConfig
from weft.isa import AluOp, MemId, Opcode, decode_uops, encode_insns, layout_of
from weft.isa.semantics import FLAG_QUEUE, QUEUES, row_bytes, unit_of
from weft.sim.fsim import FunctionalSimulator, insn_region
from weft.sim.randprog import random_program

PRESET_NAMES = ["tiny", "default", "rect", "zcu104", "int4w"]


def unpack_ref(data: np.ndarray, width: int) -> np.ndarray:
    bits = np.unpackbits(np.asarray(data, dtype=np.uint8).reshape(-1), bitorder="little")
    values = bits.reshape(-1, width).astype(np.int64) @ (1 << np.arange(width, dtype=np.int64))
    return np.where(values >= 1 << (width - 1), values - (1 << width), values)


def pack_ref(values: np.ndarray, width: int) -> np.ndarray:
    flat = np.asarray(values, dtype=np.int64).reshape(-1) & ((1 << width) - 1)
    bits = ((flat[:, None] >> np.arange(width)) & 1).astype(np.uint8).reshape(-1)
    return np.packbits(bits, bitorder="little")


def _rq(a: int, b: int, width: int) -> int:
    """RQ on one element, in Python integers: b packs a signed multiplier, a shift and a ReLU bit."""
    mul_bits, shift_bits = width // 2 + 2, width.bit_length()
    m = b & ((1 << mul_bits) - 1)
    m -= (m >> (mul_bits - 1)) << mul_bits
    s = (b >> mul_bits) & ((1 << shift_bits) - 1)
    out = wrap_ref((a * m + (1 << s >> 1)) >> s, width)
    return max(out, 0) if (b >> (mul_bits + shift_bits)) & 1 else out


def wrap_ref(values: np.ndarray, width: int) -> np.ndarray:
    half = 1 << (width - 1)
    return (values + half) % (1 << width) - half


class ReferenceSim:
    """The spec, executed literally. Slow and simple on purpose."""

    def __init__(self, c: AcceleratorConfig):
        self.c = c
        self.inp = np.zeros((c.inp_rows, c.batch * c.block_in), np.int64)
        self.wgt = np.zeros((c.wgt_rows, c.block_out * c.block_in), np.int64)
        self.acc = np.zeros((c.acc_rows, c.batch * c.block_out), np.int64)
        self.out = np.zeros((c.acc_rows, c.batch * c.block_out), np.int64)
        self.uop = [(0, 0, 0)] * c.uop_rows

    def mem(self, mem_id: int) -> tuple[int, int, np.ndarray]:
        """(row bytes, element width, SRAM) of a memory id."""
        c, rb = self.c, row_bytes(self.c)
        return {
            MemId.INP: (rb[MemId.INP], c.inp_width, self.inp),
            MemId.WGT: (rb[MemId.WGT], c.wgt_width, self.wgt),
            MemId.ACC: (rb[MemId.ACC], c.acc_width, self.acc),
            MemId.ACC_NARROW: (rb[MemId.ACC_NARROW], c.out_width, self.acc),
            MemId.OUT: (rb[MemId.OUT], c.out_width, self.out),
        }[MemId(mem_id)]

    def load(self, dram: np.ndarray, r) -> None:
        x, y = int(r["x_size"]), int(r["y_size"])
        if x == 0:
            return
        base = int(r["sram_base"])
        if r["mem_id"] == MemId.UOP:
            rb = self.c.uop_bits // 8
            for row in range(y):
                start = (int(r["dram_base"]) + row * int(r["x_stride"])) * rb
                uops = decode_uops(self.c, dram[start:start + x * rb])
                for k, u in enumerate(uops):
                    self.uop[base + row * x + k] = (int(u["dst"]), int(u["src"]), int(u["wgt"]))
            return
        rb, width, sram = self.mem(r["mem_id"])
        y0, y1, x0, x1 = (int(r[k]) for k in ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1"))
        cols = x0 + x + x1
        for row in range(y0 + y + y1):
            for col in range(cols):
                target = base + row * cols + col
                if y0 <= row < y0 + y and x0 <= col < x0 + x:
                    start = (int(r["dram_base"]) + (row - y0) * int(r["x_stride"]) + col - x0) * rb
                    sram[target] = unpack_ref(dram[start:start + rb], width)
                else:
                    sram[target] = 0

    def store(self, dram: np.ndarray, r) -> None:
        rb, width, _ = self.mem(MemId.OUT)
        x = int(r["x_size"])
        for row in range(int(r["y_size"])):
            for col in range(x):
                start = (int(r["dram_base"]) + row * int(r["x_stride"]) + col) * rb
                dram[start:start + rb] = pack_ref(self.out[int(r["sram_base"]) + row * x + col], width)

    def executions(self, r):
        for i in range(int(r["iter_out"])):
            for j in range(int(r["iter_in"])):
                for k in range(int(r["uop_bgn"]), int(r["uop_end"])):
                    d, s, w = self.uop[k]
                    yield (d + i * int(r["dst_factor_out"]) + j * int(r["dst_factor_in"]),
                           s + i * int(r["src_factor_out"]) + j * int(r["src_factor_in"]),
                           w + i * int(r["wgt_factor_out"]) + j * int(r["wgt_factor_in"]))

    def gemm(self, r) -> None:
        c = self.c
        for d, s, w in self.executions(r):
            if r["reset"]:
                self.acc[d] = 0
            else:
                x = self.inp[s].reshape(c.batch, c.block_in)
                wt = self.wgt[w].reshape(c.block_out, c.block_in)
                base = 0 if r["overwrite"] else self.acc[d]
                self.acc[d] = wrap_ref(base + (x @ wt.T).reshape(-1), c.acc_width)
            self.narrow(d)

    def alu(self, r) -> None:
        width = self.c.acc_width
        for d, s, _ in self.executions(r):
            a = self.acc[d]
            if r["use_imm"]:
                b = np.full_like(a, int(r["imm"]))
            elif r["src_inp"]:  # lane o of a batch row reads inp lane o mod block_in
                c = self.c
                b = self.inp[s].reshape(c.batch, c.block_in)[:, np.arange(c.block_out) % c.block_in].reshape(-1)
            else:
                b = self.acc[s].copy()
            op = AluOp(int(r["alu_op"]))
            if op == AluOp.MIN:
                result = np.minimum(a, b)
            elif op == AluOp.MAX:
                result = np.maximum(a, b)
            elif op == AluOp.ADD:
                result = wrap_ref(a + b, width)
            elif op == AluOp.MUL:
                result = wrap_ref(a * b, width)
            elif op == AluOp.MOV:
                result = b.copy()
            elif op == AluOp.RQ:
                result = np.array([_rq(int(x), int(y), width) for x, y in zip(a, b, strict=True)])
            else:
                bits = width.bit_length()
                amount = b & ((1 << bits) - 1)
                amount = np.where(amount >= 1 << (bits - 1), amount - (1 << bits), amount)
                left = wrap_ref(a << np.maximum(-amount, 0), width)
                result = np.where(amount >= 0, a >> np.maximum(amount, 0), left)
            self.acc[d] = result
            self.narrow(d)

    def narrow(self, d: int) -> None:
        top = (1 << (self.c.out_width - 1)) - 1
        self.out[d] = np.clip(self.acc[d], -top - 1, top)

    def run(self, dram: np.ndarray, insns: np.ndarray) -> None:
        c = self.c
        queues = [0] * len(QUEUES)
        flags = FLAG_QUEUE  # unit -> flag -> queue

        def unit(r) -> int:
            return int(unit_of(int(r["opcode"]), int(r["mem_id"])))

        streams = [[r for r in insns if unit(r) == u] for u in range(3)]
        pos = [0, 0, 0]
        while True:
            progressed = False
            for u in range(3):
                if pos[u] == len(streams[u]):
                    continue
                r = streams[u][pos[u]]
                pops = [q for f, q in flags[u].items() if f.startswith("pop") and r[f]]
                pushes = [q for f, q in flags[u].items() if f.startswith("push") and r[f]]
                if any(queues[q] == 0 for q in pops) or any(queues[q] >= c.token_queue_depth for q in pushes):
                    continue
                for q in pops:
                    queues[q] -= 1
                op = int(r["opcode"])
                if op == Opcode.FINISH:
                    assert pos[0] == len(streams[0]) and pos[2] == len(streams[2])
                    return
                if op == Opcode.LOAD:
                    self.load(dram, r)
                elif op == Opcode.STORE:
                    if r["x_size"]:
                        self.store(dram, r)
                elif op == Opcode.GEMM:
                    self.gemm(r)
                else:
                    self.alu(r)
                for q in pushes:
                    queues[q] += 1
                pos[u] += 1
                progressed = True
            assert progressed, "reference deadlock"


@pytest.mark.parametrize("name", PRESET_NAMES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_programs_match_reference(name, seed):
    c = PRESETS[name]
    insns, dram = random_program(c, seed, n_insns=60)
    addr = insn_region(dram.size, len(insns))
    dram.write(addr, encode_insns(c, insns))
    image = dram.data.copy()
    sim = FunctionalSimulator(c)
    stats = sim.run(dram, addr, len(insns))
    assert not any(stats["tokens_left"].values())

    ref = ReferenceSim(c)
    ref.run(image, insns)
    assert np.array_equal(sim.acc, ref.acc)
    assert np.array_equal(sim.out, ref.out)
    assert np.array_equal(sim.inp, ref.inp) and np.array_equal(sim.wgt, ref.wgt)
    assert np.array_equal(dram.data, image)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_insns=st.integers(5, 150), prefetch=st.sampled_from([0, 1, None]))
def test_random_programs_run_on_every_preset(seed, n_insns, prefetch):
    for name in PRESET_NAMES:
        c = PRESETS[name]
        insns, dram = random_program(c, seed, n_insns=n_insns, prefetch=prefetch)
        assert len(insns) >= min(n_insns, 8)
        addr = insn_region(dram.size, len(insns))
        dram.write(addr, encode_insns(c, insns))
        stats = FunctionalSimulator(c).run(dram, addr, len(insns))
        assert stats["insns"]["finish"] == 1


def test_random_program_is_deterministic_and_varied():
    c = PRESETS["rect"]
    a_insns, a_dram = random_program(c, 42, n_insns=100)
    b_insns, b_dram = random_program(c, 42, n_insns=100)
    assert np.array_equal(a_insns, b_insns) and np.array_equal(a_dram.data, b_dram.data)
    c_insns, _ = random_program(c, 43, n_insns=100)
    assert not np.array_equal(a_insns, c_insns)

    insns = np.concatenate([random_program(c, seed, n_insns=200)[0] for seed in range(4)])
    op, mem = insns["opcode"], insns["mem_id"]
    loads = op == Opcode.LOAD
    for m in MemId:
        if m != MemId.OUT:
            assert np.any(loads & (mem == m) & (insns["x_size"] > 0)), m
    alu = insns[op == Opcode.ALU]
    assert set(alu["alu_op"].tolist()) == {int(a) for a in AluOp}
    assert set(alu["use_imm"].tolist()) == {0, 1}
    assert set(alu["src_inp"].tolist()) == {0, 1}  # operands from inp
    assert np.any((op == Opcode.ALU) & (insns["beside"] == 1))  # ALU ops beside a running GEMM, and the converse
    assert np.any((op == Opcode.GEMM) & (insns["beside"] == 1)) or not layout_of(c).formats["gemm"].has("beside")
    assert set(insns[op == Opcode.GEMM]["reset"].tolist()) == {0, 1}
    padded = insns["y_pad_0"] + insns["y_pad_1"] + insns["x_pad_0"] + insns["x_pad_1"] > 0
    assert np.any(padded & loads & (mem == MemId.INP)) and np.any(padded & loads & (mem == MemId.ACC))
    assert np.any((insns["x_stride"] < insns["x_size"]) & (insns["y_size"] > 1))  # overlapping rows
    assert np.any((op != Opcode.FINISH) & (insns["x_size"] == 0) & (op != Opcode.GEMM) & (op != Opcode.ALU))
