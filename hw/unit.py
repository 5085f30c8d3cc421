"""What the load, compute and store units share: the dependency-token queues and the instruction gate.

The token queues (:data:`weft.isa.semantics.QUEUES`, which unit pops and pushes each in ``FLAG_QUEUE``)
carry no data, so each is a counter (as in VTA's Chisel design) of up to ``token_queue_depth`` tokens. A
unit takes its next instruction when every queue the instruction pops holds a token and every queue it
pushes has room (the producer checks room at the start: it is the only one that adds tokens, so the room
is still there at the end). It pops when it starts and pushes when the instruction is done, exactly as the
functional simulator orders them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amaranth import Cat, Const, Module, Signal
from amaranth.hdl import Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from weft.hw.dma import command_from
from weft.hw.regs import register_widths
from weft.isa.constants import INSN_BITS, Opcode, Unit
from weft.isa.encoding import layout_of
from weft.isa.semantics import FLAG_QUEUE, QUEUES

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["TokenQueue", "UnitBase", "dispatch_layout", "pipe_decodes", "request_dma_once"]


def dispatch_layout(config: AcceleratorConfig) -> data.StructLayout:
    """What fetch hands a unit: the instruction word, its index in the stream (what ERROR_INDEX shows), and
    the compute unit's pipe decodes of it (:func:`pipe_decodes`), worked out by fetch as it dispatches so
    that the compute unit's start does not wait on the opcode's decode."""
    return data.StructLayout({"insn": INSN_BITS, "index": register_widths(config)["error_index"],
                              "alu": 1, "beside": 1})


def pipe_decodes(config: AcceleratorConfig, insn: Value) -> dict[str, Value]:
    """Spec "beside", in the compute unit: whether `insn` goes to the ALU pipe (else the GEMM pipe), and
    whether it has beside set (it may start while the other pipe runs)."""
    formats = layout_of(config).formats

    def view(name: str) -> data.View:
        return data.View(formats[name].as_struct_layout(), insn)

    opcode = view("finish").opcode
    is_alu = opcode == Opcode.ALU
    beside: Value = Const(0)
    for name, is_kind in (("gemm", opcode == Opcode.GEMM), ("alu", is_alu)):
        if formats[name].has("beside"):  # (where the format has room for it)
            beside = beside | (is_kind & view(name).beside)
    return {"alu": is_alu, "beside": beside}


class TokenQueue(wiring.Component):
    """A dependency-token queue between two units: a counter of up to `depth` tokens."""

    def __init__(self, *, depth: int):
        if depth < 1:
            raise ValueError(f"a token queue needs a depth of at least 1, got {depth}")
        self.depth = depth
        super().__init__({
            "push": In(1), "pop": In(1), "has_token": Out(1), "has_room": Out(1),
            "level": Out(range(depth + 1)),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        # level != 0 and level != depth, kept in registers beside the level: a unit's decision to start
        # (these flags, through its command queue's pop into the queue's level) was among tiny's longest paths.
        has_token, has_room = Signal(), Signal(init=1)
        m.d.comb += [self.has_token.eq(has_token), self.has_room.eq(has_room)]
        with m.If(self.push & ~self.pop):
            m.d.sync += [self.level.eq(self.level + 1), has_token.eq(1), has_room.eq(self.level != self.depth - 1)]
        with m.Elif(self.pop & ~self.push):
            m.d.sync += [self.level.eq(self.level - 1), has_token.eq(self.level != 1), has_room.eq(1)]
        return m


class UnitBase(wiring.Component):
    """A decoupled unit: a command stream in, token ports per dependency flag, busy/stall status.

    ``flags`` maps each dependency flag of `unit` to the token queue it pops or pushes; `members` are the
    unit's own ports. Subclasses call :meth:`gate` in ``elaborate`` and drive ``done`` high for one cycle
    when the instruction completes.
    """

    def __init__(self, config: AcceleratorConfig, unit: Unit, members: dict[str, object]):
        self.config = config
        self.layout = layout_of(config)
        self.flags = {flag: QUEUES[queue] for flag, queue in FLAG_QUEUE[unit].items()}
        ports: dict[str, object] = {"cmd": In(stream.Signature(dispatch_layout(config))), "halt": In(1),
                                    "busy": Out(1), "stall": Out(1), "pending": Out(1),
                                    "head_index": Out(register_widths(config)["error_index"])}
        for flag, queue in self.flags.items():
            if flag.startswith("pop"):
                ports[f"{queue}_has_token"] = In(1)
                ports[f"{queue}_pop"] = Out(1)
            else:
                ports[f"{queue}_has_room"] = In(1)
                ports[f"{queue}_push"] = Out(1)
        ports.update(members)
        super().__init__(ports)

    def view(self, insn: Value, format_name: str) -> data.View:
        """`insn` seen through one instruction format of the ISA."""
        return data.View(self.layout.formats[format_name].as_struct_layout(), insn)

    def tokens_ready(self, m: Module, head: data.View) -> Signal:
        """Whether every queue the instruction `head` pops holds a token and every queue it pushes has room."""
        ok = Signal()
        terms = []
        for flag, queue in self.flags.items():
            status = "has_token" if flag.startswith("pop") else "has_room"
            terms.append(~getattr(head, flag) | getattr(self, f"{queue}_{status}"))
        m.d.comb += ok.eq(Cat(*terms).all())
        return ok

    def gate(self, m: Module, done: Signal) -> tuple[Signal, Signal, Signal, Signal]:
        """The instruction register, its index, the one-cycle start pulse, and whether the instruction's
        transfer moves anything (x_size != 0, decoded beside the register: see :func:`request_dma_once`).

        `done` (comb, from the subclass) ends the instruction: the pushes happen in that cycle.
        """
        head = self.view(self.cmd.payload.insn, "finish")
        ok = self.tokens_ready(m, head)
        insn = Signal(INSN_BITS)
        index = Signal.like(self.cmd.payload.index)
        start = Signal()
        waiting = self.cmd.valid & ~self.busy & ~self.halt
        m.d.comb += [
            start.eq(waiting & ok), self.cmd.ready.eq(start), self.stall.eq(waiting & ~ok),
            self.pending.eq(self.cmd.valid), self.head_index.eq(self.cmd.payload.index),
        ]
        current = self.view(insn, "finish")
        for flag, queue in self.flags.items():
            if flag.startswith("pop"):
                m.d.comb += getattr(self, f"{queue}_pop").eq(start & getattr(head, flag))
            else:
                m.d.comb += getattr(self, f"{queue}_push").eq(done & getattr(current, flag))
        # The head is loaded whenever the unit is idle, so the instruction it starts is the one it holds: the
        # start (worked out from the queues' flags) is not the enable of every bit of the register (that
        # fanout, through the command queue's pop into its level, was among tiny's longest paths). Nothing
        # reads the register while the unit is idle.
        moves = Signal()
        with m.If(~self.busy):
            m.d.sync += [insn.eq(self.cmd.payload.insn), index.eq(self.cmd.payload.index),
                         moves.eq(self.view(self.cmd.payload.insn, "mem").x_size != 0)]
        with m.If(start):
            m.d.sync += self.busy.eq(1)
        with m.If(done):
            m.d.sync += self.busy.eq(0)
        return insn, index, start, moves


def request_dma_once(m: Module, dma: wiring.Component, active: Value, mem: data.View, start: Value,
                     moves: Value, *, target: Value | None = None) -> Value:
    """Command `dma` with the current instruction's transfer (`mem`: the instruction in the mem format; a
    load into one of several buffers names its `target`) once, while `active` and only when it `moves`
    anything (x_size 0 is a no-op: a register decoded beside the instruction's, since x_size's compare ahead
    of the command's valid, into the DMA's every command register, was among tiny's longest paths); `start`
    (the next instruction) re-arms it. Returns whether the transfer is over: nothing to move, or requested
    and the DMA idle again."""
    sent = Signal()
    fields = command_from(dma.cmd.payload, mem)
    if target is not None:
        fields.insert(0, dma.cmd.payload.target.eq(target))
    m.d.comb += [dma.cmd.valid.eq(active & moves & ~sent), *fields]
    with m.If(dma.cmd.valid & dma.cmd.ready):
        m.d.sync += sent.eq(1)
    with m.If(start):
        m.d.sync += sent.eq(0)
    return ~moves | (sent & ~dma.busy)
