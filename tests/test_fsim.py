"""Functional simulator semantics: GEMM, ALU, DMA (padding, strides, narrowing), token overlap, stats.

References here are written independently of the simulator: bit packing through np.packbits, GEMM as an
int32 matmul, ALU ops element by element with Python integers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from weft.config import PRESETS, AcceleratorConfig
from weft.isa import AluOp, Opcode, ProgramBuilder, arith, encode_insns, encode_uops, uops_from
from weft.isa.arith import pack, unpack, wrap
from weft.isa.semantics import first_hazard, hazard_reach
from weft.sim.bench import bench_fsim, conv_workload
from weft.sim.fsim import Dram, FunctionalSimulator, SimError, insn_region, run_program

ACC16 = AcceleratorConfig(name="acc16", acc_width=16)
OUT4 = AcceleratorConfig(name="out4", out_width=4)


# ---- independent helpers ---------------------------------------------------------------------------


def pack_ref(values: np.ndarray, width: int) -> bytes:
    """Little-endian bit packing of signed integers (row-major), element j at bits [j*w, (j+1)*w)."""
    flat = np.asarray(values, dtype=np.int64).reshape(-1) & ((1 << width) - 1)
    bits = ((flat[:, None] >> np.arange(width)) & 1).astype(np.uint8).reshape(-1)
    return np.packbits(bits, bitorder="little").tobytes()


def unpack_ref(data: np.ndarray, width: int, count: int) -> np.ndarray:
    bits = np.unpackbits(np.asarray(data, dtype=np.uint8), bitorder="little")[: count * width]
    values = bits.reshape(count, width).astype(np.int64) @ (1 << np.arange(width, dtype=np.int64))
    return np.where(values >= 1 << (width - 1), values - (1 << width), values)


def wrap_ref(value: int, width: int) -> int:
    half = 1 << (width - 1)
    return (value + half) % (1 << width) - half


def alu_ref(op: int, a: int, b: int, width: int) -> int:
    """One ALU element: the spec's semantics with Python integers."""
    if op == AluOp.MIN:
        return min(a, b)
    if op == AluOp.MAX:
        return max(a, b)
    if op == AluOp.ADD:
        return wrap_ref(a + b, width)
    if op == AluOp.MUL:
        return wrap_ref(a * b, width)
    if op == AluOp.MOV:
        return b
    if op == AluOp.RQ:  # b: multiplier (width/2 + 2 bits, signed), shift (log2(width) + 1 bits), ReLU bit
        mul_bits, shift_bits = width // 2 + 2, width.bit_length()
        m = b & ((1 << mul_bits) - 1)
        m -= (m >> (mul_bits - 1)) << mul_bits
        s = (b >> mul_bits) & ((1 << shift_bits) - 1)
        out = wrap_ref((a * m + (1 << s >> 1)) >> s, width)  # Python ints: exact
        return max(out, 0) if (b >> (mul_bits + shift_bits)) & 1 else out
    bits = width.bit_length()  # log2(width) + 1
    amount = b & ((1 << bits) - 1)
    if amount >= 1 << (bits - 1):
        amount -= 1 << bits
    return a >> amount if amount >= 0 else wrap_ref(a << -amount, width)


def row_bytes(c: AcceleratorConfig, mem: str) -> int:
    bits = {"uop": c.uop_bits, "inp": c.inp_row_bits, "wgt": c.wgt_row_bits, "acc": c.acc_row_bits,
            "out": c.out_row_bits, "acc_narrow": c.out_row_bits}[mem]
    return bits // 8


class Harness:
    """A DRAM image, a program being built, and a run of both."""

    def __init__(self, config: AcceleratorConfig, size: int = 1 << 20):
        self.c = config
        self.dram = Dram(size)
        self.p = ProgramBuilder()

    def put(self, mem: str, rows: np.ndarray, width: int) -> int:
        """Write rows of integers packed at `width` bits; returns the element address for `mem`."""
        data = pack_ref(rows, width)
        rb = row_bytes(self.c, mem)
        addr = self.dram.alloc(len(data), align=max(64, rb))
        self.dram.write(addr, data)
        return addr // rb

    def put_uops(self, triples: list[tuple[int, int, int]]) -> int:
        data = encode_uops(self.c, uops_from(triples))
        addr = self.dram.alloc(len(data), align=64)
        self.dram.write(addr, data)
        return addr // row_bytes(self.c, "uop")

    def reserve(self, mem: str, count: int) -> int:
        rb = row_bytes(self.c, mem)
        return self.dram.alloc(count * rb, align=max(64, rb)) // rb

    def read(self, mem: str, element: int, count: int, width: int, elems: int) -> np.ndarray:
        rb = row_bytes(self.c, mem)
        data = self.dram.read(element * rb, count * rb)
        return unpack_ref(data, width, count * elems).reshape(count, elems)

    def run(self, **options) -> tuple[FunctionalSimulator, dict]:
        if not len(self.p) or self.p.insns[-1]["opcode"] != 3:
            self.p.finish()
        insns = self.p.insns
        addr = insn_region(self.dram.size, len(insns))
        self.dram.write(addr, encode_insns(self.c, insns))
        sim = FunctionalSimulator(self.c, **options)
        return sim, sim.run(self.dram, addr, len(insns))


