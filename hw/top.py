"""The whole accelerator (``weft_top``) and its Verilog.

:class:`Core` wires fetch, the three units, the command queues, the four token queues, the on-chip buffers
and the DRAM read arbiter, and keeps the run state: the first error (code and instruction index), the end
of the run and the event counters. :class:`WeftTop` adds the AXI4-Lite control block and the interrupt;
START resets the core (the buffers keep their contents, as the functional simulator's SRAMs do) and
launches fetch.

A run ends when FINISH has executed and every unit is idle, or, after an error, as soon as every unit has
finished the instruction it was executing and every burst in flight has completed: a halted accelerator
leaves the bus idle. An error stops fetch and keeps the units from starting further instructions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amaranth import Cat, ClockDomain, ClockSignal, Const, DomainRenamer, Module, Mux, ResetSignal, Signal
from amaranth.back import rtlil, verilog
from amaranth.hdl import Value, _ir
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from weft.hw.axi import ADDR_BITS, ReadArbiter, axi4_lite_signature, axi4_signature
from weft.hw.compute import ComputeUnit
from weft.hw.control import ControlBlock
from weft.hw.datapath import DSP48, DspPorts
from weft.hw.fetch import Fetch
from weft.hw.load import LoadUnit
from weft.hw.queues import LutFIFO
from weft.hw.rams import collision_free, read_data
from weft.hw.regs import COUNTERS, ErrorCode, addr_bits, register_map, register_widths
from weft.hw.store import StoreUnit
from weft.hw.unit import TokenQueue, UnitBase
from weft.isa.constants import Unit
from weft.isa.semantics import QUEUES, acc_bank_rows

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["AXI_ID_BITS", "TOP_NAME", "Core", "WeftTop", "generate_rtlil", "generate_verilog", "top_ports"]

TOP_NAME = "weft_top"
#: AXI IDs of the read clients (the arbiter's RID routing).
READ_CLIENTS = ("fetch", "load", "compute")
#: Cycles with no possible progress before the core reports DEADLOCK (covers queue latencies).
DEADLOCK_CYCLES = 16


#: Width of ARID/RID (and AWID/BID): one ID per read client.
AXI_ID_BITS = max(1, (len(READ_CLIENTS) - 1).bit_length())


class Core(wiring.Component):
    """Everything but the register block; reset by START."""

    def __init__(self, config: AcceleratorConfig, *, dsp: DspPorts = DSP48, garble_collisions: bool = False):
        self.config, self.dsp, self.garble_collisions = config, dsp, garble_collisions
        regs = register_widths(config)
        members: dict[str, Any] = {
            "start": In(1), "insn_addr": In(regs["insn_addr"]), "insn_count": In(regs["insn_count"]),
            "axi": Out(axi4_signature(addr_bits=ADDR_BITS, data_bits=config.bus_width, id_bits=AXI_ID_BITS)),
            "running": Out(1), "ended": Out(1),
            "error": Out(1), "error_code": Out(regs["error_code"]), "error_index": Out(regs["error_index"]),
        }
        for name, _ in COUNTERS:
            members[name] = Out(regs[name])
        super().__init__(members)

    def elaborate(self, platform: object) -> Module:
        m = Module()
        c = self.config
        m.submodules.fetch = fetch = Fetch(c)
        m.submodules.load = load = LoadUnit(c)
        m.submodules.compute = compute = ComputeUnit(c, dsp=self.dsp, garble_collisions=self.garble_collisions)
        m.submodules.store = store = StoreUnit(c)
        units = {Unit.LOAD: load, Unit.COMPUTE: compute, Unit.STORE: store}
        m.d.comb += [fetch.start.eq(self.start), fetch.insn_addr.eq(self.insn_addr),
                     fetch.insn_count.eq(self.insn_count)]
        queues = self._command_queues(m, fetch, units)
        self._token_queues(m, units)
        self._buffers(m, load, compute, store)
        arb = self._dram(m, fetch, load, compute, store)
        deadlock, finish_early = self._errors(m, fetch, units)
        units_busy = Cat(*[u.busy for u in units.values()]).any()
        self._end_of_run(m, fetch, queues, compute, units_busy, finish_early)
        self._deadlock(m, fetch, units, units_busy, deadlock)

        # Event counters (they hold when the run ends; START clears them with the core reset).
        events = {
            "cycles": 1, "busy_load": load.busy, "busy_compute": compute.busy, "busy_store": store.busy,
            "stall_load": load.stall, "stall_compute": compute.stall, "stall_store": store.stall,
            "stall_fetch": fetch.stall, "mac_active": compute.mac_active, "alu_active": compute.alu_active,
            "insns": fetch.dispatch, "rd_beats": arb.beats, "wr_beats": store.beats,
        }
        if set(events) != {name for name, _ in COUNTERS}:
            raise AssertionError("every counter of the register map needs an event")
        # Each event is registered before its 64-bit adder, so the logic that raises it (fetch's dispatch
        # decision, for one) and the carry chain are a cycle apart; counting a cycle later gives the same counts.
        counting = Signal()
        m.d.sync += counting.eq(self.running)
        for name, event in events.items():
            late = Signal(Value.cast(event).shape(), name=f"{name}_event")
            m.d.sync += late.eq(event)
            with m.If(counting):
                counter = getattr(self, name)
                m.d.sync += counter.eq(counter + late)
        return m

    def _command_queues(self, m: Module, fetch: Fetch, units: dict[Unit, UnitBase]
                        ) -> dict[Unit, LutFIFO]:
        """A command FIFO from fetch to each unit."""
        queues = {}
        for u, unit in units.items():
            q = LutFIFO(width=len(unit.cmd.payload.as_value()), depth=self.config.cmd_queue_depth)
            m.submodules[f"{u.name.lower()}_queue"] = q
            m.d.comb += [
                q.w_data.eq(fetch.queues[u].payload), q.w_en.eq(fetch.queues[u].valid),
                fetch.queues[u].ready.eq(q.w_rdy),
                unit.cmd.payload.eq(q.r_data), unit.cmd.valid.eq(q.r_rdy), q.r_en.eq(unit.cmd.ready),
            ]
            queues[u] = q
        return queues

    def _token_queues(self, m: Module, units: dict[Unit, UnitBase]) -> None:
        """The dependency-token queues; each unit port is named after the queue it pops or pushes."""
        tokens = {name: TokenQueue(depth=self.config.token_queue_depth) for name in QUEUES}
        for name, tq in tokens.items():
            m.submodules[f"tokens_{name}"] = tq
        for unit in units.values():
            for flag, queue in unit.flags.items():
                tq = tokens[queue]
                if flag.startswith("pop"):
                    m.d.comb += [getattr(unit, f"{queue}_has_token").eq(tq.has_token),
                                 tq.pop.eq(getattr(unit, f"{queue}_pop"))]
                else:
                    m.d.comb += [getattr(unit, f"{queue}_has_room").eq(tq.has_room),
                                 tq.push.eq(getattr(unit, f"{queue}_push"))]

    def _buffers(self, m: Module, load: LoadUnit, compute: ComputeUnit, store: StoreUnit) -> None:
        """The on-chip buffers shared between units (compute owns uop and acc)."""
        c = self.config
        # (Their reads never use a row written in the read's cycle: weft.hw.rams.)
        garble = self.garble_collisions
        m.submodules.inp_mem = inp_mem = collision_free(memory.Memory(shape=c.inp_row_bits, depth=c.inp_rows,
                                                                      init=[]))
        m.submodules.wgt_mem = wgt_mem = collision_free(memory.Memory(shape=c.wgt_row_bits, depth=c.wgt_rows,
                                                                      init=[]))
        for name, mem, w, addr, rdata in (("inp", inp_mem, load.inp_w, compute.inp_addr, compute.inp_data),
                                          ("wgt", wgt_mem, load.wgt_w, compute.wgt_addr, compute.wgt_data)):
            wp, rp = mem.write_port(), mem.read_port()
            m.d.comb += [wp.en.eq(w.en), wp.addr.eq(w.addr), wp.data.eq(w.data), rp.addr.eq(addr),
                         rdata.eq(read_data(m, rp, wp, garble=garble, name=name))]
        # The out buffer in two banks, the accumulator's halves, each written by the compute unit's pipe
        # that owns it (ComputeUnit._banks) and read by the store unit.
        half = acc_bank_rows(c)  # out rows are acc rows
        upper = store.out_addr >= half
        reads = []
        for b in range(2):
            mem = collision_free(memory.Memory(shape=c.out_row_bits, depth=c.out_rows - half if b else half,
                                               init=[]))
            m.submodules[f"out_bank{b}"] = mem
            wp, rp = mem.write_port(), mem.read_port()
            w = compute.out_w[b]
            m.d.comb += [wp.en.eq(w.en), wp.addr.eq(w.addr), wp.data.eq(w.data),
                         rp.addr.eq(Mux(upper, store.out_addr - half, store.out_addr))]
            reads.append(read_data(m, rp, wp, garble=garble, name=f"out_bank{b}"))
        upper_r = Signal()
        m.d.sync += upper_r.eq(upper)
        m.d.comb += store.out_data.eq(Mux(upper_r, reads[1], reads[0]))

    def _dram(self, m: Module, fetch: Fetch, load: LoadUnit, compute: ComputeUnit, store: StoreUnit
              ) -> ReadArbiter:
        """DRAM: reads through the arbiter, writes from the store unit."""
        m.submodules.arbiter = arb = ReadArbiter(clients=len(READ_CLIENTS), addr_bits=ADDR_BITS,
                                                 data_bits=self.config.bus_width)
        for k, client in enumerate((fetch, load, compute)):
            wiring.connect(m, client.bus, arb.clients[k])
        for master in (arb.axi, store.axi):
            for name, member in master.signature.members.items():
                port, inner = getattr(self.axi, name), getattr(master, name)
                m.d.comb += (port.eq(inner) if member.flow == Out else inner.eq(port))
        return arb

    def _errors(self, m: Module, fetch: Fetch, units: dict[Unit, UnitBase]) -> tuple[Signal, Signal]:
        """Keep the first error (same cycle: the order below) and halt fetch and the units on it. Returns
        the deadlock and finish-early conditions, driven by the end-of-run logic."""
        compute = units[Unit.COMPUTE]
        deadlock = Signal()
        # A deadlock names the earliest instruction a unit waits to start, as the functional simulator does.
        stuck_index = Signal.like(self.error_index)
        # The earliest of the waiting heads, a register per step of a tree of compares: the chain of compares lay
        # ahead of the error registers on one of tiny's longest paths. A deadlock is declared after
        # DEADLOCK_CYCLES cycles in which no unit starts and fetch dispatches nothing, so the heads are the
        # same the steps' few cycles before, and so is the index. (None waiting: all ones.)
        none = Const((1 << len(stuck_index)) - 1, len(stuck_index))
        level = [Mux(unit.pending, unit.head_index, none) for unit in units.values()]
        while len(level) > 1:
            pairs = [Mux(level[k + 1] < level[k], level[k + 1], level[k]) if k + 1 < len(level) else level[k]
                     for k in range(0, len(level), 2)]
            level = [Signal.like(stuck_index, name="stuck_step") for _ in pairs]
            m.d.sync += [reg.eq(value) for reg, value in zip(level, pairs, strict=True)]
        assert len(units) <= 4 < DEADLOCK_CYCLES  # two steps
        m.d.comb += stuck_index.eq(level[0])
        finish_early = Signal()
        sources = [
            (fetch.error, fetch.error_code, fetch.error_index),
            (compute.error, compute.error_code, compute.error_index),
            (units[Unit.LOAD].error, ErrorCode.BUS_ERROR, units[Unit.LOAD].error_index),
            (units[Unit.STORE].error, ErrorCode.BUS_ERROR, units[Unit.STORE].error_index),
            (finish_early, ErrorCode.FINISH_EARLY, compute.finish_index),
            (deadlock, ErrorCode.DEADLOCK, stuck_index),
        ]
        with m.If(~self.error):
            for flag, code, index in reversed(sources):
                with m.If(flag):
                    m.d.sync += [self.error.eq(1), self.error_code.eq(code), self.error_index.eq(index)]
        halt = self.error
        for unit in units.values():
            m.d.comb += unit.halt.eq(halt)
        m.d.comb += fetch.halt.eq(halt)
        return deadlock, finish_early

    def _end_of_run(self, m: Module, fetch: Fetch, queues: dict[Unit, LutFIFO],
                    compute: ComputeUnit, units_busy: Value, finish_early: Signal) -> None:
        """The run ends after FINISH with every unit idle (FINISH_EARLY if loads or stores are left), or
        after an error once every unit and burst is done."""
        quiet = ~units_busy & fetch.idle
        with m.If(self.start):
            m.d.sync += self.running.eq(1)
        finished = self.running & compute.finished & quiet & ~self.error
        leftovers = (queues[Unit.LOAD].level != 0) | (queues[Unit.STORE].level != 0)
        # FINISH_EARLY is registered (its run ends a cycle later): fetch's idle through `finished` into the
        # error capture's enables was among tiny's longest paths. The verdict stands whatever the cycle after
        # brings: FINISH has executed with loads or stores left in their queues.
        m.d.sync += finish_early.eq(finished & leftovers)
        stop = (finished & ~leftovers) | (self.running & self.error & quiet)
        m.d.comb += self.ended.eq(stop)
        with m.If(stop):
            m.d.sync += self.running.eq(0)

    def _deadlock(self, m: Module, fetch: Fetch, units: dict[Unit, UnitBase], units_busy: Value,
                  deadlock: Signal) -> None:
        """Deadlock: nothing executes, every unit waits for a token or has nothing to do, and fetch is
        stalled on a full queue or has dispatched everything, for DEADLOCK_CYCLES cycles in a row."""
        waiting = Cat(*[u.stall | ~u.pending for u in units.values()]).all()
        no_progress = (self.running & ~units_busy & waiting & (fetch.stall | (fetch.all_dispatched & fetch.idle))
                       & ~units[Unit.COMPUTE].finished & ~self.error)
        stuck = Signal(range(DEADLOCK_CYCLES + 1))
        m.d.sync += stuck.eq(Mux(no_progress, stuck + 1, 0))
        m.d.comb += deadlock.eq(stuck == DEADLOCK_CYCLES)


class WeftTop(wiring.Component):
    """The accelerator: ``m_axi`` (AXI4 master to DRAM), ``s_axil`` (AXI4-Lite registers), ``irq``. `dsp`: the
    target's hard multiplier, which shapes the GEMM core's products (the same results on any)."""

    def __init__(self, config: AcceleratorConfig, *, dsp: DspPorts = DSP48, garble_collisions: bool = False):
        self.config, self.dsp, self.garble_collisions = config, dsp, garble_collisions
        self.registers = register_map(config)
        super().__init__({
            "m_axi": Out(axi4_signature(addr_bits=ADDR_BITS, data_bits=config.bus_width, id_bits=AXI_ID_BITS)),
            "s_axil": In(axi4_lite_signature(addr_bits=addr_bits(self.registers))),
            "irq": Out(1),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        m.submodules.control = ctrl = ControlBlock(self.config)
        core = Core(self.config, dsp=self.dsp, garble_collisions=self.garble_collisions)
        busy = Signal()
        launch = Signal()
        accept = ctrl.start & ~busy
        # The core's reset is a register, a cycle after START is accepted, and its start a cycle after that:
        # the accept's AND of two registers, fanned out to every register of the core and merged by Yosys into
        # their reset logic (a write's zeroing, for one), was tiny's longest path after place and route at
        # 81.6 MHz (0c30693). The core sees the same cycles from its start on. It is clocked in a domain of its
        # own whose reset is that register alone, set by the accept or by the design's reset (which the core
        # leaves a cycle after the rest): under ResetInserter on `sync` every register of the core had
        # `rst | restart` on its reset input, a LUT fanned out to all of them and, where a register has a reset
        # of its own (a write's zeroing), a second LUT after it (restart into Load2D's write failed 100 MHz
        # after nextpnr at 57a6132).
        restart, accepted = Signal(reset_less=True), Signal()
        m.domains.core = core_domain = ClockDomain("core", local=True)
        m.d.comb += [core_domain.clk.eq(ClockSignal("sync")), core_domain.rst.eq(restart)]
        m.submodules.core = DomainRenamer("core")(core)
        wiring.connect(m, wiring.flipped(self.s_axil), ctrl.bus)
        wiring.connect(m, wiring.flipped(self.m_axi), core.axi)
        m.d.sync += [restart.eq(accept | ResetSignal("sync")), accepted.eq(accept), launch.eq(accepted)]
        with m.If(accept):
            m.d.sync += busy.eq(1)
        with m.If(core.ended):
            m.d.sync += busy.eq(0)
        m.d.comb += [
            core.start.eq(launch), core.insn_addr.eq(ctrl.insn_addr), core.insn_count.eq(ctrl.insn_count),
            ctrl.busy.eq(busy), ctrl.done_set.eq(core.ended), ctrl.done_clear.eq(accept), ctrl.error.eq(core.error),
            ctrl.error_code.eq(core.error_code), ctrl.error_index.eq(core.error_index),
            self.irq.eq(ctrl.irq_en & ctrl.done),
        ]
        for name, _ in COUNTERS:
            m.d.comb += getattr(ctrl, name).eq(getattr(core, name))
        return m


def top_ports(top: WeftTop) -> dict[str, tuple[Any, Any]]:
    """Verilog port names: interface members flattened with '_' (m_axi_araddr, s_axil_wdata, irq)."""
    ports = {}
    for path, member, value in top.signature.flatten(top):
        direction = _ir.PortDirection.Input if member.flow == In else _ir.PortDirection.Output
        ports["_".join(map(str, path))] = (value, direction)
    return ports


def generate_verilog(config: AcceleratorConfig, *, dsp: DspPorts = DSP48, garble_collisions: bool = False) -> str:
    """The Verilog of ``weft_top`` for `config`, stamped with the config's name and hash; `dsp` the target's
    hard multiplier (Xilinx's DSP48 unless the flow is another family's); `garble_collisions` a test's check
    that the buffers' reads never use a row written in their cycle (:mod:`weft.hw.rams`)."""
    top = WeftTop(config, dsp=dsp, garble_collisions=garble_collisions)
    text = verilog.convert(top, name=TOP_NAME, ports=top_ports(top), emit_src=False)
    stamp = (f"// weft accelerator '{config.name}', config hash {config.hash}\n"
             f"// bitstream name {config.bitstream_name}\n"
             "// Yosys writes operands of mixed widths and case statements without defaults, relying on\n"
             "// Verilog's implicit extension and on the values assigned before each case; both are\n"
             "// well defined, so the two lint classes that flag them are off for this file.\n"
             "/* verilator lint_off WIDTH */\n"
             "/* verilator lint_off CASEINCOMPLETE */\n")
    return stamp + text


def generate_rtlil(config: AcceleratorConfig) -> str:
    """The RTLIL of ``weft_top`` for `config` (what Amaranth hands Yosys to write the Verilog), stamped like
    it: synthesis reads it directly, without the Verilog's round trip through Yosys' front end."""
    top = WeftTop(config)
    text = rtlil.convert(top, name=TOP_NAME, ports=top_ports(top), emit_src=False)
    return (f"# weft accelerator '{config.name}', config hash {config.hash}\n"
            f"# bitstream name {config.bitstream_name}\n") + text
