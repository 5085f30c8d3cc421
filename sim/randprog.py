"""Random instruction streams that are legal by construction, for fuzzing the simulator and cosimulating
the RTL against it.

A program is a sequence of *blocks*; block k uses half k % 2 of the input, weight and accumulator/output
buffers (double buffering) and consists of

* load: LOADs of inp (2-D windows with strides, overlapping strides and zero padding) and wgt into the
  half; the first pops g2l when the half was used two blocks ago, the last pushes l2g;
* compute: the first instruction pops l2g (and s2g when the half was stored two blocks ago); then random
  LOAD UOP + GEMM (with and without reset, accumulating or overwriting), LOAD UOP + ALU (every op, immediate
  or acc source, repeated destinations, sources that overlap destinations), LOAD ACC and LOAD ACC_NARROW with
  padding, and flagless no-ops; the last one pushes g2l (when a later block reuses the half) and g2s;
* store: STOREs of out rows of the half into fresh DRAM (a quarter of them one long row starting just ahead
  of a 4 KiB boundary), the first pops g2s, the last pushes s2g.

Blocks are emitted in stream order with load running `prefetch` blocks ahead, so every token an
instruction waits for is pushed by an instruction earlier in the stream (the fetch unit can never stall
forever). The program ends by collecting the last stores' s2g tokens and FINISH, with every token queue
empty. Every SRAM row two units share is ordered by tokens and stores write DRAM that nothing reads, so
the final DRAM image does not depend on timing: the RTL must reproduce it bit for bit.

Everything is a function of (config, seed, arguments).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from weft.hw.structure import MAX_BURST
from weft.isa.arith import loop_indices, pack
from weft.isa.constants import AXI_BOUNDARY_BYTES, INSN_BYTES, AluOp, MemId, Opcode
from weft.isa.encoding import INSN_DTYPE, encode_uops, layout_of
from weft.isa.program import uops_from
from weft.isa.semantics import BesideRule, first_hazard, hazard_reach, named_row_bytes
from weft.sim.dram import Dram

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["random_program"]


@dataclass
class _Image:
    """DRAM contents laid out bottom-up; each chunk starts on a boundary of its row size."""

    chunks: list[tuple[int, np.ndarray]] = field(default_factory=list)
    top: int = 0

    def add(self, data: np.ndarray, row_bytes: int) -> int:
        """Place `data` (uint8) and return its address in rows of `row_bytes`."""
        align = max(64, row_bytes)
        addr = -(-self.top // align) * align
        self.chunks.append((addr, data))
        self.top = addr + data.size
        return addr // row_bytes

    def reserve(self, nbytes: int, row_bytes: int) -> int:
        return self.add(np.zeros(nbytes, dtype=np.uint8), row_bytes)

    def reserve_before_boundary(self, nbytes: int, row_bytes: int, before: int) -> int:
        """Reserve `nbytes` starting on a row of `row_bytes` about `before` bytes ahead of a 4 KiB boundary
        (exactly, where the rows allow it); returns its address in rows."""
        boundary = -(-(self.top + before) // AXI_BOUNDARY_BYTES) * AXI_BOUNDARY_BYTES
        addr = (boundary - before) // row_bytes * row_bytes
        if addr < self.top:
            addr += -(-(self.top - addr) // AXI_BOUNDARY_BYTES) * AXI_BOUNDARY_BYTES
        self.chunks.append((addr, np.zeros(nbytes, dtype=np.uint8)))
        self.top = addr + nbytes
        return addr // row_bytes


class _Gen:
    def __init__(self, config: AcceleratorConfig, rng: np.random.Generator, max_iter: int, max_uops: int):
        c = config
        self.c, self.rng, self.max_iter, self.max_uops = c, rng, max_iter, max_uops
        self.rb = named_row_bytes(c)
        self.half = {"inp": c.inp_rows // 2, "wgt": c.wgt_rows // 2, "acc": c.acc_rows // 2}
        self.uop_next = 0  # the next free row of the current block's half of the uop buffer
        self.image = _Image()
        # Source data in DRAM: an input "image", weights, accumulators (small and full-range values),
        # narrow accumulators.
        self.src_rows = {"inp": 4 * self.half["inp"], "wgt": 2 * self.half["wgt"],
                         "acc": 2 * self.half["acc"], "acc_narrow": 2 * self.half["acc"]}
        self.src_base = {}
        for name, width, elems in (
            ("inp", c.inp_width, c.batch * c.block_in),
            ("wgt", c.wgt_width, c.block_out * c.block_in),
            ("acc", c.acc_width, c.batch * c.block_out),
            ("acc_narrow", c.out_width, c.batch * c.block_out),
        ):
            rows = self.src_rows[name]
            lo, hi = -(1 << (width - 1)), 1 << (width - 1)
            values = rng.integers(lo, hi, (rows, elems))
            if name == "acc":  # half the rows small, so ALU results land on both sides of saturation
                values[: rows // 2] = rng.integers(-300, 300, (rows // 2, elems))
            self.src_base[name] = self.image.add(pack(values, width).reshape(-1), self.rb[name])

    def randint(self, lo: int, hi: int) -> int:
        """Uniform in [lo, hi] (inclusive)."""
        return int(self.rng.integers(lo, hi + 1))

    # ---- DMA -----------------------------------------------------------------------------------------
    def load_2d(self, mem: MemId, name: str, half: int, pad: bool) -> dict[str, int]:
        """A random 2-D load of source region `name` into SRAM half `half` of its buffer."""
        space = self.half["acc" if name.startswith("acc") else name]
        for _ in range(50):
            y, x = self.randint(1, 4), self.randint(1, 6)
            pads = [self.randint(0, 2) if pad and self.rng.random() < 0.5 else 0 for _ in range(4)]
            total = (pads[0] + y + pads[1]) * (pads[2] + x + pads[3])
            if total <= space:
                break
        else:
            y, x, pads, total = 1, 1, [0, 0, 0, 0], 1
        stride = max(0, x + self.randint(-2, 6)) if y > 1 else x
        extent = (y - 1) * stride + x
        dram = self.src_base[name] + self.randint(0, self.src_rows[name] - extent)
        sram = half * space + self.randint(0, space - total)
        return dict(opcode=Opcode.LOAD, mem_id=mem, sram_base=sram, dram_base=dram, y_size=y, x_size=x,
                    x_stride=stride, y_pad_0=pads[0], y_pad_1=pads[1], x_pad_0=pads[2], x_pad_1=pads[3])

    def store(self, half: int) -> dict[str, int]:
        space = self.half["acc"]
        rb = self.rb["out"]
        if self.rng.random() < 0.25:
            # One long row (up to three longest bursts and a few beats) starting a whole number of longest
            # bursts, or a few beats, ahead of a 4 KiB boundary: the store's burst split at the boundary, where
            # a longest burst ends exactly on it (Store2D hung there from 0d59170 until the fix, unseen by
            # rows of at most six out rows).
            burst = MAX_BURST * (self.c.bus_width // 8)
            y, x = 1, self.randint(min(space, max(1, burst // rb)), min(space, (3 * burst) // rb + 3))
            before = (self.randint(1, 2) * burst if self.rng.random() < 0.5 else
                      self.randint(1, 3 * MAX_BURST) * (self.c.bus_width // 8))
            stride = x
            dram = self.image.reserve_before_boundary(x * rb, rb, before)
            sram = half * space + self.randint(0, space - x)
            return dict(opcode=Opcode.STORE, mem_id=MemId.OUT, sram_base=sram, dram_base=dram, y_size=y,
                        x_size=x, x_stride=stride)
        y, x = self.randint(1, 3), self.randint(1, min(6, space // 3))
        stride = x + self.randint(0, 3) if y > 1 else x  # rows never overlap in DRAM
        dram = self.image.reserve(((y - 1) * stride + x) * rb, rb)
        sram = half * space + self.randint(0, space - y * x)
        return dict(opcode=Opcode.STORE, mem_id=MemId.OUT, sram_base=sram, dram_base=dram, y_size=y,
                    x_size=x, x_stride=stride)

    def nop(self, opcode: int, mem: MemId) -> dict[str, int]:
        return dict(opcode=opcode, mem_id=mem)

    # ---- loops ---------------------------------------------------------------------------------------
    def _operand(self, count: int, n_out: int, n_in: int, lo: int, space: int) -> tuple[np.ndarray, int, int]:
        """Uop fields and (outer, inner) factors keeping every index of the loop in [lo, lo + space)."""
        f_out = self.randint(0, 3) if n_out > 1 else 0
        f_in = self.randint(0, 3) if n_in > 1 else 0
        reach = (n_out - 1) * f_out + (n_in - 1) * f_in
        if reach >= space:
            f_out = f_in = reach = 0
        window = space - reach
        if self.rng.random() < 0.25:  # crowd a few rows: repeated destinations, overlapping sources
            window = min(window, 4)
        start = lo + self.randint(0, space - reach - window)
        return start + self.rng.integers(0, window, count), f_out, f_in

    def loop(self, half: int, gemm: bool, use_imm: bool, src_inp: bool = False, alu_op: int = 0
             ) -> tuple[np.ndarray, dict[str, int]]:
        """Uops and loop fields of a hazard-free GEMM or ALU instruction on buffer half `half` (an ALU
        operand from inp with `src_inp`; `alu_op` sets how far back the hazard reaches)."""
        acc = self.half["acc"]
        for _ in range(100):
            count = self.randint(1, self.max_uops)
            n_out, n_in = self.randint(1, self.max_iter), self.randint(1, self.max_iter)
            dst, dfo, dfi = self._operand(count, n_out, n_in, half * acc, acc)
            if gemm:
                src, sfo, sfi = self._operand(count, n_out, n_in, half * self.half["inp"], self.half["inp"])
                wgt, wfo, wfi = self._operand(count, n_out, n_in, half * self.half["wgt"], self.half["wgt"])
            elif src_inp:
                src, sfo, sfi = self._operand(count, n_out, n_in, half * self.half["inp"], self.half["inp"])
                wgt, wfo, wfi = np.zeros(count, np.int64), 0, 0
            else:
                src, sfo, sfi = self._operand(count, n_out, n_in, half * acc, acc)
                wgt, wfo, wfi = np.zeros(count, np.int64), 0, 0
            reads_acc = not gemm and not use_imm and not src_inp
            s = loop_indices(src, n_out, n_in, sfo, sfi) if reads_acc else None
            reach = hazard_reach(Opcode.GEMM if gemm else Opcode.ALU, alu_op)
            if first_hazard(loop_indices(dst, n_out, n_in, dfo, dfi), s, reach) is None:
                break
        else:  # one execution is always hazard-free
            count, n_out, n_in = 1, 1, 1
            dst, src, wgt = dst[:1], src[:1], wgt[:1]
            dfo = dfi = sfo = sfi = wfo = wfi = 0
        uops = uops_from(zip(dst.tolist(), src.tolist(), wgt.tolist(), strict=True))
        fields = dict(iter_out=n_out, iter_in=n_in, dst_factor_out=dfo, dst_factor_in=dfi,
                      src_factor_out=sfo, src_factor_in=sfi)
        if gemm:
            fields.update(wgt_factor_out=wfo, wgt_factor_in=wfi)
        return uops, fields

    def with_uops(self, uops: np.ndarray, op: dict[str, int], half: int) -> list[dict[str, int]]:
        """LOAD UOP of a fresh uop table, then `op` running it: the table lies in half `half` of the uop
        buffer, after the tables of the block's earlier ops (so that a block's loads may all come first), or
        anywhere once the half is full. The op remembers its half (``_half``)."""
        count = len(uops)
        room = self.c.uop_rows // 2
        if self.uop_next + count <= room:
            base = half * room + self.uop_next
            self.uop_next += count
        else:
            base = self.randint(0, self.c.uop_rows - count)
            self.uop_next = room + 1  # the block's tables may overlap now: its loads stay beside their ops
        dram = self.image.add(np.frombuffer(encode_uops(self.c, uops), np.uint8), self.rb["uop"])
        load = dict(opcode=Opcode.LOAD, mem_id=MemId.UOP, sram_base=base, dram_base=dram, y_size=1,
                    x_size=count, x_stride=count)
        return [load, dict(op, uop_bgn=base, uop_end=base + count, _half=half)]

    def fits_half(self, compute: list[dict[str, int]]) -> bool:
        """Whether a block's micro-op tables all lie, apart, in its half of the uop buffer."""
        return sum(r["x_size"] for r in compute if _is_uop_load(r)) <= self.c.uop_rows // 2

    def compute_op(self, half: int) -> list[dict[str, int]]:
        roll = self.rng.random()
        if roll < 0.4:
            uops, fields = self.loop(half, gemm=True, use_imm=False)
            reset = int(self.rng.random() < 0.25)
            overwrite = int(not reset and self.rng.random() < 0.25)
            return self.with_uops(uops, dict(opcode=Opcode.GEMM, reset=reset, overwrite=overwrite, **fields), half)
        if roll < 0.8:
            use_imm = self.rng.random() < 0.5
            alu = AluOp(self.randint(0, len(AluOp) - 1))
            imm = 0
            if use_imm:
                w = self.c.acc_width
                imm = (self.randint(-w - 2, w + 2) if alu == AluOp.SHR and self.rng.random() < 0.8
                       else self.randint(-(1 << 15), (1 << 15) - 1) if self.rng.random() < 0.3
                       else self.randint(-20, 20))
            src_inp = not use_imm and self.rng.random() < 0.3
            uops, fields = self.loop(half, gemm=False, use_imm=use_imm, src_inp=src_inp, alu_op=alu)
            return self.with_uops(uops, dict(opcode=Opcode.ALU, alu_op=alu, use_imm=int(use_imm), imm=imm,
                                             src_inp=int(src_inp), **fields), half)
        if roll < 0.9:
            return [self.load_2d(MemId.ACC, "acc", half, pad=True)]
        return [self.load_2d(MemId.ACC_NARROW, "acc_narrow", half, pad=True)]


