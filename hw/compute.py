"""The compute unit: micro-op and accumulator loads, the GEMM/ALU loop pipeline, FINISH.

It owns the micro-op buffer and the accumulator. A GEMM or ALU instruction is the two-level loop of the
spec (``for i < iter_out, j < iter_in, k in [uop_bgn, uop_end)``); the loop generator issues one micro-op
execution per cycle into a pipeline that never stalls, except an ALU micro-op that reads acc[src] through
the port: it issues :data:`~weft.hw.structure.ALU_SRC_INTERVAL` (2) cycles after the one before it,
because the accumulator has a single read port (a second one makes Yosys duplicate the whole buffer) and
such a micro-op reads it twice. An instruction without src loop factors and with at most
:data:`~weft.hw.structure.SRC_ROWS` micro-ops (a requantization's per-channel vectors) reads its src rows
in the first sweep only; registers hold them for the rest, which issue one per cycle:

====  ==========================================================================================
A     loop generator: micro-op address, loop offsets
B     micro-op word: row indices (range-checked); inp and wgt read addresses
C     inp and wgt rows: the GEMM core's products; accumulator read address src (ALU with acc[src])
D     the first half of the GEMM core's adder tree; accumulator read address dst; the src row is latched
E     the rest of the adder tree; the acc[dst] row is registered
X     acc + sum (GEMM) or op(acc[dst], acc[src], inp[src] or imm) (ALU), but MUL's and RQ's partial products only
Y     MUL's product, or RQ's rounded shift of it, from the partial products
F     write acc[dst] and out[dst] = saturate(acc[dst])
====  ==========================================================================================

The accumulator's read port is transparent to its write port, so an execution reads dst (in D) what the
one four ahead of it writes (in F) in the same cycle. What the ones three and two ahead write later comes
from F instead (forwarding): into E's register, and into X. An ALU execution's src read (in C) comes a
cycle earlier; D latches it (or what F writes then) into its src register, every later F write to that
row lands there too, and X takes the one F writes in its own cycle. So a read-after-write at distance 2
or more sees the new value; distance 1 is the hazard the spec forbids. An ALU operand from inp[src] comes
through inp's read port (read in C, as the GEMM's rows are) and never waits. Each
instruction drains the pipeline before it ends, so the next one (and the tokens it pushes) see every write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from amaranth import Cat, Module, Mux, Signal
from amaranth.hdl import Value
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from weft.hw.axi import ADDR_BITS, read_client_signature
from weft.hw.datapath import (
    GEMM_LATENCY,
    GemmCore,
    alu_lane_first,
    alu_lane_last,
    elements,
    saturate_row,
    sign_extend_row,
)
from weft.hw.dma import Load2D
from weft.hw.regs import ErrorCode, register_widths
from weft.hw.structure import ALU_SRC_INTERVAL, SRC_ROWS, holds_src_rows
from weft.hw.unit import UnitBase, request_dma_once
from weft.isa.constants import MemId, Opcode, Unit
from weft.isa.semantics import row_bytes

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["ComputeUnit"]

# Load2D targets of the compute unit, by position.
_UOP, _ACC, _ACC_NARROW = range(3)


@dataclass(frozen=True)
class _Insn:
    """The current instruction in each format it may have, and which kind it is."""

    mem: data.View
    gemm: data.View
    alu: data.View
    is_load: Value
    is_gemm: Value
    is_alu: Value
    is_finish: Value
    looped: Value
    #: An ALU instruction whose operand is acc[src], not the immediate or inp[src].
    alu_src: Value
    #: An ALU instruction whose operand is inp[src] (through inp's read port, as the GEMM reads it).
    alu_inp: Value

    def loop_field(self, name: str) -> Value:
        """A field GEMM and ALU share, from the format of the current instruction."""
        return Mux(self.is_gemm, getattr(self.gemm, name), getattr(self.alu, name))


@dataclass(frozen=True)
class _Loop:
    """The loop generator (stage A): its state and the row offsets of the execution it issues."""

    launched: Signal
    gen: Signal
    aborted: Signal
    issue: Value
    #: The execution issued reads acc[src] through the port (else it takes the row a register holds).
    reads: Value
    #: Which of the SRC_ROWS registers holds the execution's src row.
    slot: Signal
    #: dst, src, wgt -> (outer, inner) row offset.
    offs: dict[str, tuple[Signal, Signal]]
    off_bits: int


@dataclass(frozen=True)
class _Buffers:
    """The micro-op buffer and the accumulator (one read port: dst, and before it src), owned by the unit."""

    uop_w: memory.WritePort
    uop_r: memory.ReadPort
    acc_w: memory.WritePort
    acc_r: memory.ReadPort


class ComputeUnit(UnitBase):
    """LOAD UOP/ACC/ACC_NARROW, GEMM, ALU and FINISH. Reads inp and wgt, writes out."""

    def __init__(self, config: AcceleratorConfig):
        c = config
        regs = register_widths(c)
        super().__init__(c, Unit.COMPUTE, {
            "bus": Out(read_client_signature(addr_bits=ADDR_BITS, data_bits=c.bus_width)),
            "inp_addr": Out(c.inp_index_bits), "inp_data": In(c.inp_row_bits),
            "wgt_addr": Out(c.wgt_index_bits), "wgt_data": In(c.wgt_row_bits),
            "out_w": Out(data.StructLayout({"en": 1, "addr": c.acc_index_bits, "data": c.out_row_bits})),
            "finished": Out(1), "finish_index": Out(regs["error_index"]),
            "error": Out(1), "error_code": Out(regs["error_code"]), "error_index": Out(regs["error_index"]),
            "mac_active": Out(1), "alu_active": Out(1),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        done = Signal()
        insn, index, start = self.gate(m, done)
        head = self.view(insn, "finish")
        is_gemm, is_alu = head.opcode == Opcode.GEMM, head.opcode == Opcode.ALU
        alu = self.view(insn, "alu")
        d = _Insn(mem=self.view(insn, "mem"), gemm=self.view(insn, "gemm"), alu=alu,
                  is_load=head.opcode == Opcode.LOAD, is_gemm=is_gemm, is_alu=is_alu,
                  is_finish=head.opcode == Opcode.FINISH, looped=is_gemm | is_alu,
                  alu_src=is_alu & ~alu.use_imm & ~alu.src_inp, alu_inp=is_alu & ~alu.use_imm & alu.src_inp)
        bufs = self._buffers(m)
        dma, load_over = self._loads(m, d, start, bufs)
        loop = self._loop_generator(m, d, start, bufs)
        valid = {s: Signal(name=f"valid_{s}") for s in "bcdexyf"}
        dst, src_c, reads_c, slots = self._row_indices(m, d, index, bufs, loop, valid)
        new_f = self._datapath(m, d, bufs, valid, dst, src_c, reads_c, slots)
        self._write_back(m, d, dma, bufs, valid, dst, new_f)
        drained = ~Cat(*valid.values()).any()
        loop_done = d.looped & loop.launched & ~loop.gen & drained

        # FINISH, bus errors, completion.
        with m.If(self.busy & d.is_finish):
            m.d.sync += [self.finished.eq(1), self.finish_index.eq(index)]
        with m.If(dma.error & ~self.error):
            m.d.sync += [self.error.eq(1), self.error_code.eq(ErrorCode.BUS_ERROR), self.error_index.eq(index)]
        m.d.comb += done.eq(self.busy & ((d.is_load & load_over) | loop_done | d.is_finish))
        return m

    def _buffers(self, m: Module) -> _Buffers:
        c = self.config
        m.submodules.uop_mem = uop_mem = memory.Memory(shape=c.uop_bits, depth=c.uop_rows, init=[])
        m.submodules.acc_mem = acc_mem = memory.Memory(shape=c.acc_row_bits, depth=c.acc_rows, init=[])
        uop_w = uop_mem.write_port()
        uop_r = uop_mem.read_port()
        acc_w = acc_mem.write_port()
        acc_r = acc_mem.read_port(transparent_for=(acc_w,))
        return _Buffers(uop_w, uop_r, acc_w, acc_r)

    def _loads(self, m: Module, d: _Insn, start: Signal, bufs: _Buffers) -> tuple[Load2D, Value]:
        """LOAD UOP, ACC and ACC_NARROW: the DMA (writing the uop buffer here, the accumulator in
        :meth:`_write_back`) and whether the load is over."""
        c = self.config
        rows = row_bytes(c)
        m.submodules.dma = dma = Load2D(
            bus_bytes=c.bus_width // 8, targets=(rows[MemId.UOP], rows[MemId.ACC], rows[MemId.ACC_NARROW]),
            mem_format=self.layout.formats["mem"])
        wiring.connect(m, wiring.flipped(self.bus), dma.bus)
        mem_id = d.mem.mem_id
        target = Mux(mem_id == MemId.UOP, _UOP, Mux(mem_id == MemId.ACC, _ACC, _ACC_NARROW))
        over = request_dma_once(m, dma, self.busy & d.is_load, d.mem, start, target=target)
        m.d.comb += [
            bufs.uop_w.en.eq(dma.write.en & (dma.write.target == _UOP)),
            bufs.uop_w.addr.eq(dma.write.addr), bufs.uop_w.data.eq(dma.write.data),
        ]
        return dma, over

    def _loop_generator(self, m: Module, d: _Insn, start: Signal, bufs: _Buffers) -> _Loop:
        """Stage A: one micro-op execution per cycle, k innermost, with the row offsets of i and j."""
        c, layout = self.config, self.layout
        launched = Signal()
        gen = Signal()
        aborted = Signal()
        last = Signal()  # an execution issued in the previous cycle: its dst read would take the port
        k = Signal(d.gemm.uop_end.shape())  # walks [uop_bgn, uop_end)
        i = Signal(layout.iter_bits)
        j = Signal(layout.iter_bits)
        off_bits = max(c.acc_index_bits, c.inp_index_bits, c.wgt_index_bits) + layout.iter_bits + 1
        offs = {name: (Signal(off_bits, name=f"{name}_out"), Signal(off_bits, name=f"{name}_in"))
                for name in ("dst", "src", "wgt")}
        factors = {
            "dst": (d.loop_field("dst_factor_out"), d.loop_field("dst_factor_in")),
            "src": (d.loop_field("src_factor_out"), d.loop_field("src_factor_in")),
            "wgt": (d.gemm.wgt_factor_out, d.gemm.wgt_factor_in),
        }
        uop_bgn, uop_end = d.loop_field("uop_bgn"), d.loop_field("uop_end")
        iter_out, iter_in = d.loop_field("iter_out"), d.loop_field("iter_in")
        with m.If(self.busy & d.looped & ~launched):
            m.d.sync += [launched.eq(1), gen.eq((iter_out != 0) & (iter_in != 0)), k.eq(uop_bgn),
                         i.eq(0), j.eq(0), aborted.eq(0), last.eq(0)]
            for out_off, in_off in offs.values():
                m.d.sync += [out_off.eq(0), in_off.eq(0)]
        with m.If(start):
            m.d.sync += launched.eq(0)
        m.d.comb += bufs.uop_r.addr.eq(k)
        # Without src loop factors each micro-op reads the same src row in every execution: with at most
        # SRC_ROWS micro-ops the first sweep reads them into registers and the rest issue back to back.
        kept = holds_src_rows(*factors["src"], uop_end - uop_bgn)
        reads = d.alu_src & ~(kept & ((i != 0) | (j != 0)))
        slot = Signal(range(SRC_ROWS))  # the register of the execution's src row
        m.d.comb += slot.eq(Mux(kept, k - uop_bgn, 0))
        assert ALU_SRC_INTERVAL == 2  # a read of acc[src] waits one cycle after any issue
        issue = gen & ~aborted & ~(reads & last)
        m.d.sync += last.eq(issue)
        with m.If(issue):
            with m.If(k == uop_end - 1):
                m.d.sync += k.eq(uop_bgn)
                with m.If(j == iter_in - 1):
                    m.d.sync += j.eq(0)
                    for name, (out_off, in_off) in offs.items():
                        m.d.sync += [in_off.eq(0), out_off.eq(out_off + factors[name][0])]
                    with m.If(i == iter_out - 1):
                        m.d.sync += gen.eq(0)
                    with m.Else():
                        m.d.sync += i.eq(i + 1)
                with m.Else():
                    m.d.sync += j.eq(j + 1)
                    for name, (_, in_off) in offs.items():
                        m.d.sync += in_off.eq(in_off + factors[name][1])
            with m.Else():
                m.d.sync += k.eq(k + 1)
        with m.If(aborted):
            m.d.sync += gen.eq(0)
        return _Loop(launched, gen, aborted, issue, reads, slot, offs, off_bits)

    def _row_indices(self, m: Module, d: _Insn, index: Signal, bufs: _Buffers, loop: _Loop,
                     valid: dict[str, Signal]) -> tuple[dict[str, Signal], Signal, Signal, dict[str, Signal]]:
        """Stage B: the micro-op's rows plus the loop offsets, range-checked (an execution past a buffer's
        end aborts the loop with LOOP_RANGE); the inp and wgt read addresses. Returns the dst row registers of
        the later stages and the src row of stage C."""
        c = self.config
        off_b = {name: Signal(loop.off_bits + 1, name=f"{name}_off_b") for name in loop.offs}
        reads_b, reads_c = Signal(), Signal()
        slots = {s: Signal.like(loop.slot, name=f"slot_{s}") for s in "bcdex"}
        m.d.sync += [valid["b"].eq(loop.issue), reads_b.eq(loop.reads), reads_c.eq(reads_b),
                     slots["b"].eq(loop.slot), slots["c"].eq(slots["b"])]
        for name, (out_off, in_off) in loop.offs.items():
            m.d.sync += off_b[name].eq(out_off + in_off)
        uop = data.View(self.layout.uop.as_struct_layout(), bufs.uop_r.data)
        idx_bits = loop.off_bits + 2
        dst_b, src_b, wgt_b = (Signal(idx_bits, name=f"{n}_b") for n in ("dst", "src", "wgt"))
        m.d.comb += [dst_b.eq(uop.dst + off_b["dst"]), src_b.eq(uop.src + off_b["src"]),
                     wgt_b.eq(uop.wgt + off_b["wgt"])]
        reads_inp = d.is_gemm & ~d.gemm.reset
        bad = Signal()
        m.d.comb += bad.eq(
            (dst_b >= c.acc_rows)
            | (reads_inp & ((src_b >= c.inp_rows) | (wgt_b >= c.wgt_rows)))
            | (d.alu_inp & (src_b >= c.inp_rows))  # (an ALU instruction has no wgt fields)
            | (d.alu_src & (src_b >= c.acc_rows)))
        m.d.comb += [self.inp_addr.eq(src_b), self.wgt_addr.eq(wgt_b)]
        with m.If(valid["b"] & bad & ~loop.aborted):
            m.d.sync += loop.aborted.eq(1)
            with m.If(~self.error):
                m.d.sync += [self.error.eq(1), self.error_code.eq(ErrorCode.LOOP_RANGE),
                             self.error_index.eq(index)]
        dst = {s: Signal(c.acc_index_bits, name=f"dst_{s}") for s in "cdexyf"}
        src_c = Signal(c.acc_index_bits)
        m.d.sync += [valid["c"].eq(valid["b"] & ~bad & ~loop.aborted), dst["c"].eq(dst_b), src_c.eq(src_b)]
        return dst, src_c, reads_c, slots

    def _datapath(self, m: Module, d: _Insn, bufs: _Buffers, valid: dict[str, Signal], dst: dict[str, Signal],
                  src_c: Signal, reads_c: Signal, slots: dict[str, Signal]) -> Signal:
        """Stages C, D and E (the GEMM core; accumulator reads), X and Y (acc + sum for GEMM, the ALU op
        for ALU). Returns the new accumulator row of stage F."""
        c = self.config
        m.submodules.gemm = core = GemmCore(batch=c.batch, block_in=c.block_in, block_out=c.block_out,
                                            inp_width=c.inp_width, wgt_width=c.wgt_width)
        assert GEMM_LATENCY == 3  # C, D and E
        m.d.comb += [core.inp.eq(self.inp_data), core.wgt.eq(self.wgt_data)]
        src_d = Signal.like(src_c)
        reads_d = Signal()
        m.d.sync += [valid["d"].eq(valid["c"]), dst["d"].eq(dst["c"]), src_d.eq(src_c),
                     reads_d.eq(valid["c"] & reads_c), slots["d"].eq(slots["c"]), slots["e"].eq(slots["d"]),
                     slots["x"].eq(slots["e"])]
        m.d.comb += [
            self.mac_active.eq(valid["c"] & d.is_gemm & ~d.gemm.reset),
            self.alu_active.eq(valid["c"] & d.is_alu),
            # In C an ALU execution that reads acc[src] reads it; D is empty then (it issued a cycle after the
            # one before it).
            bufs.acc_r.addr.eq(Mux(valid["c"] & reads_c, src_c, dst["d"])),
        ]
        new_f = Signal(c.acc_row_bits)
        # acc[src], read in C (or written by F now), latched in D with its row in the execution's slot; it
        # serves X until the slot's next read, which D latches after the last execution using this one has
        # passed X (a read waits a cycle after any issue). Every F write to a held row lands in its register,
        # and X takes the one F writes in its own cycle: an execution sees the writes two or more ahead of
        # it, as with dst.
        held = [Signal(c.acc_row_bits, name=f"src_row_{n}") for n in range(SRC_ROWS)]
        held_at = [Signal.like(src_c, name=f"src_at_{n}") for n in range(SRC_ROWS)]
        for n in range(SRC_ROWS):
            with m.If(reads_d & (slots["d"] == n)):
                m.d.sync += [held[n].eq(Mux(valid["f"] & (dst["f"] == src_d), new_f, bufs.acc_r.data)),
                             held_at[n].eq(src_d)]
            with m.Elif(valid["f"] & (dst["f"] == held_at[n])):
                m.d.sync += held[n].eq(new_f)
        operand = Signal(c.acc_row_bits)
        operand_at = Signal.like(src_c)
        with m.Switch(slots["x"]):
            for n in range(SRC_ROWS):
                with m.Case(n):
                    m.d.comb += [operand.eq(held[n]), operand_at.eq(held_at[n])]
        old_x = Signal(c.acc_row_bits)
        forward_x = Signal()  # X takes acc[dst] from F, which writes it then
        m.d.sync += [valid["e"].eq(valid["d"]), dst["e"].eq(dst["d"]), valid["x"].eq(valid["e"]),
                     dst["x"].eq(dst["e"]), valid["y"].eq(valid["x"]), dst["y"].eq(dst["x"]),
                     old_x.eq(Mux(valid["f"] & (dst["f"] == dst["e"]), new_f, bufs.acc_r.data)),
                     forward_x.eq(valid["y"] & (dst["y"] == dst["e"]))]

        # inp[src], read in C like the GEMM's rows, travels to X for an ALU execution that takes it.
        inp_d, inp_e, inp_x = (Signal(c.inp_row_bits, name=f"inp_{s}") for s in "dex")
        m.d.sync += [inp_d.eq(self.inp_data), inp_e.eq(inp_d), inp_x.eq(inp_e)]
        inp_lanes = elements(inp_x, c.inp_width)

        lanes, w = c.batch * c.block_out, c.acc_width
        old = elements(Mux(forward_x, new_f, old_x), w)
        sums = elements(core.sums, core.sum_bits)
        src_row = elements(Mux(valid["f"] & (dst["f"] == operand_at), new_f, operand), w)
        alu_f = d.alu
        imm = alu_f.imm.as_signed()
        row_y = Signal(c.acc_row_bits)  # the GEMM's row, or the ALU's but for MUL and RQ
        parts_y: list[list[Signal]] = []  # MUL's and RQ's partial products, registered in Y
        gemm_row = Cat(*[Mux(d.gemm.reset, 0, (Mux(d.gemm.overwrite, 0, old[n]) + sums[n])[:w])
                         for n in range(lanes)])
        alu_rows = []
        for n in range(lanes):
            row, lane = divmod(n, c.block_out)  # lane o of batch row b takes inp lane o mod block_in
            rhs = Mux(alu_f.use_imm, imm, Mux(alu_f.src_inp, inp_lanes[row * c.block_in + lane % c.block_in],
                                              src_row[n]))
            other, parts = alu_lane_first(alu_f.alu_op, old[n], rhs, w)
            alu_rows.append(other)
            parts_y.append([Signal(part.shape(), name=f"mul_{k}_{n}") for k, part in enumerate(parts)])
            m.d.sync += [reg.eq(part) for reg, part in zip(parts_y[n], parts, strict=True)]
        m.d.sync += row_y.eq(Mux(d.is_gemm, gemm_row, Cat(*alu_rows)))
        alu_row = Cat(*[alu_lane_last(alu_f.alu_op, row_y.word_select(n, w), parts_y[n], w) for n in range(lanes)])
        m.d.sync += [valid["f"].eq(valid["y"]), dst["f"].eq(dst["y"]), new_f.eq(Mux(d.is_gemm, row_y, alu_row))]
        return new_f

    def _write_back(self, m: Module, d: _Insn, dma: Load2D, bufs: _Buffers, valid: dict[str, Signal],
                    dst: dict[str, Signal], new_f: Signal) -> None:
        """Stage F: write acc[dst] and out[dst] = saturate(acc[dst]); while a load runs, it writes the
        accumulator instead."""
        c = self.config
        acc_w = bufs.acc_w
        loading = self.busy & d.is_load
        with m.If(loading):
            narrow = sign_extend_row(dma.write.data[:c.out_row_bits], c.out_width, c.acc_width)
            m.d.comb += [
                acc_w.en.eq(dma.write.en & (dma.write.target != _UOP)),
                acc_w.addr.eq(dma.write.addr),
                acc_w.data.eq(Mux(dma.write.target == _ACC, dma.write.data[:c.acc_row_bits], narrow)),
            ]
        with m.Else():
            m.d.comb += [acc_w.en.eq(valid["f"]), acc_w.addr.eq(dst["f"]), acc_w.data.eq(new_f)]
        m.d.comb += [
            self.out_w.en.eq(valid["f"]), self.out_w.addr.eq(dst["f"]),
            self.out_w.data.eq(saturate_row(new_f, c.acc_width, c.out_width)),
        ]