def rand(rng: np.random.Generator, width: int, shape) -> np.ndarray:
    return rng.integers(-(1 << (width - 1)), 1 << (width - 1), shape)


# ---- bit packing ---------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(width=st.sampled_from([2, 4, 8, 16, 32]), rows=st.integers(1, 4),
       bytes_per_row=st.sampled_from([4, 8]), seed=st.integers(0, 2**32 - 1))
def test_pack_unpack_match_packbits(width, rows, bytes_per_row, seed):
    count = bytes_per_row * 8 // width
    values = rand(np.random.default_rng(seed), width, (rows, count))
    packed = pack(values, width)
    assert packed.tobytes() == pack_ref(values, width)
    assert np.array_equal(unpack(packed, width), values)
    big = values.astype(np.int64) * 12345 + 7
    wrapped = [int(v) for v in wrap(big, width).reshape(-1)]
    assert wrapped == [wrap_ref(int(v), width) for v in big.reshape(-1)]


# ---- GEMM ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "tiny", "rect", "zcu104", "int4w"])
def test_gemm_equals_int32_matmul(name):
    c = PRESETS[name]
    rng = np.random.default_rng(1)
    m, kb, nb = 3, 2, 2
    a = rand(rng, c.inp_width, (m, kb, c.batch, c.block_in))
    w = rand(rng, c.wgt_width, (nb, kb, c.block_out, c.block_in))
    h = Harness(c)
    inp = h.put("inp", a.reshape(m * kb, -1), c.inp_width)
    wgt = h.put("wgt", w.reshape(nb * kb, -1), c.wgt_width)
    uops = h.put_uops([(mi * nb + ni, mi * kb, ni * kb) for mi in range(m) for ni in range(nb)])
    out = h.reserve("out", m * nb)
    h.p.load("uop", 0, uops, 1, m * nb)
    h.p.load("inp", 0, inp, 1, m * kb)
    h.p.load("wgt", 0, wgt, 1, nb * kb, deps=["push_next"])
    h.p.gemm(0, m * nb, reset=True, deps=["pop_prev"])
    h.p.gemm(0, m * nb, iter_out=kb, src=(1, 0), wgt=(1, 0), deps=["push_next"])
    h.p.store(0, out, 1, m * nb, deps=["pop_prev", "push_prev"])
    h.p.load("uop", 0, 0, 0, 0, deps=["pop_next"])
    sim, stats = h.run()

    lhs = a.transpose(0, 2, 1, 3).reshape(m * c.batch, kb * c.block_in).astype(np.int32)
    rhs = w.transpose(0, 2, 1, 3).reshape(nb * c.block_out, kb * c.block_in).astype(np.int32)
    product = (lhs @ rhs.T).reshape(m, c.batch, nb, c.block_out).transpose(0, 2, 1, 3)
    expected = product.reshape(m * nb, c.batch * c.block_out)
    assert np.array_equal(sim.acc[: m * nb], expected)
    lo, hi = -(1 << (c.out_width - 1)), (1 << (c.out_width - 1)) - 1
    assert np.array_equal(sim.out[: m * nb], np.clip(expected, lo, hi))
    stored = h.read("out", out, m * nb, c.out_width, c.batch * c.block_out)
    assert np.array_equal(stored, np.clip(expected, lo, hi))
    assert stats["macs"] == m * nb * kb * c.batch * c.block_in * c.block_out
    assert stats["gemm_execs"] == m * nb * (kb + 1)


