"""The compute unit: micro-op and accumulator loads, the GEMM/ALU loop pipeline, FINISH.

It owns the micro-op buffer and the accumulator. A GEMM or ALU instruction is the two-level loop of the
spec (``for i < iter_out, j < iter_in, k in [uop_bgn, uop_end)``); the loop generator issues one micro-op
execution per cycle into a pipeline that never stalls:

====  ==========================================================================================
A     loop generator: micro-op address, loop offsets
B     micro-op word: row indices (range-checked); inp and wgt read addresses
C     inp and wgt rows: the GEMM core's products
D     the GEMM core's adder tree; accumulator read addresses (dst, and src for the ALU)
E     accumulator rows: acc + sum (GEMM) or op(acc[dst], acc[src] or imm) (ALU)
F     write acc[dst] and out[dst] = saturate(acc[dst])
====  ==========================================================================================

The accumulator read ports are transparent to its write port, so an execution reads (in D) what the one
two ahead of it writes (in F) in the same cycle: a read-after-write at distance 2 or more sees the new
value. Distance 1 is the hazard the spec forbids. Each instruction drains the pipeline before it ends,
so the next one (and the tokens it pushes) see every write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from weft.hw.axi import ADDR_BITS, read_client_signature
from weft.hw.datapath import GEMM_LATENCY, GemmCore, alu_lane, elements, saturate_row, sign_extend_row
from weft.hw.dma import Load2D
from weft.hw.regs import ErrorCode
from weft.hw.unit import UnitBase, request_dma_once
from weft.isa.constants import MemId, Opcode
from weft.isa.encoding import layout_of

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["ComputeUnit"]

# Load2D targets of the compute unit, by position.
_UOP, _ACC, _ACC_NARROW = range(3)


class ComputeUnit(UnitBase):
    """LOAD UOP/ACC/ACC_NARROW, GEMM, ALU and FINISH. Reads inp and wgt, writes out."""

    def __init__(self, config: AcceleratorConfig):
        c = config
        self.config = c
        self.layout = layout_of(c)
        super().__init__(
            flags={"pop_prev": "l2g", "pop_next": "s2g", "push_prev": "g2l", "push_next": "g2s"},
            members={
                "bus": Out(read_client_signature(addr_bits=ADDR_BITS, data_bits=c.bus_width)),
                "inp_addr": Out(c.inp_index_bits), "inp_data": In(c.inp_row_bits),
                "wgt_addr": Out(c.wgt_index_bits), "wgt_data": In(c.wgt_row_bits),
                "out_w": Out(data.StructLayout({"en": 1, "addr": c.acc_index_bits, "data": c.out_row_bits})),
                "finished": Out(1), "finish_index": Out(32),
                "error": Out(1), "error_code": Out(8), "error_index": Out(32),
                "mac_active": Out(1), "alu_active": Out(1),
            },
        )

    def elaborate(self, platform: object) -> Module:
        m = Module()
        c, layout = self.config, self.layout
        done = Signal()
        insn, index, start = self.gate(m, layout.formats["finish"].as_struct_layout(), done)
        head = data.View(layout.formats["finish"].as_struct_layout(), insn)
        mem_f = data.View(layout.formats["mem"].as_struct_layout(), insn)
        gemm_f = data.View(layout.formats["gemm"].as_struct_layout(), insn)
        alu_f = data.View(layout.formats["alu"].as_struct_layout(), insn)
        is_load = head.opcode == Opcode.LOAD
        is_gemm = head.opcode == Opcode.GEMM
        is_alu = head.opcode == Opcode.ALU
        is_finish = head.opcode == Opcode.FINISH

        # ---- buffers owned by this unit ---------------------------------------------------------------
        m.submodules.uop_mem = uop_mem = memory.Memory(shape=c.uop_bits, depth=c.uop_rows, init=[])
        m.submodules.acc_mem = acc_mem = memory.Memory(shape=c.acc_row_bits, depth=c.acc_rows, init=[])
        uop_w = uop_mem.write_port()
        uop_r = uop_mem.read_port()
        acc_w = acc_mem.write_port()
        acc_rd = acc_mem.read_port(transparent_for=(acc_w,))
        acc_rs = acc_mem.read_port(transparent_for=(acc_w,))

        # ---- loads ------------------------------------------------------------------------------------
        m.submodules.dma = dma = Load2D(
            bus_bytes=c.bus_width // 8, targets=(c.uop_bits // 8, c.acc_row_bits // 8, c.out_row_bits // 8),
            sram_bits=layout.sram_bits, size_bits=layout.size_bits)
        wiring.connect(m, wiring.flipped(self.bus), dma.bus)
        load_over = request_dma_once(m, dma, self.busy & is_load, mem_f.x_size, start)
        target = Mux(mem_f.mem_id == MemId.UOP, _UOP, Mux(mem_f.mem_id == MemId.ACC, _ACC, _ACC_NARROW))
        m.d.comb += [
            dma.cmd.payload.target.eq(target),
            *[getattr(dma.cmd.payload, name).eq(getattr(mem_f, name)) for name in (
                "sram_base", "dram_base", "y_size", "x_size", "x_stride", "y_pad_0", "y_pad_1", "x_pad_0",
                "x_pad_1")],
            uop_w.en.eq(dma.write.en & (dma.write.target == _UOP)),
            uop_w.addr.eq(dma.write.addr), uop_w.data.eq(dma.write.data),
        ]
        load_done = is_load & load_over

        # ---- loop generator (stage A) ----------------------------------------------------------------
        gemm = is_gemm
        launched = Signal()
        gen = Signal()
        aborted = Signal()
        k = Signal(c.uop_index_bits + 1)
        i = Signal(layout.iter_bits)
        j = Signal(layout.iter_bits)
        off_bits = max(c.acc_index_bits, c.inp_index_bits, c.wgt_index_bits) + layout.iter_bits + 1
        offs = {name: (Signal(off_bits, name=f"{name}_out"), Signal(off_bits, name=f"{name}_in"))
                for name in ("dst", "src", "wgt")}
        def either(name: str) -> Mux:  # a loop field, from the format of the current instruction
            return Mux(gemm, getattr(gemm_f, name), getattr(alu_f, name))

        factors = {
            "dst": (either("dst_factor_out"), either("dst_factor_in")),
            "src": (either("src_factor_out"), either("src_factor_in")),
            "wgt": (gemm_f.wgt_factor_out, gemm_f.wgt_factor_in),
        }
        uop_bgn, uop_end = either("uop_bgn"), either("uop_end")
        iter_out, iter_in = either("iter_out"), either("iter_in")
        looped = is_gemm | is_alu
        with m.If(self.busy & looped & ~launched):
            m.d.sync += [launched.eq(1), gen.eq((iter_out != 0) & (iter_in != 0)), k.eq(uop_bgn),
                         i.eq(0), j.eq(0), aborted.eq(0)]
            for out_off, in_off in offs.values():
                m.d.sync += [out_off.eq(0), in_off.eq(0)]
        with m.If(start):
            m.d.sync += launched.eq(0)
        m.d.comb += uop_r.addr.eq(k)
        issue = gen & ~aborted
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

        # ---- stage B: row indices ----------------------------------------------------------------------
        valid = {s: Signal(name=f"valid_{s}") for s in "bcdef"}
        off_b = {name: Signal(off_bits + 1, name=f"{name}_off_b") for name in offs}
        m.d.sync += valid["b"].eq(issue)
        for name, (out_off, in_off) in offs.items():
            m.d.sync += off_b[name].eq(out_off + in_off)
        uop = data.View(layout.uop.as_struct_layout(), uop_r.data)
        idx_bits = off_bits + 2
        dst_b, src_b, wgt_b = (Signal(idx_bits, name=f"{n}_b") for n in ("dst", "src", "wgt"))
        m.d.comb += [dst_b.eq(uop.dst + off_b["dst"]), src_b.eq(uop.src + off_b["src"]),
                     wgt_b.eq(uop.wgt + off_b["wgt"])]
        reads_inp = is_gemm & ~gemm_f.reset
        reads_acc_src = is_alu & ~alu_f.use_imm
        bad = Signal()
        m.d.comb += bad.eq(
            (dst_b >= c.acc_rows)
            | (reads_inp & ((src_b >= c.inp_rows) | (wgt_b >= c.wgt_rows)))
            | (reads_acc_src & (src_b >= c.acc_rows)))
        m.d.comb += [self.inp_addr.eq(src_b), self.wgt_addr.eq(wgt_b)]
        with m.If(valid["b"] & bad & ~aborted):
            m.d.sync += aborted.eq(1)
            with m.If(~self.error):
                m.d.sync += [self.error.eq(1), self.error_code.eq(ErrorCode.LOOP_RANGE),
                             self.error_index.eq(index)]
        dst = {s: Signal(c.acc_index_bits, name=f"dst_{s}") for s in "cdef"}
        src = {s: Signal(c.acc_index_bits, name=f"src_{s}") for s in "cd"}
        m.d.sync += [valid["c"].eq(valid["b"] & ~bad & ~aborted), dst["c"].eq(dst_b), src["c"].eq(src_b)]

        # ---- stages C, D: GEMM core; accumulator read addresses ----------------------------------------
        m.submodules.gemm = core = GemmCore(batch=c.batch, block_in=c.block_in, block_out=c.block_out,
                                            inp_width=c.inp_width, wgt_width=c.wgt_width)
        assert GEMM_LATENCY == 2  # C and D
        m.d.comb += [core.inp.eq(self.inp_data), core.wgt.eq(self.wgt_data)]
        m.d.sync += [valid["d"].eq(valid["c"]), dst["d"].eq(dst["c"]), src["d"].eq(src["c"])]
        m.d.comb += [
            self.mac_active.eq(valid["c"] & is_gemm & ~gemm_f.reset),
            self.alu_active.eq(valid["c"] & is_alu),
            acc_rd.addr.eq(dst["d"]), acc_rs.addr.eq(src["d"]),
        ]

        # ---- stage E: combine ----------------------------------------------------------------------------
        m.d.sync += [valid["e"].eq(valid["d"]), dst["e"].eq(dst["d"])]
        lanes = c.batch * c.block_out
        old = elements(acc_rd.data, c.acc_width)
        sums = elements(core.sums, core.sum_bits)
        operand = elements(acc_rs.data, c.acc_width)
        imm = alu_f.imm.as_signed()
        gemm_row = Cat(*[Mux(gemm_f.reset, 0, (old[n] + sums[n])[:c.acc_width]) for n in range(lanes)])
        alu_row = Cat(*[alu_lane(alu_f.alu_op, old[n], Mux(alu_f.use_imm, imm, operand[n]), c.acc_width)
                        for n in range(lanes)])
        new_f = Signal(c.acc_row_bits)
        m.d.sync += [valid["f"].eq(valid["e"]), dst["f"].eq(dst["e"]), new_f.eq(Mux(is_gemm, gemm_row, alu_row))]

        # ---- stage F: write back (or a load writes the accumulator) ----------------------------------------
        loading = self.busy & is_load
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
        drained = ~Cat(*valid.values()).any()
        loop_done = looped & launched & ~gen & drained

        # ---- FINISH, bus errors, completion --------------------------------------------------------------
        with m.If(self.busy & is_finish):
            m.d.sync += [self.finished.eq(1), self.finish_index.eq(index)]
        with m.If(dma.error & ~self.error):
            m.d.sync += [self.error.eq(1), self.error_code.eq(ErrorCode.BUS_ERROR), self.error_index.eq(index)]
        m.d.comb += done.eq(self.busy & (load_done | loop_done | is_finish))
        return m
