"""The compute unit: micro-op and accumulator loads, the GEMM and ALU loop pipelines, FINISH.

It owns the micro-op buffer and the accumulator, and runs two copies of the pipeline below (spec "beside"):
GEMM instructions (and the unit's loads and FINISH) in one, with the GEMM core, ALU instructions in the
other, with the ALU lanes. It issues in stream order; an instruction waits for both pipes to be idle unless
it has ``beside`` set; one that pushes tokens retires (pushes them, frees its pipe) after the older
instruction beside it, one that pushes none when done. The
accumulator (and the out buffer, in the core) is two banks, its halves, each with one read and one write
port: an instruction beside another touches only the other half, so the pipes never share a port. Each pipe
has its own micro-op read port. Within a pipe ("the port" below is the port of the bank it uses), a GEMM
or ALU instruction is the two-level loop of the spec (``for i < iter_out, j < iter_in, k in [uop_bgn,
uop_end)``); the loop generator issues one micro-op
execution per cycle into a pipeline that never stalls, except an ALU micro-op that reads acc[src] through
the port: it issues :data:`~weft.hw.structure.ALU_SRC_INTERVAL` (2) cycles after the one before it,
because the accumulator has a single read port (a second one makes Yosys duplicate the whole buffer) and
such a micro-op reads it twice. An instruction without src loop factors and with at most
:data:`~weft.hw.structure.SRC_ROWS` micro-ops (a requantization's per-channel vectors) reads its src rows
in the first sweep only; registers hold them for the rest, which issue one per cycle:

====  ==========================================================================================
A     loop generator: micro-op address, loop offsets
U     the micro-op word, registered as it leaves the block RAM
B     row indices (range-checked); inp and wgt read addresses
C     inp and wgt rows: the GEMM core's operand registers; accumulator read address src (ALU with acc[src])
P     the GEMM core's products (the GEMM pipe only: the ALU pipe goes from C to D)
D     the first half of the GEMM core's adder tree; accumulator read address dst; the src row is latched
E     the rest of the adder tree; the acc[dst] row is registered
X     acc + sum (GEMM) or op(acc[dst], acc[src], inp[src] or imm) (ALU), but for SHR's right shift, MUL and
      RQ only their partial products
Y     the GEMM's row registered; the ALU's partial products summed (MUL's product, RQ's rounded one) and the
      longest steps of the right shift (RQ's and SHR's)
Z     (the ALU pipe only) the rest of the right shift, RQ's ReLU
F     write acc[dst] and out[dst] = saturate(acc[dst])
====  ==========================================================================================

The accumulator's read port is transparent to its write port, so an execution reads dst (in D) what the
one F is writing in the same cycle (four ahead in the GEMM pipe, five in the ALU's). What the nearer ones
write later comes from F instead (forwarding): into E's register, and into X; in the ALU pipe, X also takes
the result of the one two ahead from Z's register, which every op but SHR, MUL and RQ has by then. An ALU
execution's src read (in C) comes a cycle earlier; D latches it (or what F writes then) into its src
register, every later F write to that row lands there too, and X takes the one F writes in its own cycle
(and Z's, as for dst). So a read-after-write at distance 2 or more sees the new value, except after SHR,
MUL and RQ, where it takes distance 4: in the ALU pipe, what F will write is handed to E from Z's register,
which holds every op's result but theirs (from the last stage's logic, their results lay ahead of the
multipliers' operand registers on tiny's longest paths after place and route). The nearer ones are the
hazards the spec forbids (spec "hazard", weft.isa.semantics.hazard_reach). An ALU operand from inp[src] comes
through inp's read port (read in C, as the GEMM's rows are) and never waits. Each
instruction drains the pipeline before it ends, so the next one (and the tokens it pushes) see every write.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.hdl import Value
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from weft.hw.axi import ADDR_BITS, read_client_signature
from weft.hw.datapath import (
    DSP48,
    GEMM_LATENCY,
    AluFirst,
    DspPorts,
    GemmCore,
    alu_lane_first,
    alu_lane_last,
    alu_lane_mid,
    alu_multiplicands,
    alu_selects,
    elements,
    multiplier_top,
    saturate_row,
    select,
    sign_extend_row,
)
from weft.hw.dma import Load2D
from weft.hw.dsp import registered_product
from weft.hw.rams import collision_free, read_data
from weft.hw.regs import ErrorCode, register_widths
from weft.hw.structure import ALU_READ_STAGES, ALU_SRC_INTERVAL, ALU_STAGES, SRC_ROWS, holds_src_rows
from weft.hw.unit import UnitBase, request_dma_once
from weft.isa.constants import INSN_BITS, AluOp, MemId, Opcode, Unit
from weft.isa.semantics import acc_bank_rows, hazard_reach, row_bytes

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["ComputeUnit"]

# Load2D targets of the compute unit, by position.
_UOP, _ACC, _ACC_NARROW = range(3)

#: What the issue gives each compute pipe: its instruction register, the instruction's index, the start pulse,
#: busy, and the instruction's decodes (its opcode, its operand's source, whether it moves anything), each
#: registered beside it.
_Slot = tuple[Signal, Signal, Signal, Signal, dict[str, Signal]]


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
    #: The instruction's transfer moves anything (mem format: x_size != 0), for its loads.
    moves: Value

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
    """One pipe's view of the buffers: its micro-op read port and its accumulator port (one read: dst, and
    before it src; one write), which the banks serve (:meth:`ComputeUnit._banks`)."""

    uop_r: memory.ReadPort
    r_addr: Signal
    r_data: Signal
    #: The read address is one a stage uses this cycle (else the other pipe may have the bank's port).
    r_active: Signal
    w_en: Signal
    w_addr: Signal
    w_data: Signal
    #: out[dst] = saturate(acc[dst]), written a cycle after the accumulator (not by loads): registers.
    o_en: Signal
    o_addr: Signal
    o_data: Signal


def _pipe_buffers(config: AcceleratorConfig, uop_r: memory.ReadPort, name: str) -> _Buffers:
    c = config
    rows, index = c.acc_row_bits, c.acc_index_bits
    return _Buffers(uop_r, Signal(index, name=f"{name}_r_addr"), Signal(rows, name=f"{name}_r_data"),
                    Signal(name=f"{name}_r_active"), Signal(name=f"{name}_w_en"), Signal(index, name=f"{name}_w_addr"),
                    Signal(rows, name=f"{name}_w_data"), Signal(name=f"{name}_o_en"),
                    Signal(index, name=f"{name}_o_addr"), Signal(c.out_row_bits, name=f"{name}_o_data"))


class ComputeUnit(UnitBase):
    """LOAD UOP/ACC/ACC_NARROW, GEMM, ALU and FINISH. Reads inp and wgt, writes out."""

    def __init__(self, config: AcceleratorConfig, *, dsp: DspPorts = DSP48, garble_collisions: bool = False):
        c = config
        self.dsp, self.garble_collisions = dsp, garble_collisions
        regs = register_widths(c)
        super().__init__(c, Unit.COMPUTE, {
            "bus": Out(read_client_signature(addr_bits=ADDR_BITS, data_bits=c.bus_width)),
            "inp_addr": Out(c.inp_index_bits), "inp_data": In(c.inp_row_bits),
            "wgt_addr": Out(c.wgt_index_bits), "wgt_data": In(c.wgt_row_bits),
            # one write port per half of the out buffer (its banks, as the accumulator's: see _banks)
            "out_w": Out(data.StructLayout({"en": 1, "addr": c.acc_index_bits, "data": c.out_row_bits})).array(2),
            "finished": Out(1), "finish_index": Out(regs["error_index"]),
            "error": Out(1), "error_code": Out(regs["error_code"]), "error_index": Out(regs["error_index"]),
            "mac_active": Out(1), "alu_active": Out(1),
            # each pipe's busy (spec "beside"): the GEMM pipe's (with the unit's loads and FINISH), the ALU's
            "busy_gemm": Out(1), "busy_alu": Out(1),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        c = self.config
        done_g, done_a = Signal(), Signal()
        ((insn_g, index_g, start_g, busy_g, kind_g),
         (insn_a, index_a, start_a, busy_a, kind_a)) = self._issue(m, done_g, done_a)
        is_gemm = kind_g["gemm"]
        d_g = _Insn(mem=self.view(insn_g, "mem"), gemm=self.view(insn_g, "gemm"), alu=self.view(insn_g, "alu"),
                    is_load=kind_g["load"], is_gemm=is_gemm, is_alu=Const(0),
                    is_finish=kind_g["finish"], looped=is_gemm, alu_src=Const(0), alu_inp=Const(0),
                    moves=kind_g["moves"])
        alu = self.view(insn_a, "alu")
        is_alu = kind_a["alu"]
        d_a = _Insn(mem=self.view(insn_a, "mem"), gemm=self.view(insn_a, "gemm"), alu=alu, is_load=Const(0),
                    is_gemm=Const(0), is_alu=is_alu, is_finish=Const(0), looped=is_alu,
                    alu_src=kind_a["alu_src"], alu_inp=kind_a["alu_inp"], moves=Const(0))
        m.submodules.uop_mem = uop_mem = memory.Memory(shape=c.uop_bits, depth=c.uop_rows, init=[])
        bufs_g = _pipe_buffers(c, uop_mem.read_port(), "gemm")
        bufs_a = _pipe_buffers(c, uop_mem.read_port(), "alu")
        dma, load_over = self._loads(m, d_g, start_g, busy_g, uop_mem.write_port())
        done_loop_g, src_g, wgt_g = self._pipe(m, "gemm", d_g, start_g, busy_g, index_g, bufs_g, dma)
        done_loop_a, src_a, _ = self._pipe(m, "alu", d_a, start_a, busy_a, index_a, bufs_a, None)
        self._banks(m, bufs_g, bufs_a)
        # inp's read port serves the GEMM, or an ALU taking its operand from inp (never beside a GEMM). The pick
        # is an AND-OR: as a multiplexer, Yosys' opt_share moved it ahead of one sum of multiplexed operands,
        # and the two pipes' sums lay one after the other ahead of the port (tiny, after nextpnr at 1a2b4b4).
        alu_reads = (busy_a & d_a.alu_inp).replicate(len(self.inp_addr))
        m.d.comb += [self.inp_addr.eq((src_a & alu_reads) | (src_g & ~alu_reads)), self.wgt_addr.eq(wgt_g)]

        # FINISH, bus errors, completion.
        with m.If(busy_g & d_g.is_finish):
            m.d.sync += [self.finished.eq(1), self.finish_index.eq(index_g)]
        with m.If(dma.error & ~self.error):
            m.d.sync += [self.error.eq(1), self.error_code.eq(ErrorCode.BUS_ERROR), self.error_index.eq(index_g)]
        m.d.comb += [done_g.eq(busy_g & ((d_g.is_load & load_over) | done_loop_g | d_g.is_finish)),
                     done_a.eq(busy_a & done_loop_a)]
        return m

    def _issue(self, m: Module, done_g: Signal, done_a: Signal) -> tuple[_Slot, _Slot]:
        """In-order issue to the two pipes (spec "beside"): GEMM (and the unit's loads and FINISH, with both
        pipes idle) to the first, ALU to the second. The head starts when its tokens are there, its pipe is
        free and, unless it has beside set, the other pipe too. An instruction retires (pushes, frees its
        pipe) when done, but one that pushes not before the other pipe's older instruction has. Returns (instruction,
        index, start pulse, busy, the instruction's decodes) of each pipe."""
        head, head_alu = self.view(self.cmd.payload.insn, "finish"), self.view(self.cmd.payload.insn, "alu")
        # The pipe decodes come with the command (fetch worked them out): the start waits on no decoder.
        h_alu, beside = self.cmd.payload.alu, self.cmd.payload.beside
        ok = self.tokens_ready(m, head)
        busy_g, busy_a = Signal(), Signal()
        free = Mux(h_alu, ~busy_a & (beside | ~busy_g), ~busy_g & (beside | ~busy_a))
        waiting = self.cmd.valid & ~self.halt & free
        start = Signal()
        m.d.comb += [start.eq(waiting & ok), self.cmd.ready.eq(start), self.stall.eq(waiting & ~ok),
                     self.pending.eq(self.cmd.valid), self.head_index.eq(self.cmd.payload.index),
                     self.busy.eq(busy_g | busy_a), self.busy_gemm.eq(busy_g), self.busy_alu.eq(busy_a)]
        start_g, start_a = start & ~h_alu, start & h_alu
        young_g, young_a = Signal(), Signal()  # started while the other pipe's older instruction ran
        insns = [Signal(INSN_BITS, name="insn_gemm"), Signal(INSN_BITS, name="insn_alu")]
        current = [self.view(insns[0], "finish"), self.view(insns[1], "finish")]
        # Only a push tells another unit that the instructions before it are done: a younger instruction
        # without one retires (frees its pipe) when done, one with one not before the older one beside it.
        pushes = [reduce(operator.or_, [getattr(x, flag) for flag in self.flags if flag.startswith("push")],
                         Const(0)) for x in current]
        retire_g = busy_g & done_g & ~(young_g & busy_a & pushes[0])
        retire_a = busy_a & done_a & ~(young_a & busy_g & pushes[1])
        slots = []
        for name, insn, st, busy, young, retire, other_busy in (
                ("gemm", insns[0], start_g, busy_g, young_g, retire_g, busy_a),
                ("alu", insns[1], start_a, busy_a, young_a, retire_a, busy_g)):
            index = Signal.like(self.cmd.payload.index)
            # Loaded whenever the pipe is idle, as in UnitBase.gate (nothing reads it then), not at the start;
            # its opcode, where an ALU instruction takes its operand from and whether a load moves anything
            # decoded beside it, so the loop's launch and issue and the load's command (whose fanouts are every
            # loop register, every DMA command register) start from registers.
            decodes = {op.name.lower(): head.opcode == op for op in (Opcode.LOAD, Opcode.GEMM, Opcode.FINISH,
                                                                     Opcode.ALU)}
            decodes["alu"] = h_alu  # (fetch's decode, the one the start takes)
            decodes["alu_src"] = decodes["alu"] & ~head_alu.use_imm & ~head_alu.src_inp
            decodes["alu_inp"] = decodes["alu"] & ~head_alu.use_imm & head_alu.src_inp
            decodes["moves"] = self.view(self.cmd.payload.insn, "mem").x_size != 0
            kind = {what: Signal(name=f"{name}_is_{what}") for what in decodes}
            with m.If(~busy):
                m.d.sync += [insn.eq(self.cmd.payload.insn), index.eq(self.cmd.payload.index),
                             *[kind[what].eq(value) for what, value in decodes.items()]]
            with m.If(st):
                m.d.sync += [busy.eq(1), young.eq(other_busy)]
            with m.If(retire):
                m.d.sync += [busy.eq(0), young.eq(0)]
            slots.append((insn, index, st, busy, kind))
        with m.If(retire_a):  # the older one is gone: the next in its pipe is younger
            m.d.sync += young_g.eq(0)
        with m.If(retire_g):
            m.d.sync += young_a.eq(0)
        for flag, queue in self.flags.items():
            if flag.startswith("pop"):
                m.d.comb += getattr(self, f"{queue}_pop").eq(start & getattr(head, flag))
            else:
                m.d.comb += getattr(self, f"{queue}_push").eq((retire_g & getattr(current[0], flag))
                                                              | (retire_a & getattr(current[1], flag)))
        return slots[0], slots[1]

    def _pipe(self, m: Module, name: str, d: _Insn, start: Signal, busy: Signal, index: Signal, bufs: _Buffers,
              dma: Load2D | None) -> tuple[Value, Signal, Signal]:
        """One pipe (the GEMM's with the DMA's accumulator writes, or the ALU's): whether its instruction's
        loop is done, and its inp and wgt read addresses."""
        loop = self._loop_generator(m, d, start, busy, bufs)
        gemm = dma is not None
        valid = {s: Signal(name=f"{name}_valid_{s}") for s in ("ubcpdexyf" if gemm else "ubcdexyzf")}
        dst, src_c, reads_b, reads_c, slots, src_b, wgt_b = self._row_indices(m, d, index, bufs, loop, valid)
        new_f, out_f = self._datapath(m, d, bufs, valid, dst, src_b, src_c, reads_b, reads_c, slots, gemm=gemm)
        self._write_back(m, dma, bufs, valid, dst, new_f, out_f)
        drained = ~Cat(*valid.values()).any()
        return d.looped & loop.launched & ~loop.gen & drained, src_b, wgt_b

    def _banks(self, m: Module, g: _Buffers, a: _Buffers) -> None:
        """The accumulator as two banks, its lower and upper half, each with one read and one write port: a
        pipe's access goes to the bank of its row; where both use one bank (which only a program breaking the
        "beside" rule does) the GEMM pipe's read and the ALU pipe's write win. A read sees the writes before
        its cycle; the pipes forward their own writes since (:meth:`_datapath`)."""
        c = self.config
        half = acc_bank_rows(c)
        banks = []
        for b in range(2):
            mem = collision_free(memory.Memory(shape=c.acc_row_bits, depth=c.acc_rows - half if b else half,
                                               init=[]))
            m.submodules[f"acc_bank{b}"] = mem
            w = mem.write_port()
            banks.append((mem.read_port(), w))

        def upper(addr: Value) -> Value:
            return addr >= half

        def local(addr: Value) -> Value:
            return Mux(upper(addr), addr - half, addr)[:len(addr)]

        for b, (rp, wp) in enumerate(banks):
            g_reads = g.r_active & (upper(g.r_addr) == b)
            g_writes = g.w_en & (upper(g.w_addr) == b)
            a_writes = a.w_en & (upper(a.w_addr) == b)
            # (the ALU pipe's write selects: its enable is a register, the DMA's may be undefined in a
            # 4-state simulation until the DMA first runs)
            m.d.comb += [rp.addr.eq(Mux(g_reads, local(g.r_addr), local(a.r_addr))),
                         wp.en.eq(g_writes | a_writes), wp.addr.eq(Mux(a_writes, local(a.w_addr), local(g.w_addr))),
                         wp.data.eq(Mux(a_writes, a.w_data, g.w_data))]
            # The out buffer's write is registered twice, two cycles after F: each pipe's saturated row (the
            # saturation's compares and the pipes' multiplexers ahead of the block RAM's data inputs were among
            # tiny's longest paths after place and route, and with one register for both, the route from each
            # pipe's F register through the saturation to the bank's was 11.9 ns after nextpnr at 84408ed), then
            # the bank's. Only the store unit reads out, and not before the token the instruction pushes as it
            # ends (a cycle before the write lands, at the latest), then its instruction's start, its command and
            # the read's address: nothing sees the difference.
            out = self.out_w[b]
            g_out = g.o_en & (upper(g.o_addr) == b)
            m.d.sync += [out.en.eq(g_out | (a.o_en & (upper(a.o_addr) == b))),
                         out.addr.eq(Mux(g_out, local(g.o_addr), local(a.o_addr))),
                         out.data.eq(Mux(g_out, g.o_data, a.o_data))]
        # Each bank's read data registered as it leaves the RAM, with no logic before the register: a pipe
        # sees its read's row two cycles after its address, from the bank it addressed.
        read = [Signal(c.acc_row_bits, name=f"acc_read_{b}") for b in range(2)]
        m.d.sync += [reg.eq(read_data(m, rp, wp, garble=self.garble_collisions, name=f"acc_bank{b}"))
                     for b, (reg, (rp, wp)) in enumerate(zip(read, banks, strict=True))]
        for pipe in (g, a):
            sel, sel_1 = Signal(name=f"{pipe.r_addr.name}_bank"), Signal(name=f"{pipe.r_addr.name}_bank_1")
            m.d.sync += [sel.eq(upper(pipe.r_addr)), sel_1.eq(sel)]
            m.d.comb += pipe.r_data.eq(Mux(sel_1, read[1], read[0]))

    def _loads(self, m: Module, d: _Insn, start: Signal, busy: Signal, uop_w: memory.WritePort
               ) -> tuple[Load2D, Value]:
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
        over = request_dma_once(m, dma, busy & d.is_load, d.mem, start, d.moves, target=target)
        m.d.comb += [
            uop_w.en.eq(dma.write.en & (dma.write.target == _UOP)),
            uop_w.addr.eq(dma.write.addr), uop_w.data.eq(dma.write.data),
        ]
        return dma, over

    def _loop_generator(self, m: Module, d: _Insn, start: Signal, busy: Signal, bufs: _Buffers) -> _Loop:
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
        # Whether k, j and i stand at their last values, kept in registers beside them and worked out a cycle
        # ahead from limits registered at launch (k + 1 == uop_end - 1 is k == uop_end - 2): the comparisons
        # with the instruction's fields and their carries were tiny's longest paths into the counters.
        # (Fetch's UOP_RANGE check makes uop_bgn < uop_end; iter_out and iter_in are not 0 while gen is 1.)
        ends = {name: Signal(name=f"{name}_end") for name in "kji"}
        singles = {name: Signal(name=f"{name}_single") for name in "kj"}  # what ends[k], ends[j] restart from
        stops = {"k": Signal.like(k, name="k_stop"), "j": Signal.like(j, name="j_stop"),
                 "i": Signal.like(i, name="i_stop")}
        # Without src loop factors each micro-op reads the same src row in every execution: with at most
        # SRC_ROWS micro-ops the first sweep reads them into registers and the rest issue back to back.
        kept = Signal()
        first_sweep = Signal()  # i == j == 0
        k_rel = Signal(range(SRC_ROWS))  # k - uop_bgn, while it is below SRC_ROWS
        with m.If(busy & d.looped & ~launched):
            m.d.sync += [launched.eq(1), gen.eq((iter_out != 0) & (iter_in != 0)), k.eq(uop_bgn),
                         i.eq(0), j.eq(0), aborted.eq(0), last.eq(0),
                         ends["i"].eq(iter_out == 1),
                         stops["k"].eq(uop_end - 2), stops["j"].eq(iter_in - 2), stops["i"].eq(iter_out - 2),
                         kept.eq(holds_src_rows(*factors["src"], uop_end - uop_bgn)), first_sweep.eq(1),
                         k_rel.eq(0)]
            for out_off, in_off in offs.values():
                m.d.sync += [out_off.eq(0), in_off.eq(0)]
            for name, single in (("k", uop_bgn + 1 == uop_end), ("j", iter_in == 1)):
                m.d.sync += [ends[name].eq(single), singles[name].eq(single)]
        with m.If(start):
            m.d.sync += launched.eq(0)
        m.d.comb += bufs.uop_r.addr.eq(k)
        reads = d.alu_src & ~(kept & ~first_sweep)
        slot = Signal(range(SRC_ROWS))  # the register of the execution's src row
        m.d.comb += slot.eq(Mux(kept, k_rel, 0))
        assert ALU_SRC_INTERVAL == 2  # a read of acc[src] waits one cycle after any issue
        # (gen falls as aborted rises, _row_indices: the issue, whose fan-out is every counter and offset, does
        # not wait on aborted too; from aborted through it into i's end flag was 10.3 ns after nextpnr at bc13940)
        issue = gen & ~(reads & last)
        m.d.sync += last.eq(issue)
        with m.If(issue):
            with m.If(ends["k"]):
                m.d.sync += [k.eq(uop_bgn), ends["k"].eq(singles["k"]), k_rel.eq(0), first_sweep.eq(0)]
                with m.If(ends["j"]):
                    m.d.sync += [j.eq(0), ends["j"].eq(singles["j"])]
                    for name, (out_off, in_off) in offs.items():
                        m.d.sync += [in_off.eq(0), out_off.eq(out_off + factors[name][0])]
                    with m.If(ends["i"]):
                        m.d.sync += gen.eq(0)
                    with m.Else():
                        m.d.sync += [i.eq(i + 1), ends["i"].eq(i == stops["i"])]
                with m.Else():
                    m.d.sync += [j.eq(j + 1), ends["j"].eq(j == stops["j"])]
                    for name, (_, in_off) in offs.items():
                        m.d.sync += in_off.eq(in_off + factors[name][1])
            with m.Else():
                m.d.sync += [k.eq(k + 1), ends["k"].eq(k == stops["k"]), k_rel.eq(k_rel + 1)]
        return _Loop(launched, gen, aborted, issue, reads, slot, offs, off_bits)

    def _row_indices(self, m: Module, d: _Insn, index: Signal, bufs: _Buffers, loop: _Loop,
                     valid: dict[str, Signal]
                     ) -> tuple[dict[str, Signal], Signal, Signal, Signal, dict[str, Signal], Signal, Signal]:
        """Stages U and B: the micro-op's rows plus the loop offsets, range-checked (an execution past a buffer's
        end aborts the loop with LOOP_RANGE). Returns the dst row registers of the later stages, the src row
        of stage C, whether B's and C's executions read acc[src], the slots, and the inp and wgt read addresses
        (B's src row is inp's)."""
        c = self.config
        off_u, off_b = ({name: Signal(loop.off_bits + 1, name=f"{name}_off_{s}") for name in loop.offs} for s in "ub")
        reads_u, reads_b, reads_c = Signal(), Signal(), Signal()
        slots = {s: Signal.like(loop.slot, name=f"slot_{s}") for s in "ubcd"}
        m.d.sync += [valid["u"].eq(loop.issue), reads_u.eq(loop.reads), slots["u"].eq(loop.slot),
                     valid["b"].eq(valid["u"]), reads_b.eq(reads_u), slots["b"].eq(slots["u"]),
                     reads_c.eq(reads_b), slots["c"].eq(slots["b"])]
        for name, (out_off, in_off) in loop.offs.items():
            m.d.sync += [off_u[name].eq(out_off + in_off), off_b[name].eq(off_u[name])]
        # The micro-op word is registered as it leaves the block RAM (U): the RAM's output time and the sums
        # into inp's and wgt's read addresses were tiny's longest path after place and route.
        word_b = Signal.like(bufs.uop_r.data)
        m.d.sync += word_b.eq(bufs.uop_r.data)
        uop = data.View(self.layout.uop.as_struct_layout(), word_b)
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
        # The check's verdict is registered (the sum and the compare fill B): an execution out of range is
        # dropped in C, and so is the one behind it, which B holds then; the loop stops from the cycle after,
        # and what it issued until then (in U, and one more) finds it aborted in B and is dropped too.
        bad_c, issued_c = Signal(), Signal()
        m.d.sync += bad_c.eq(valid["b"] & bad & ~loop.aborted)
        with m.If(bad_c):
            m.d.sync += [loop.aborted.eq(1), loop.gen.eq(0)]
            with m.If(~self.error):
                m.d.sync += [self.error.eq(1), self.error_code.eq(ErrorCode.LOOP_RANGE),
                             self.error_index.eq(index)]
        dst = {s: Signal(c.acc_index_bits, name=f"dst_{s}") for s in "cdexyzf"}
        src_c = Signal(c.acc_index_bits)
        m.d.sync += [issued_c.eq(valid["b"] & ~loop.aborted & ~bad_c), dst["c"].eq(dst_b), src_c.eq(src_b)]
        m.d.comb += valid["c"].eq(issued_c & ~bad_c)
        return dst, src_c, reads_b, reads_c, slots, src_b, wgt_b

    def _datapath(self, m: Module, d: _Insn, bufs: _Buffers, valid: dict[str, Signal], dst: dict[str, Signal],
                  src_b: Value, src_c: Signal, reads_b: Signal, reads_c: Signal, slots: dict[str, Signal], *,
                  gemm: bool) -> tuple[Signal, Signal]:
        """Stages C, P (the GEMM pipe's), D and E (the GEMM core; accumulator reads), X and Y (acc + sum in the
        GEMM pipe, the ALU op in the ALU pipe). Returns the new accumulator row of stage F, and the same row as
        the out buffer's saturation takes it (equal to it while F holds an execution)."""
        c = self.config
        assert GEMM_LATENCY == ALU_READ_STAGES + 1  # the GEMM pipe's C, P, D and E; the ALU pipe's C, D and E
        # the ALU's X, Y and Z; its late ops' results, out of Z's logic, are the ones spec "hazard" keeps three
        # executions off (handed back from F's register, not from Z)
        assert ALU_STAGES == 3 and hazard_reach(Opcode.ALU, AluOp.RQ) == ALU_STAGES == 3
        if gemm:
            m.submodules.gemm = core = GemmCore(batch=c.batch, block_in=c.block_in, block_out=c.block_out,
                                                inp_width=c.inp_width, wgt_width=c.wgt_width, dsp=self.dsp)
            m.d.comb += [core.inp.eq(self.inp_data), core.wgt.eq(self.wgt_data),
                         self.mac_active.eq(valid["c"] & d.is_gemm & ~d.gemm.reset)]
            # The core registers its operands in C: the execution enters D a stage later, from P.
            dst_p = Signal.like(dst["c"])
            m.d.sync += [valid["p"].eq(valid["c"]), dst_p.eq(dst["c"])]
            enter_valid, enter_dst = valid["p"], dst_p
        else:
            m.d.comb += self.alu_active.eq(valid["c"] & d.is_alu)
            enter_valid, enter_dst = valid["c"], dst["c"]
        src_d = Signal.like(src_c)
        reads_d = Signal()
        m.d.sync += [valid["d"].eq(enter_valid), dst["d"].eq(enter_dst), src_d.eq(src_c),
                     reads_d.eq(valid["c"] & reads_c), slots["d"].eq(slots["c"])]
        # The accumulator is read a stage ahead of the data's use, acc[src] in B and acc[dst] as the execution
        # enters the pipe (C, or the GEMM's P), and the banks' read data are registered as they leave the
        # block RAMs (:meth:`_banks`): the RAMs' output time and the multiplexers after it were tiny's
        # longest path. In B an ALU execution that reads acc[src] reads it; C is empty then (it issued a cycle
        # after the one before it). An execution dropped in C may have read: reads have no effect.
        m.d.comb += [
            bufs.r_addr.eq(Mux(valid["b"] & reads_b, src_b, enter_dst)),
            bufs.r_active.eq((valid["b"] & reads_b) | enter_valid),
        ]
        new_f = Signal(c.acc_row_bits)
        # The read sees the writes before its own cycle (the RAMs are not transparent: that too was logic after
        # their output). F's writes in the read's cycle and the one after, which the data miss, are taken from
        # `new_f_2` and `new_f_1` (new_f two and one cycles late) where F wrote the row read: flags worked out
        # as F writes and carried to the stage that takes the data (D for src, E for dst).
        new_f_1, new_f_2 = Signal.like(new_f), Signal.like(new_f)
        src_written_2, src_written_1, src_written = Signal(), Signal(), Signal()
        dst_written_2 = Signal()  # (and its next two cycles': the picks of acc[dst] below)
        m.d.sync += [new_f_1.eq(new_f), new_f_2.eq(new_f_1),
                     src_written_2.eq(valid["f"] & (dst["f"] == src_b[:len(src_c)])), src_written_1.eq(src_written_2),
                     src_written.eq(valid["f"] & (dst["f"] == src_c)),
                     dst_written_2.eq(valid["f"] & (dst["f"] == enter_dst))]
        # acc[src], read in B (or written by F since), latched in D with its row in the execution's slot; it
        # serves X until the slot's next read, which D latches after the last execution using this one has
        # passed X (a read waits a cycle after any issue). Every F write to a held row lands in its register,
        # and X takes the one F writes in its own cycle: an execution sees the writes two or more ahead of
        # it, as with dst.
        # Whether F writes a row in a cycle is worked out the cycle before, from the stage before F and the
        # row's number as it will be, and registered (`f_writes`): the compares of F's row number ahead of
        # these registers' enables and multiplexers (every bit of every held row) were tiny's longest path
        # after place and route at 81.0 MHz.
        before_f = "z" if not gemm else "y"

        def f_writes(row_next: Value, name: str) -> Signal:
            flag = Signal(name=f"f_writes_{name}")
            m.d.sync += flag.eq(valid[before_f] & (dst[before_f] == row_next))
            return flag

        held = [Signal(c.acc_row_bits, name=f"src_row_{n}") for n in range(SRC_ROWS)]
        held_at = [Signal.like(src_c, name=f"src_at_{n}") for n in range(SRC_ROWS)]
        src_read = Mux(f_writes(src_c, "src_d"), new_f,
                       Mux(src_written, new_f_1, Mux(src_written_1, new_f_2, bufs.r_data)))
        # (Whether F writes a slot's row is worked out for both row numbers it may hold next, and the fill,
        # registered beside them, picks one: the fill through a row-number multiplexer into the compare was one
        # of tiny's longest paths after nextpnr at 98777fe.)
        writes_src_d = f_writes(src_d, "src_d_next")
        # Which slot D's execution has, and whether it fills it, as registers one per slot, compared from C's:
        # the slot's compares ahead of every held row's enable (slot_d into src_row_N, 30 bits) and ahead of
        # the written flag's pick (slot_d into src_from_3) failed 100 MHz after nextpnr at 7f9ca06.
        in_slot = [Signal(name=f"in_slot_{n}") for n in range(SRC_ROWS)]
        fill = [Signal(name=f"fills_{n}") for n in range(SRC_ROWS)]
        for n in range(SRC_ROWS):
            at_n = slots["c"] == n
            m.d.sync += [in_slot[n].eq(at_n), fill[n].eq(valid["c"] & reads_c & at_n)]
        written_rows = []
        for n in range(SRC_ROWS):
            fills, filled = fill[n], Signal(name=f"filled_{n}")
            m.d.sync += filled.eq(fills)
            writes_held = f_writes(held_at[n], f"held_at_{n}")
            written = (filled & writes_src_d) | (~filled & writes_held)
            written_rows.append(written)
            with m.If(fills):
                m.d.sync += [held[n].eq(src_read), held_at[n].eq(src_d)]
            with m.Elif(written):
                m.d.sync += held[n].eq(new_f)
        # The execution's slot's row as E will have it (its register after D's cycle), picked in D and
        # registered: the slot's multiplexer over every held row lay ahead of E's operand multiplexers and the
        # route to the multipliers (slot_e into the DSPs' input registers: 10.7 ns after nextpnr at 84408ed).
        # Where F writes the row in D's cycle, E takes that write (new_f a cycle late) by a registered pick
        # (the operand's, below): the flag's pick by the slot, ahead of a multiplexer over the whole row, was
        # 14.9 ns at 87b8b6c.
        held_e = Signal(c.acc_row_bits, name="src_row_e")
        m.d.sync += held_e.eq(Mux(reads_d, src_read, select(held, slots["d"])))
        # (a tree of Muxes rather than a Switch: continuous assignments, which 4-state simulators evaluate
        # from time 0 on, where a combinational process whose inputs never change may never run)
        # X takes its operands from registers alone: E chooses them and registers them. acc[src] comes from
        # the slot's register as it will be in X (with the row F writes in E's cycle, which lands in the
        # register then; the slot's row does not change between E and X: its next read waits until X is
        # past). The rows the executions ahead hand over in X's cycle (F's write, and in the ALU pipe Z's row)
        # E takes as it has them: what the stage before F makes in E's cycle (the GEMM pipe's `f_next`, new_f's
        # next value; in the ALU pipe Z's register `row_z`, which is new_f's next value for every op but SHR,
        # MUL and RQ), and what Y makes then (`row_y`, Z's register next). Whether a
        # row is the one an execution ahead writes is worked out in D from the stages a step further back,
        # and registered. The forwarding multiplexers in X, ahead of the ALU's compare and of the
        # accumulate, were among tiny's longest paths.
        f_in_d = "y" if not gemm else "x"  # where, in D's cycle, the execution is that F holds in X's
        f_next = Signal(c.acc_row_bits)
        row_y = Signal(c.acc_row_bits)
        row_z = Signal(c.acc_row_bits)  # (the ALU pipe) Z's row: every op's result but SHR's, MUL's and RQ's
        handed_f = f_next if gemm else row_z  # what F will write, as E takes it
        # acc[dst] from Y (ALU: two ahead, Z's in X's cycle) before Z (three ahead, F's), before F's writes
        # (in E's, D's and C's cycles), before the row read: which one, worked out in D and registered one-hot,
        # and the row taken by AND-OR (the priority chain of six multiplexers after the flags, ahead of the
        # ALU's multipliers' inputs, was one of tiny's longest paths after nextpnr at 347985d).
        # Whether a later stage's row number equals D's in D's cycle is compared a cycle earlier, from the
        # registers that move into both (every stage's row number moves on each cycle), and registered: D's
        # picks start from flags (the compares ahead of the picks' priority failed 100 MHz after nextpnr at
        # 66d9af1).
        moves_into = {"x": "e", "y": "x", "z": "y", "f": before_f}

        def same_in_d(stage: str, row_next: Value, name: str) -> Value:
            flag = Signal(name=f"{name}_is_{stage}")
            m.d.sync += flag.eq(dst[moves_into[stage]] == row_next)
            return valid[stage] & flag

        from_y = same_in_d("x", enter_dst, "dst_d") if not gemm else Const(0)
        dst_picks = _one_hot(m, [from_y, same_in_d(f_in_d, enter_dst, "dst_d"),
                                 same_in_d(before_f, enter_dst, "dst_d"), same_in_d("f", enter_dst, "dst_d"),
                                 dst_written_2, Const(1)], "dst_from")
        old_x, old_e = Signal(c.acc_row_bits), Signal(c.acc_row_bits)  # acc[dst] as X has it; as E hands it on
        m.d.comb += old_e.eq(_picked(m, [row_y, handed_f, new_f, new_f_1, new_f_2, bufs.r_data], dst_picks,
                                     old_e.shape()))
        m.d.sync += [valid["e"].eq(valid["d"]), dst["e"].eq(dst["d"]), valid["x"].eq(valid["e"]),
                     dst["x"].eq(dst["e"]), valid["y"].eq(valid["x"]), dst["y"].eq(dst["x"]),
                     old_x.eq(old_e), new_f.eq(f_next)]
        # The row F writes, again, for the out buffer's saturation alone: it loads only for an execution, so
        # Yosys keeps it apart from new_f, whose fan-out is every forward and held row (new_f through the
        # saturation into the out write's register was routed across the die: 10.3 ns after nextpnr at bc13940).
        out_f = Signal(c.acc_row_bits)
        with m.If(valid[before_f]):
            m.d.sync += out_f.eq(f_next)

        lanes, w = c.batch * c.block_out, c.acc_width
        old = elements(old_x, w)
        if gemm:
            sums = elements(core.sums, core.sum_bits)
            m.d.sync += [row_y.eq(Cat(*[Mux(d.gemm.reset, 0, (Mux(d.gemm.overwrite, 0, old[n]) + sums[n])[:w])
                                        for n in range(lanes)])),
                         valid["f"].eq(valid["y"]), dst["f"].eq(dst["y"])]
            m.d.comb += f_next.eq(row_y)
            return new_f, out_f

        # inp[src], read in C like the GEMM's rows, travels to E for an ALU execution that takes it. In E each
        # lane's operand is chosen (acc[src] as the slot's register has it or an execution ahead hands it
        # over, the immediate or its inp lane) and registered.
        inp_d, inp_e = (Signal(c.inp_row_bits, name=f"inp_{s}") for s in "de")
        m.d.sync += [inp_d.eq(self.inp_data), inp_e.eq(inp_d)]
        inp_lanes = elements(inp_e, c.inp_width)
        alu_f = d.alu
        imm = alu_f.imm.as_signed()
        # A register (decoded beside the instruction's): it selects every lane's operand.
        takes_src = d.alu_src
        # The opcode's decodes, registered too (the instruction's fields are there cycles before its first
        # execution reaches X): X, Y and Z select with them in every lane.
        selects = {name: Signal(name=f"alu_{name}") for name in alu_selects(alu_f.alu_op)}
        m.d.sync += [selects[name].eq(value) for name, value in alu_selects(alu_f.alu_op).items()]
        # Two executions ahead, in Z in X's cycle, is a result of every op but SHR, MUL and RQ (spec "hazard"
        # keeps those from it): Y's row in E's cycle, as F's in X's is Z's register in E's.
        # The operand's source, in order: Y's row, Z's (as F's), F's write in D's or C's cycle to the src row,
        # the slot's register (where the op takes acc[src]), the immediate, the inp lane; worked out in D and
        # registered one-hot, and each lane's operand taken by AND-OR (as acc[dst] above: the priority chain
        # lay ahead of the multipliers' inputs). acc[src]'s row number is the execution's src index (src_d in
        # D) whether it reads the row or its slot holds it: a slot holds a micro-op's row, which without src
        # loop factors is the same in every sweep. (Selected from the slots' row numbers, it lay ahead of the
        # compares on tiny's longest paths.)
        src_picks = _one_hot(m, [takes_src & same_in_d("x", src_c, "src_d"),
                                 takes_src & same_in_d(f_in_d, src_c, "src_d"),
                                 takes_src & same_in_d(before_f, src_c, "src_d"),
                                 takes_src & ~reads_d & _picked(m, written_rows, in_slot, 1), takes_src,
                                 alu_f.use_imm, Const(1)], "src_from")
        from_y, from_f, held = elements(row_y, w), elements(handed_f, w), elements(held_e, w)
        late_f, late_f_1 = elements(new_f, w), elements(new_f_1, w)
        parts_y: list[list[Signal]] = []  # MUL's and RQ's partial products, registered in Y
        parts_z: list[list[Signal]] = []  # and what Y makes of them, registered in Z
        rows_y = []  # the first stage's result in Y: MIN's and MAX's select made there (AluFirst)
        for n in range(lanes):
            row, lane = divmod(n, c.block_out)  # lane o of batch row b takes inp lane o mod block_in
            inp_lane = inp_lanes[row * c.block_in + lane % c.block_in]
            sources = [from_y[n], from_f[n], late_f[n], late_f_1[n], held[n], imm, inp_lane]
            shape = Mux(Const(0), from_y[n], Mux(Const(0), imm, inp_lane)).shape()  # (the multiplexers' shape)
            operand_x_e = _picked(m, sources, src_picks, shape)
            rhs = Signal(operand_x_e.shape(), name=f"operand_{n}")
            top = multiplier_top(selects, operand_x_e, w)
            rhs_top = Signal(top.shape(), name=f"operand_top_{n}")
            m.d.sync += [rhs.eq(operand_x_e), rhs_top.eq(top)]
            products = None
            if self.dsp.registered is not None:  # X's products, their operands registered in the multipliers
                pairs = alu_multiplicands(elements(old_e, w)[n], operand_x_e, top, w)
                products = [registered_product(m, x, y, primitive=self.dsp.registered, model=self.dsp.model,
                                               name=f"alu_mul_{k}_{n}") for k, (x, y) in enumerate(pairs)]
            first = alu_lane_first(m, selects, old[n], rhs, w, top=rhs_top, products=products)
            parts_y.append([Signal(part.shape(), name=f"mul_{k}_{n}") for k, part in enumerate(first.parts)])
            m.d.sync += [reg.eq(part) for reg, part in zip(parts_y[n], first.parts, strict=True)]
            in_y = AluFirst(Signal(w, name=f"kept_{n}"), Signal(name=f"takes_operand_{n}"), parts_y[n])
            rhs_y = Signal.like(rhs, name=f"operand_y_{n}")
            m.d.sync += [in_y.kept.eq(first.kept), in_y.takes_operand.eq(first.takes_operand), rhs_y.eq(rhs)]
            rows_y.append(in_y.result(rhs_y))
            mids = alu_lane_mid(m, selects, in_y.kept, in_y.parts, w)
            parts_z.append([Signal(part.shape(), name=f"shift_{k}_{n}") for k, part in enumerate(mids)])
            m.d.sync += [reg.eq(part) for reg, part in zip(parts_z[n], mids, strict=True)]
        m.d.comb += row_y.eq(Cat(*rows_y))
        m.d.sync += [row_z.eq(row_y), valid["z"].eq(valid["y"]), dst["z"].eq(dst["y"])]
        m.d.comb += f_next.eq(Cat(*[alu_lane_last(m, selects, row_z.word_select(n, w), parts_z[n], w)
                                    for n in range(lanes)]))
        m.d.sync += [valid["f"].eq(valid["z"]), dst["f"].eq(dst["z"])]
        return new_f, out_f

    def _write_back(self, m: Module, dma: Load2D | None, bufs: _Buffers, valid: dict[str, Signal],
                    dst: dict[str, Signal], new_f: Signal, out_f: Signal) -> None:
        """Stage F: write acc[dst] and out[dst] = saturate(acc[dst]); while a load runs (in the GEMM pipe), it
        writes the accumulator instead."""
        c = self.config
        if dma is None:
            m.d.comb += [bufs.w_en.eq(valid["f"]), bufs.w_addr.eq(dst["f"]), bufs.w_data.eq(new_f)]
        else:
            # The load's write and the pipe's never meet: a load starts with the pipe drained, and the DMA
            # writes only while its instruction runs (its last write in the cycle the instruction is done). So
            # the DMA's write enable, a register, picks: as the load's busy (busy & is_load, a LUT and a long
            # route ahead of the pick) it lay on the way into both banks' write address after nextpnr at
            # de4d77b (seed 4, and within 1 ns of the clock with the default seed).
            loading = dma.write.en
            narrow = sign_extend_row(dma.write.data[:c.out_row_bits], c.out_width, c.acc_width)
            m.d.comb += [
                bufs.w_en.eq((loading & (dma.write.target != _UOP)) | valid["f"]),
                bufs.w_addr.eq(Mux(loading, dma.write.addr, dst["f"])),
                bufs.w_data.eq(Mux(loading, Mux(dma.write.target == _ACC, dma.write.data[:c.acc_row_bits], narrow),
                                   new_f)),
            ]
        m.d.sync += [bufs.o_en.eq(valid["f"]), bufs.o_addr.eq(dst["f"]),
                     bufs.o_data.eq(saturate_row(out_f, c.acc_width, c.out_width))]


def _one_hot(m: Module, conditions: list[Value], name: str) -> list[Signal]:
    """Registers, one per condition, of which the first whose condition holds is high (the last condition is
    Const(1) where one must be)."""
    picks, before = [], Const(0)
    for k, condition in enumerate(conditions):
        pick = Signal(name=f"{name}_{k}")
        m.d.sync += pick.eq(condition & ~before)
        picks.append(pick)
        before = before | condition
    return picks


def _picked(m: Module, values: list[Value], picks: list[Signal], shape: object) -> Value:
    """The value whose one-hot pick is high, each extended to `shape` as its own shape says, by AND-OR."""
    terms = []
    for value, pick in zip(values, picks, strict=True):
        wide = Signal(shape)
        m.d.comb += wide.eq(value)
        terms.append(wide.as_unsigned() & pick.replicate(len(wide)))
    taken = reduce(operator.or_, terms)
    return taken.as_signed() if wide.shape().signed else taken