@pytest.mark.parametrize("name", ["default", "rect"])
def test_gemm_overwrite_writes_the_products_and_a_repeated_row_keeps_the_last(name):
    c = PRESETS[name]
    rng = np.random.default_rng(4)
    m, kb = 3, 2
    a = rand(rng, c.inp_width, (m * kb, c.batch * c.block_in))
    w = rand(rng, c.wgt_width, (kb, c.block_out * c.block_in))
    h = Harness(c)
    inp, wgt = h.put("inp", a, c.inp_width), h.put("wgt", w, c.wgt_width)
    acc0 = rng.integers(-1000, 1000, (m, c.batch * c.block_out))
    uops = h.put_uops([(mi, mi * kb, 0) for mi in range(m)])
    h.p.load("uop", 0, uops, 1, m)
    h.p.load("acc", 0, h.put("acc", acc0, c.acc_width), 1, m)
    h.p.load("inp", 0, inp, 1, m * kb)
    h.p.load("wgt", 0, wgt, 1, kb, deps=["push_next"])
    # each row is written kb times (k = 0, 1), overwriting: the last, k = kb - 1, is what stays
    h.p.gemm(0, m, iter_out=kb, src=(1, 0), wgt=(1, 0), overwrite=True, deps=["pop_prev"])
    h.p.finish()
    sim, stats = h.run()
    for mi in range(m):
        x = a[mi * kb + kb - 1].reshape(c.batch, c.block_in).astype(np.int64)
        wt = w[kb - 1].reshape(c.block_out, c.block_in).astype(np.int64)
        assert np.array_equal(sim.acc[mi], (x @ wt.T).reshape(-1)), mi
    assert stats["macs"] == m * kb * c.macs_per_cycle  # every execution runs, as on the hardware


@pytest.mark.parametrize("name", ["tiny", "default", "rect"])
def test_alu_operand_from_inp_is_sign_extended_lane_by_lane(name):
    """ALU MAX and MOV with src_inp: lane o of each batch row takes inp lane o mod block_in, sign-extended;
    the acc rows named like the inp rows are not read (no read-after-write hazard either)."""
    c = PRESETS[name]
    rng = np.random.default_rng(5)
    m = 4
    a = rand(rng, c.inp_width, (m, c.batch * c.block_in))
    acc0 = rng.integers(-200, 200, (2 * m, c.batch * c.block_out))
    h = Harness(c)
    uops = h.put_uops([(mi, mi, 0) for mi in range(m)] + [(m + mi, mi, 0) for mi in range(m)])
    h.p.load("uop", 0, uops, 1, 2 * m)
    h.p.load("acc", 0, h.put("acc", acc0, c.acc_width), 1, 2 * m)
    h.p.load("inp", 0, h.put("inp", a, c.inp_width), 1, m, deps=["push_next"])
    h.p.alu("max", 0, m, src_inp=True, deps=["pop_prev"])
    h.p.alu("mov", m, 2 * m, src_inp=True)
    h.p.finish()
    sim, _ = h.run()
    lanes = a.reshape(m, c.batch, c.block_in)[:, :, np.arange(c.block_out) % c.block_in].reshape(m, -1)
    assert np.array_equal(sim.acc[:m], np.maximum(acc0[:m], lanes))
    assert np.array_equal(sim.acc[m:2 * m], lanes)


@pytest.mark.parametrize("other_half", [True, False])
def test_an_alu_beside_a_gemm_must_work_on_the_other_half(other_half):
    """Spec "beside": the ALU instruction that may start while the GEMM before it runs touches only the other
    half of the accumulator; on the same half it is an error naming both instructions."""
    c = PRESETS["default"]
    half = c.acc_rows // 2
    h = Harness(c)
    rows = [(k, 0, 0) for k in range(4)]
    uops = h.put_uops(rows + [((half if other_half else 0) + 8 + k, 0, 0) for k in range(4)])
    h.p.load("uop", 0, uops, 1, 8)
    h.p.gemm(0, 4, reset=True)
    h.p.alu("add", 4, 8, imm=3, beside=True)
    if other_half:
        sim, _ = h.run()
        assert np.all(sim.acc[half + 8:half + 12] == 3)
    else:
        with pytest.raises(SimError, match=r"instruction 2 .*runs beside instruction 1, but both touch acc rows "
                                           r"in the lower half"):
            h.run()


def gemm_reference(acc: np.ndarray, inp: np.ndarray, wgt: np.ndarray, dst, src, wsel, c) -> np.ndarray:
    acc = acc.astype(np.int64)
    for d, s, g in zip(dst, src, wsel, strict=True):
        x = inp[s].reshape(c.batch, c.block_in).astype(np.int64)
        w = wgt[g].reshape(c.block_out, c.block_in).astype(np.int64)
        acc[d] = [wrap_ref(int(v), c.acc_width) for v in acc[d] + (x @ w.T).reshape(-1)]
    return acc