def _is_uop_load(row: dict[str, int]) -> bool:
    """A LOAD UOP that moves a table (not a no-op)."""
    return row["opcode"] == Opcode.LOAD and row.get("mem_id") == MemId.UOP and row.get("x_size", 0) > 0


def _set_beside(rows: list[dict[str, int]], rng: np.random.Generator, config: AcceleratorConfig) -> None:
    """Let most GEMM/ALU ops that may run beside the other pipe's running op (spec "beside",
    :class:`weft.isa.semantics.BesideRule`: on the other half of the accumulator, neither an ALU reading inp)
    do so, where the format has the bit; the compute unit's loads and FINISH wait for both pipes."""
    formats = layout_of(config).formats
    rule = BesideRule()
    for k, row in enumerate(rows):
        op = row["opcode"]
        if (op == Opcode.LOAD and row.get("mem_id") in (MemId.UOP, MemId.ACC, MemId.ACC_NARROW)) \
                or op == Opcode.FINISH:
            rule.barrier()
        if op not in (Opcode.GEMM, Opcode.ALU):
            continue
        halves = frozenset({row.pop("_half")})
        reads_inp = op == Opcode.ALU and bool(row.get("src_inp")) and not row.get("use_imm")
        beside = formats["gemm" if op == Opcode.GEMM else "alu"].has("beside") \
            and rule.may_start(op, halves, reads_inp) and rng.random() < 0.8
        if beside:
            row["beside"] = 1
        rule.started(k, op, halves, reads_inp, beside)