def _gemm_case(shape: str, rng: np.random.Generator) -> tuple[list[tuple[int, int, int]], dict]:
    """Micro-ops and loops that steer the GEMM kernel down each of its paths."""
    if shape == "small":  # a few executions: one batched matmul
        return [(0, 1, 2), (1, 3, 4)], {"iter_out": 2, "dst": (2, 0), "src": (1, 0), "wgt": (1, 0)}
    if shape == "conv":  # same count per row, a few weight sequences: im2col by weight
        uops = [(x, kh * 10 + x + kw, kh * 3 + kw) for kh in range(3) for kw in range(3) for x in range(8)]
        return uops, {"iter_out": 2, "iter_in": 3, "dst": (1, 16), "src": (0, 10), "wgt": (9, 0)}
    if shape == "fc":  # one input sequence shared by every row: im2col by input
        uops = [(o, 40 + k, o * 4 + k) for k in range(4) for o in range(24)]
        return uops, {"iter_out": 1}
    if shape == "fc_long":  # 100 terms per row: sums beyond float32, im2col in float64
        return [(o, k, o * 4 + k % 4) for k in range(100) for o in range(3)], {"iter_out": 1}
    # Uneven executions per row (no im2col); few weights or few inputs: grouped matmuls.
    dst = rng.integers(0, 20, 30)
    few, many = rng.integers(0, 3, 30), rng.integers(0, 60, 30)
    if shape.endswith("even"):  # every weight (or input) row equally often; no row written twice in a row
        dst, few = np.arange(30) * 7 % 20, np.arange(30) % 3
    if shape.startswith("by_wgt"):
        triples = list(zip(dst.tolist(), many.tolist(), few.tolist(), strict=True))
        return triples, {"iter_out": 3, "dst": (0, 0), "src": (1, 0), "wgt": (3, 0)}
    if shape.startswith("by_src"):
        triples = list(zip(dst.tolist(), few.tolist(), many.tolist(), strict=True))
        return triples, {"iter_out": 3, "dst": (0, 0), "src": (3, 0), "wgt": (1, 0)}
    # "scattered": nothing shared: chunked batched matmuls of gathered tiles
    uops = [(int(d), int(s), int(g)) for d, s, g in zip(
        rng.permutation(100), rng.integers(0, 120, 100), rng.integers(0, 100, 100), strict=True)]
    return uops, {"iter_out": 1}


@pytest.mark.parametrize("shape", ["small", "conv", "fc", "fc_long", "by_wgt", "by_wgt_even", "by_src",
                                   "by_src_even", "scattered"])
@pytest.mark.parametrize("force_int64", [False, True])
def test_gemm_kernel_paths_match_reference(shape, force_int64, monkeypatch):
    c = PRESETS["rect"]
    rng = np.random.default_rng(7)
    triples, loops = _gemm_case(shape, rng)
    if shape in ("by_wgt", "by_src"):  # repeated rows: reject back-to-back writes to one row
        triples = [t for k, t in enumerate(triples) if k == 0 or t[0] != triples[k - 1][0]]
    inp_vals = rand(rng, c.inp_width, (128, c.batch * c.block_in))
    wgt_vals = rand(rng, c.wgt_width, (128, c.block_out * c.block_in))
    acc_vals = rand(rng, c.acc_width, (128, c.batch * c.block_out))
    h = Harness(c)
    h.p.load("uop", 0, h.put_uops(triples), 1, len(triples))
    h.p.load("acc", 0, h.put("acc", acc_vals, c.acc_width), 1, 128)
    h.p.load("inp", 0, h.put("inp", inp_vals, c.inp_width), 1, 128)
    h.p.load("wgt", 0, h.put("wgt", wgt_vals, c.wgt_width), 1, 128, deps=["push_next"])
    h.p.gemm(0, len(triples), deps=["pop_prev"], **loops)
    if force_int64:  # pretend float64 sums could round: the kernel must fall back to int64 add.at
        monkeypatch.setattr(arith, "F64_EXACT", 0)
    sim, _ = h.run()

    from weft.isa.arith import loop_indices

    uops = np.array(triples)
    args = (loops.get("iter_out", 1), loops.get("iter_in", 1))
    dst = loop_indices(uops[:, 0], *args, *loops.get("dst", (0, 0)))
    src = loop_indices(uops[:, 1], *args, *loops.get("src", (0, 0)))
    wsel = loop_indices(uops[:, 2], *args, *loops.get("wgt", (0, 0)))
    expected = gemm_reference(acc_vals, inp_vals, wgt_vals, dst, src, wsel, c)
    assert np.array_equal(sim.acc[:128], expected)


def test_gemm_16_bit_inputs_use_exact_float64():
    c = AcceleratorConfig(name="wide", inp_width=16, wgt_width=16, block_in=64, wgt_buff_bytes=1 << 19)
    rng = np.random.default_rng(9)
    a = rand(rng, 16, (4, c.block_in))
    w = rand(rng, 16, (3, c.block_out * c.block_in))
    a[0] = -(1 << 15)  # the largest products
    w[0] = -(1 << 15)
    h = Harness(c)
    h.p.load("uop", 0, h.put_uops([(r * 3 + g, r, g) for r in range(4) for g in range(3)]), 1, 12)
    h.p.load("inp", 0, h.put("inp", a, 16), 1, 4)
    h.p.load("wgt", 0, h.put("wgt", w, 16), 1, 3, deps=["push_next"])
    h.p.gemm(0, 12, iter_out=2, deps=["pop_prev"])  # each row twice: sums reach 2^37, wrap at 32 bits
    sim, _ = h.run()
    wgt = w.reshape(3, c.block_out, c.block_in).astype(object)
    product = (a.astype(object)[:, None, None, :] * wgt[None]).sum(axis=-1)  # (4, 3, block_out), exact
    expected = np.array([[wrap_ref(2 * int(v), 32) for v in product[r, g]]
                         for r in range(4) for g in range(3)])
    assert np.array_equal(sim.acc[:12], expected)


def test_gemm_accumulator_wraps_at_acc_width():
    c = ACC16
    h = Harness(c)
    ones = np.full((1, c.block_in), 127)
    h.p.load("uop", 0, h.put_uops([(0, 0, 0), (1, 0, 0)]), 1, 2)
    h.p.load("inp", 0, h.put("inp", ones, 8), 1, 1)
    h.p.load("wgt", 0, h.put("wgt", np.full((1, c.block_out * c.block_in), 127), 8), 1, 1, deps=["push_next"])
    h.p.gemm(0, 2, iter_out=5, deps=["pop_prev"])
    sim, _ = h.run()
    total = 5 * c.block_in * 127 * 127
    assert np.all(sim.acc[:2] == wrap_ref(total, 16))
    assert np.all(sim.out[:2] == np.clip(wrap_ref(total, 16), -128, 127))


# ---- ALU ---------------------------------------------------------------------------------------------------


def _special(rng: np.random.Generator, width: int, shape) -> np.ndarray:
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    values = rand(rng, width, shape)
    picks = np.array([lo, hi, -1, 0, 1, 2, 31, 32, 33, -32, -33, 255, -129, 64, 15, 16, -16, -17])
    mask = rng.random(shape) < 0.5
    values[mask] = rng.choice(picks, int(mask.sum()))
    return values


@settings(max_examples=60, deadline=None)
@given(op=st.sampled_from(list(AluOp)), use_imm=st.booleans(), imm=st.integers(-(1 << 15), (1 << 15) - 1),
       seed=st.integers(0, 2**32 - 1), acc16=st.booleans())
def test_alu_op_matches_reference(op, use_imm, imm, seed, acc16):
    c = ACC16 if acc16 else PRESETS["default"]
    rng = np.random.default_rng(seed)
    if rng.random() < 0.5:
        imm = int(rng.integers(-40, 40))  # shift amounts near the interesting range
    rows, elems = 6, c.batch * c.block_out
    acc_vals = _special(rng, c.acc_width, (2 * rows, elems))
    h = Harness(c)
    h.p.load("uop", 0, h.put_uops([(0, rows, 0)]), 1, 1)
    h.p.load("acc", 0, h.put("acc", acc_vals, c.acc_width), 1, 2 * rows)
    h.p.alu(op, 0, 1, iter_out=rows, dst=(1, 0), src=(1, 0), imm=imm if use_imm else None)
    sim, stats = h.run()

    expected = acc_vals.copy()
    for r in range(rows):
        for e in range(elems):
            b = imm if use_imm else int(acc_vals[rows + r, e])
            expected[r, e] = alu_ref(op, int(acc_vals[r, e]), b, c.acc_width)
    assert np.array_equal(sim.acc[: 2 * rows], expected)
    assert np.array_equal(sim.out[:rows], np.clip(expected[:rows], -128, 127))
    assert stats["alu_ops"] == rows * elems


def test_shr_negative_amount_shifts_left_and_wraps():
    c = PRESETS["default"]
    h = Harness(c)
    h.p.load("uop", 0, h.put_uops([(0, 0, 0)]), 1, 1)
    h.p.load("acc", 0, h.put("acc", np.full((1, 16), 3), 32), 1, 1)
    h.p.alu("shr", 0, 1, imm=-31)  # 3 << 31 wraps to -2^31
    sim, _ = h.run()
    assert np.all(sim.acc[0] == -(1 << 31))
    assert np.all(sim.out[0] == -128)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(op=st.sampled_from(list(AluOp)), use_imm=st.booleans(), imm=st.integers(-40, 40),
       triples=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=6),
       iters=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       factors=st.tuples(st.integers(0, 2), st.integers(0, 2)), seed=st.integers(0, 2**32 - 1))