def _flag(rows: list[dict[str, int]], index: int, *flags: str) -> None:
    for name in flags:
        rows[index][name] = 1


def random_program(config: AcceleratorConfig, seed: int, n_insns: int = 200, *, max_iter: int = 3,
                   max_uops: int = 6, prefetch: int | None = None, nop_rate: float = 0.05
                   ) -> tuple[np.ndarray, Dram]:
    """A random legal program of about `n_insns` instructions and its DRAM image.

    Returns (insns as INSN_DTYPE, Dram). The image holds the data the program loads, room for what it
    stores, and free space at the top for the encoded instructions, where
    :func:`weft.sim.fsim.run_program` puts them by default. `max_iter` and `max_uops` bound each GEMM/ALU
    loop; `prefetch` (0 or 1, random when None) is how many blocks load runs ahead in the stream;
    `nop_rate` is the share of flagless no-ops.
    """
    if prefetch not in (None, 0, 1):
        raise ValueError(f"prefetch must be 0, 1 or None, got {prefetch!r}")
    if max_iter < 1 or max_uops < 1:
        raise ValueError("max_iter and max_uops must be at least 1")
    rng = np.random.default_rng(seed)
    gen = _Gen(config, rng, max_iter, max_uops)
    if prefetch is None:
        prefetch = int(rng.integers(0, 2))
    blocks: list[tuple[list[dict], list[dict], list[dict]]] = []
    total = 2  # the final collection of store tokens and FINISH, about
    while total < n_insns or not blocks:
        half = len(blocks) % 2
        loads = [gen.load_2d(MemId.INP, "inp", half, pad=True) if rng.random() < 0.6
                 else gen.load_2d(MemId.WGT, "wgt", half, pad=False) for _ in range(gen.randint(1, 3))]
        gen.uop_next = 0
        compute = [row for _ in range(gen.randint(1, 4)) for row in gen.compute_op(half)]
        stores = [gen.store(half) for _ in range(gen.randint(1, 2))]
        for part, nop in ((loads, (Opcode.LOAD, MemId.INP)), (compute, (Opcode.LOAD, MemId.UOP)),
                          (stores, (Opcode.STORE, MemId.OUT))):
            for _ in range(int(rng.binomial(len(part), nop_rate))):
                part.insert(int(rng.integers(0, len(part))), gen.nop(*nop))
        blocks.append((loads, compute, stores))
        total += len(loads) + len(compute) + len(stores)

    n = len(blocks)
    # A pair of blocks loads the micro-ops of both first, when each block's tables fit its half of the uop
    # buffer: the second block's ops then follow the first's with nothing between, so they may run beside.
    for k in range(0, n - 1, 2):
        first, second = blocks[k][1], blocks[k + 1][1]
        if gen.fits_half(first) and gen.fits_half(second):
            blocks[k][1][:] = ([r for r in first if _is_uop_load(r)] + [r for r in second if _is_uop_load(r)]
                               + [r for r in first if not _is_uop_load(r)])
            second[:] = [r for r in second if not _is_uop_load(r)]
    for k, (loads, compute, stores) in enumerate(blocks):
        if k >= 2:
            _flag(loads, 0, "pop_next")
            _flag(compute, 0, "pop_next")
        _flag(loads, -1, "push_next")
        _flag(compute, 0, "pop_prev")
        _flag(compute, -1, "push_next")
        if k + 2 < n:
            _flag(compute, -1, "push_prev")
        _flag(stores, 0, "pop_prev")
        _flag(stores, -1, "push_prev")

    rows: list[dict[str, int]] = []
    for k in range(min(prefetch, n)):
        rows += blocks[k][0]
    for k in range(n):
        if k + prefetch < n:
            rows += blocks[k + prefetch][0]
        rows += blocks[k][1] + blocks[k][2]
    rows += [dict(opcode=Opcode.LOAD, mem_id=MemId.UOP, pop_next=1) for _ in range(min(n, 2))]
    rows.append(dict(opcode=Opcode.FINISH))
    _set_beside(rows, rng, config)

    insns = np.zeros(len(rows), dtype=INSN_DTYPE)
    for i, row in enumerate(rows):
        for name, value in row.items():
            insns[i][name] = int(value)
    size = -(-gen.image.top // 64) * 64 + len(rows) * INSN_BYTES + 64
    dram = Dram(size)
    for addr, data in gen.image.chunks:
        dram.write(addr, data)
    return insns, dram