def test_alu_repeated_and_overlapping_rows_follow_program_order(op, use_imm, imm, triples, iters, factors,
                                                                seed):
    """Destinations that repeat and sources that other executions write: still sequential semantics."""
    from weft.isa.arith import loop_indices

    c = PRESETS["tiny"]
    uops = np.array([(d, s, 0) for d, s in triples])
    dst = loop_indices(uops[:, 0], *iters, *factors)
    src = loop_indices(uops[:, 1], *iters, factors[1], factors[0])
    assume(first_hazard(dst, None if use_imm else src, hazard_reach(Opcode.ALU, op)) is None)
    rng = np.random.default_rng(seed)
    acc_vals = rng.integers(-1000, 1000, (16, c.batch * c.block_out))
    acc_vals[rng.random(acc_vals.shape) < 0.2] = 7  # small shift amounts when acc rows are operands
    h = Harness(c)
    h.p.load("uop", 0, h.put_uops([tuple(int(v) for v in t) for t in uops]), 1, len(uops))
    h.p.load("acc", 0, h.put("acc", acc_vals, c.acc_width), 1, 16)
    h.p.alu(op, 0, len(uops), iter_out=iters[0], iter_in=iters[1], dst=factors, src=(factors[1], factors[0]),
            imm=imm if use_imm else None)
    sim, _ = h.run()

    expected = [[int(v) for v in row] for row in acc_vals]
    for d, s in zip(dst.tolist(), src.tolist(), strict=True):
        operand = [imm] * len(expected[d]) if use_imm else list(expected[s])
        expected[d] = [alu_ref(op, a, b, c.acc_width) for a, b in zip(expected[d], operand, strict=True)]
    assert np.array_equal(sim.acc[:16], np.array(expected))


def test_alu_ufunc_at_path_for_many_repeats():
    """Global pooling shape: sources folded into two rows (four for the ops whose hazard reaches three
    executions back), repeats > 1, constant operands."""
    c = PRESETS["default"]
    rng = np.random.default_rng(3)
    acc_vals = rng.integers(-(1 << 31), (1 << 31) - 1, (32, 16))
    for op in AluOp:
        rows = ((0, 1), (20, 2), (23, 3), (30, 5))[:hazard_reach(Opcode.ALU, op) + 1]
        h = Harness(c)
        h.p.load("uop", 0, h.put_uops([(d, s, 0) for d, s in rows]), 1, len(rows))
        h.p.load("acc", 0, h.put("acc", acc_vals, 32), 1, 32)
        h.p.alu(op, 0, len(rows), iter_out=6, src=(len(rows), 0))
        sim, _ = h.run()
        expected = [[int(v) for v in row] for row in acc_vals]
        for i in range(6):
            for d, s in rows:
                s += len(rows) * i
                expected[d] = [alu_ref(op, a, b, 32) for a, b in zip(expected[d], expected[s], strict=True)]
        assert np.array_equal(sim.acc[:32], np.array(expected)), op


# ---- DMA ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "rect", "int4w"])
def test_load_inp_padding_and_stride(name):
    c = PRESETS[name]
    rng = np.random.default_rng(4)
    elems = c.batch * c.block_in
    image = rand(rng, c.inp_width, (40, elems))
    h = Harness(c)
    base = h.put("inp", image, c.inp_width)
    y, x, stride, (y0, y1, x0, x1) = 3, 2, 5, (1, 2, 1, 3)
    h.p.load("inp", 7, base + 4, y, x, stride=stride, pad=(y0, y1, x0, x1), deps=["push_next"])
    h.p.load("uop", 0, 0, 0, 0, deps=["pop_prev"])
    sim, stats = h.run()
    tile = np.zeros((y0 + y + y1, x0 + x + x1, elems), dtype=np.int64)
    for r in range(y):
        tile[y0 + r, x0:x0 + x] = image[4 + r * stride: 4 + r * stride + x]
    assert np.array_equal(sim.inp[7:7 + tile.shape[0] * tile.shape[1]], tile.reshape(-1, elems))
    assert not sim.inp[:7].any()
    assert stats["bytes"]["inp"] == y * x * row_bytes(c, "inp")


def test_load_wgt_int4_and_uop_2d():
    c = PRESETS["int4w"]
    rng = np.random.default_rng(5)
    w = rand(rng, 4, (6, c.block_out * c.block_in))
    h = Harness(c)
    base = h.put("wgt", w, 4)
    triples = [(i, 2 * i, 3 * i) for i in range(8)]
    ubase = h.put_uops(triples)
    h.p.load("wgt", 2, base, 2, 2, stride=3, deps=["push_next"])  # rows 0,1 and 3,4
    h.p.load("uop", 5, ubase, 2, 3, stride=4, deps=["pop_prev"])  # uops 0..2 and 4..6
    sim, _ = h.run()
    assert np.array_equal(sim.wgt[2:6], w[[0, 1, 3, 4]])
    got = sim.uop[5:11]
    assert [tuple(int(v) for v in u) for u in got] == [triples[k] for k in (0, 1, 2, 4, 5, 6)]


@pytest.mark.parametrize("mem", ["acc", "acc_narrow"])
def test_load_acc_and_acc_narrow_sign_extend_with_padding(mem):
    c = PRESETS["rect"]
    rng = np.random.default_rng(6)
    width = c.acc_width if mem == "acc" else c.out_width
    vals = rand(rng, width, (8, c.batch * c.block_out))
    h = Harness(c)
    base = h.put(mem, vals, width)
    h.p.load(mem, 3, base + 1, 2, 3, stride=4, pad=(0, 1, 2, 0))
    sim, stats = h.run()
    tile = np.zeros((3, 5, c.batch * c.block_out), dtype=np.int64)
    tile[0, 2:] = vals[1:4]
    tile[1, 2:] = vals[5:8]
    assert np.array_equal(sim.acc[3:18], tile.reshape(15, -1))
    assert stats["bytes"][mem] == 6 * row_bytes(c, mem)
    assert not sim.out.any()  # loads write the accumulator only


@pytest.mark.parametrize("stride", [5, 1, 0])
def test_store_strides_and_overlapping_rows(stride):
    c = PRESETS["tiny"]
    rng = np.random.default_rng(8)
    vals = rng.integers(-100, 100, (6, 4))
    h = Harness(c)
    h.p.load("acc", 0, h.put("acc", vals, 32), 1, 6)
    h.p.load("uop", 0, h.put_uops([(0, 0, 0)]), 1, 1)
    h.p.alu("add", 0, 1, iter_out=6, dst=(1, 0), imm=0, deps=["push_next"])  # acc -> out
    out = h.reserve("out", 32)
    h.p.store(0, out, 3, 2, stride=stride, deps=["pop_prev", "push_prev"])
    h.p.load("uop", 0, 0, 0, 0, deps=["pop_next"])
    h.run()
    expected = np.zeros((32, 4), dtype=np.int64)
    for r in range(3):  # rows are written in order: later rows win where they overlap
        expected[r * stride: r * stride + 2] = vals[2 * r: 2 * r + 2]
    assert np.array_equal(h.read("out", out, 32, 8, 4), expected)


@pytest.mark.parametrize("config", [PRESETS["default"], OUT4], ids=["out8", "out4"])
def test_narrowing_saturates(config):
    c = config
    top = (1 << (c.out_width - 1)) - 1
    vals = np.array([[top + 1, -top - 2, 1 << 30, -(1 << 31), top, -top - 1, 0, -1] * (c.block_out // 8)])
    h = Harness(c)
    h.p.load("acc", 0, h.put("acc", vals, 32), 1, 1)
    h.p.load("uop", 0, h.put_uops([(0, 0, 0)]), 1, 1)
    h.p.alu("max", 0, 1, imm=-(1 << 15), deps=["push_next"])
    out = h.reserve("out", 1)
    h.p.store(0, out, 1, 1, deps=["pop_prev", "push_prev"])
    h.p.load("uop", 0, 0, 0, 0, deps=["pop_next"])
    sim, _ = h.run()
    expected = np.clip(vals, -top - 1, top)
    assert np.array_equal(sim.out[:1], expected)
    assert np.array_equal(h.read("out", out, 1, c.out_width, c.block_out), expected)


# ---- tokens and overlap -----------------------------------------------------------------------------------


def test_double_buffered_conv_matches_serialized_and_numpy():
    c = PRESETS["default"]
    results = {}
    for buffers in (2, 1):
        work = conv_workload(c, size=28, channels=32, buffers=buffers)
        stats = run_program(c, work.dram, work.insns, work.insn_addr)
        assert work.output() == work.expected
        results[buffers] = (work.output(), stats)
    assert results[2][0] == results[1][0]
    double, serial = results[2][1], results[1][1]
    # Double buffering lets compute run two tiles ahead of store; serialized, never more than one.
    assert double["max_tokens"]["g2s"] == 2 and serial["max_tokens"]["g2s"] == 1
    assert not any(double["tokens_left"].values()) and not any(serial["tokens_left"].values())


def test_stats_count_kinds_bytes_and_work():
    c = PRESETS["default"]
    h = Harness(c)
    h.p.load("uop", 0, h.put_uops([(0, 0, 0), (1, 1, 1)]), 1, 2)
    h.p.load("inp", 0, h.put("inp", np.ones((2, 16)), 8), 1, 2)
    h.p.load("inp", 0, 0, 0, 0)  # no-op
    h.p.load("wgt", 0, h.put("wgt", np.ones((2, 256)), 8), 1, 2, deps=["push_next"])
    h.p.gemm(0, 2, reset=True, deps=["pop_prev"])
    h.p.gemm(0, 2, iter_out=3)
    h.p.alu("add", 0, 2, iter_in=2, dst=(0, 4), imm=1, deps=["push_next"])
    h.p.store(0, h.reserve("out", 2), 1, 2, deps=["pop_prev", "push_prev"])
    h.p.load("uop", 0, 0, 0, 0, deps=["pop_next"])
    _, stats = h.run()
    assert stats["insns"] == {"load_inp": 1, "load_wgt": 1, "load_uop": 1, "load_acc": 0,
                              "load_acc_narrow": 0, "store": 1, "gemm": 2, "alu": 1, "finish": 1, "nop": 2}
    assert stats["bytes"] == {"uop": 8, "wgt": 512, "inp": 32, "acc": 0, "acc_narrow": 0, "out": 32}
    assert stats["macs"] == 6 * 256 and stats["gemm_execs"] == 8
    assert stats["alu_execs"] == 4 and stats["alu_ops"] == 64
    assert stats["cycles"] is None
    assert stats["tokens"] == {"l2g": 1, "g2l": 0, "g2s": 1, "s2g": 1}
    json.dumps(stats)


def test_run_program_places_the_program_at_the_top():
    c = PRESETS["tiny"]
    dram = Dram(4096)
    program = ProgramBuilder()
    program.finish()
    assert run_program(c, dram, program.insns)["insn_count"] == 1
    assert insn_region(4096, 1) == 4032 and dram.data[4032] == 3  # FINISH
    with pytest.raises(ValueError, match="do not fit"):
        insn_region(32, 4)


def test_zero_rows_and_zero_iterations():
    c = PRESETS["tiny"]
    h = Harness(c)
    data = h.put("inp", np.full((4, 4), 5), 8)
    h.p.load("inp", 0, data, 1, 4)
    h.p.load("inp", 0, data, 0, 2, pad=(1, 1, 0, 0), deps=["push_next"])  # only the 2 x 2 padding rows
    h.p.load("uop", 0, h.put_uops([(0, 0, 0)]), 1, 1, deps=["pop_prev"])
    h.p.gemm(0, 1, iter_out=0)
    h.p.alu("add", 0, 1, iter_in=0, imm=1, deps=["push_next"])
    h.p.store(0, 0, 0, 3, deps=["pop_prev", "push_prev"])
    h.p.load("uop", 0, 0, 0, 0, deps=["pop_next"])
    sim, stats = h.run()
    assert sim.inp[:4].tolist() == [[0] * 4] * 4 and not sim.acc.any()
    assert stats["gemm_execs"] == stats["alu_execs"] == stats["bytes"]["out"] == 0
    assert stats["insns"]["gemm"] == stats["insns"]["alu"] == stats["insns"]["store"] == 1


def test_rows_that_are_not_whole_bytes_are_rejected():
    from weft.config import ConfigError

    with pytest.raises(ConfigError, match="not a whole number of bytes"):
        AcceleratorConfig(name="sub", block_in=2, block_out=2, inp_width=2, wgt_width=2, out_width=2,
                          acc_width=16, uop_buff_bytes=1024, inp_buff_bytes=64, wgt_buff_bytes=64,
                          acc_buff_bytes=256)


def test_sram_persists_between_runs_until_reset():
    c = PRESETS["tiny"]
    h = Harness(c)
    h.p.load("acc", 0, h.put("acc", np.full((1, 4), 9), 32), 1, 1)
    sim, _ = h.run()
    program = ProgramBuilder()
    program.finish()
    run_addr = h.dram.alloc(16)
    h.dram.write(run_addr, encode_insns(c, program.insns))
    sim.run(h.dram, run_addr, 1)
    assert np.all(sim.acc[0] == 9)
    sim.reset()
    assert not sim.acc.any()


def test_dram_bounds_and_alloc():
    dram = Dram(256)
    assert dram.alloc(10) == 0 and dram.alloc(10, align=64) == 64
    dram.write(250, b"\x01\x02")
    assert dram.read(250, 2).tolist() == [1, 2]
    dram.write(0, np.array([1, -1], dtype=np.int16))
    assert dram.read(0, 4).tolist() == [1, 0, 255, 255]
    with pytest.raises(ValueError, match="outside"):
        dram.write(255, b"ab")
    with pytest.raises(ValueError, match="outside"):
        dram.read(-1, 2)
    with pytest.raises(ValueError, match="outside"):
        dram.alloc(200)


def test_bench_fsim_smoke():
    figures = bench_fsim("tiny", seconds=0, size=8)
    assert figures["verified"] and figures["macs_per_s"] > 0 and figures["runs"] == 1
    assert figures["macs"] == 8 * 8 * figures["workload"]["input"][3] ** 2 * 9
    json.dumps(figures)
    with pytest.raises(ValueError, match="model"):
        bench_fsim("tiny", model="resnet18")
