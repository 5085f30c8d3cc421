"""The fetch unit: reads the instruction stream with AXI4 bursts, checks and routes each instruction.

Fetch decodes opcode and memory id with the ISA's own StructLayouts and dispatches each instruction to the
queue of the unit that runs it (:mod:`weft.isa.semantics`: LOAD INP/WGT to the load queue, STORE to the
store queue, everything else to the compute queue), in stream order; it stalls while the target queue is
full and never drops an instruction. Each instruction is checked before dispatch, in the functional
simulator's order (illegal opcode, memory id, dependency flag, ALU op, padding, SRAM range, micro-op range,
FINISH placement), with the memory ids, flags and padding rules of the same module; the first illegal one
is not dispatched: fetch reports its error code and index and stops, draining the bursts it has in flight.
"""

from __future__ import annotations

import operator
from functools import reduce
from typing import TYPE_CHECKING

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.hdl import Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from weft.hw.axi import ADDR_BITS, read_client_signature
from weft.hw.dma import BurstReader, RowUnpacker
from weft.hw.regs import ErrorCode, register_widths
from weft.hw.structure import FETCH_DECODE_CYCLES, FETCH_OUT_CYCLES
from weft.hw.unit import dispatch_layout, pipe_decodes
from weft.isa.constants import INSN_BYTES, AluOp, MemId, Opcode, Unit
from weft.isa.encoding import layout_of
from weft.isa.program import DEP_FLAGS
from weft.isa.semantics import FLAG_QUEUE, MEMS, PADDED_MEMS, sram_rows, unit_of

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["Fetch", "check_insn", "check_word", "error_code", "range_bits", "sram_range", "sram_range_joined",
           "sram_range_parts"]



def _one_of(value: Value, members: list[int]) -> Value:
    return reduce(operator.or_, [value == member for member in members])


def check_insn(m: Module, config: AcceleratorConfig, word: Value, is_last: Value
               ) -> tuple[Signal, Signal, Value]:
    """Combinational checks of one instruction word: (error code or 0, unit, is FINISH)."""
    checks, unit, is_finish, _ = check_word(m, config, word)
    return error_code(m, config, checks, is_finish, is_last), unit, is_finish


def range_bits(config: AcceleratorConfig) -> int:
    """The width :func:`sram_range` multiplies at: a side of ``2**range_bits`` rows or more exceeds every
    memory."""
    return max(sram_rows(config).values()).bit_length()


def sram_range(active: Value, room: Value, height: Value, width: Value, bits: int) -> Value:
    """The SRAM_RANGE condition: an active transfer's box (``height * width`` rows) needs more than the `room`
    its memory has from its ``sram_base`` (the memory's rows less that base: below ``2**bits``, negative
    when the base is past the end). A side of ``2**bits`` rows or more (`bits` from :func:`range_bits`)
    overflows every memory unless the other side is empty, so only the low `bits` of each side are
    multiplied: tiny's 14 x 14-bit product was its longest path after place and route."""
    return sram_range_joined(*sram_range_parts(active, room, height, width, bits), active, room)


def sram_range_joined(product: Value, coarse: Value, active: Value, room: Value) -> Value:
    """:func:`sram_range` from its :func:`sram_range_parts`."""
    return coarse | (active & (product > room))


def sram_range_parts(active: Value, room: Value, height: Value, width: Value, bits: int) -> tuple[Value, Value]:
    """:func:`sram_range` in two parts a user may register apart: the sides' product and the verdict
    without its compare with the room (:func:`sram_range_joined` joins them)."""
    def over(side: Value) -> Value:
        return side[bits:].any() if len(side) > bits else Const(0)

    empty = (height == 0) | (width == 0)
    return height[:bits] * width[:bits], active & ((room < 0) | ((over(height) | over(width)) & ~empty))


def check_word(m: Module, config: AcceleratorConfig, word: Value
               ) -> tuple[list[tuple[Value, ErrorCode]], Signal, Value, dict[str, Value]]:
    """The checks of an instruction that depend on its word alone, in the order they apply (condition,
    error); the unit it goes to; whether it is FINISH; the operands of its :func:`sram_range` check but
    `bits` (a user may register them and multiply a cycle later)."""
    c, layout = config, layout_of(config)
    head = data.View(layout.formats["finish"].as_struct_layout(), word)
    mem = data.View(layout.formats["mem"].as_struct_layout(), word)
    loop = data.View(layout.formats["gemm"].as_struct_layout(), word)
    alu = data.View(layout.formats["alu"].as_struct_layout(), word)
    op = head.opcode
    is_load, is_store = op == Opcode.LOAD, op == Opcode.STORE
    unit = Signal(range(len(Unit)), name="unit")
    load_unit_mems = [mid for mid in MemId if unit_of(Opcode.LOAD, mid) == Unit.LOAD]
    m.d.comb += unit.eq(Mux(is_store, Unit.STORE,
                            Mux(is_load & _one_of(mem.mem_id, load_unit_mems), Unit.LOAD, Unit.COMPUTE)))
    bad_mem = reduce(operator.or_, [(op == opcode) & ~Cat(*[mem.mem_id == mid for mid in mems]).any()
                                    for opcode, (mems, _) in MEMS.items()])
    bad_flags: Value | int = 0  # a flag the unit has no token queue for
    for u in reversed(Unit):
        illegal = [getattr(head, flag) for flag in DEP_FLAGS if flag not in FLAG_QUEUE[u]]
        if illegal:
            bad_flags = Mux(unit == u, reduce(operator.or_, illegal), bad_flags)
    active = (is_load | is_store) & (mem.x_size != 0)
    pads = Cat(mem.y_pad_0, mem.y_pad_1, mem.x_pad_0, mem.x_pad_1).any()
    unpadded = [mid for mid in MEMS[Opcode.LOAD][0] if mid not in PADDED_MEMS]
    no_pad = is_store | (is_load & _one_of(mem.mem_id, unpadded))
    height = Signal(layout.size_bits + 5)
    width = Signal(layout.size_bits + 5)
    m.d.comb += [
        height.eq(mem.y_pad_0 + mem.y_size + mem.y_pad_1),
        width.eq(mem.x_pad_0 + mem.x_size + mem.x_pad_1),
    ]
    rows_of = sram_rows(c)
    rows = Signal(range(max(rows_of.values()) + 1))
    with m.Switch(mem.mem_id):
        for mid, count in rows_of.items():
            with m.Case(mid):
                m.d.comb += rows.eq(count)
        with m.Default():
            m.d.comb += rows.eq(0)  # no memory: the memory id check reports it
    room = Signal(signed(len(rows) + 1 + max(0, len(mem.sram_base) - len(rows))), name="room")
    m.d.comb += room.eq(rows - mem.sram_base)
    looped = (op == Opcode.GEMM) | (op == Opcode.ALU)
    # The loop fields sit at different bits in the two formats (GEMM has its reset bit first).
    uop_bgn = Mux(op == Opcode.GEMM, loop.uop_bgn, alu.uop_bgn)
    uop_end = Mux(op == Opcode.GEMM, loop.uop_end, alu.uop_end)
    checks = [
        (op > max(Opcode), ErrorCode.ILLEGAL_OPCODE),
        (bad_mem, ErrorCode.ILLEGAL_MEM_ID),
        (bad_flags, ErrorCode.ILLEGAL_DEP_FLAG),
        ((op == Opcode.ALU) & (alu.alu_op > max(AluOp)), ErrorCode.ILLEGAL_ALU_OP),
        (active & no_pad & pads, ErrorCode.BAD_PADDING),
        (sram_range(active, room, height, width, range_bits(c)), ErrorCode.SRAM_RANGE),
        (looped & ((uop_bgn >= uop_end) | (uop_end > c.uop_rows)), ErrorCode.UOP_RANGE),
    ]
    operands = {"active": active, "room": room, "height": height, "width": width}
    return checks, unit, op == Opcode.FINISH, operands


def placed_checks(checks: list[tuple[Value, ErrorCode]], is_finish: Value, is_last: Value
                  ) -> list[tuple[Value, ErrorCode]]:
    """`checks` and then the FINISH placement checks, in the order they apply."""
    return [*checks, (is_finish & ~is_last, ErrorCode.FINISH_NOT_LAST), (~is_finish & is_last, ErrorCode.NO_FINISH)]


def error_code(m: Module, config: AcceleratorConfig, checks: list[tuple[Value, ErrorCode]], is_finish: Value,
               is_last: Value) -> Signal:
    """The first failing check of `checks` and then the FINISH placement checks, or 0."""
    checks = placed_checks(checks, is_finish, is_last)
    code = Signal(register_widths(config)["error_code"], name="check_code")
    for cond, err in reversed(checks):  # the first failing check wins
        with m.If(cond):
            m.d.comb += code.eq(err)
    return code


class Fetch(wiring.Component):
    """Streams `insn_count` instructions from byte `insn_addr` into the three command queues."""

    def __init__(self, config: AcceleratorConfig):
        self.config = config
        regs = register_widths(config)
        super().__init__({
            "start": In(1), "insn_addr": In(regs["insn_addr"]), "insn_count": In(regs["insn_count"]),
            "halt": In(1),
            "bus": Out(read_client_signature(addr_bits=ADDR_BITS, data_bits=config.bus_width)),
            "queues": Out(stream.Signature(dispatch_layout(config))).array(len(Unit)),  # by Unit
            "error": Out(1), "error_code": Out(regs["error_code"]), "error_index": Out(regs["error_index"]),
            "idle": Out(1), "all_dispatched": Out(1), "stall": Out(1), "dispatch": Out(1),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        c = self.config
        B = c.bus_width // 8
        count_bits = len(self.insn_count)
        m.submodules.reader = reader = BurstReader(bus_bytes=B, count_bits=count_bits + 5)
        m.submodules.unpack = unpack = RowUnpacker(bus_bytes=B, elem_bytes=INSN_BYTES, count_bits=count_bits)
        wiring.connect(m, wiring.flipped(self.bus), reader.bus)
        wiring.connect(m, reader.beats, unpack.beats)

        running = Signal()  # dispatching: from start until FINISH, an error or a halt
        launch = Signal()
        index = Signal(count_bits)
        # The stream's last index, registered at launch: insn_count - 1 worked out in the cycle fed the error
        # code, whose verdict gates every queue's valid (tiny's longest path). `is_last` (index == last_index)
        # is kept in a register beside index for the same reason: the comparison was the next longest.
        last_index = Signal(count_bits)
        is_last = Signal()
        m.d.sync += launch.eq(self.start)
        first = Cat(Const(0, exact_log2(B)), self.insn_addr[exact_log2(B):])
        # The stream's beats: from the first beat's start to the stream's end, the address's offset in its beat
        # plus the stream's bytes (end - first without the address's carries), registered in START's cycle
        # from the control registers written before it, so launch's burst length starts from a register.
        beats = Signal.like(reader.cmd.payload.beats)
        m.d.sync += beats.eq((self.insn_addr[:exact_log2(B)] + (self.insn_count << exact_log2(INSN_BYTES)) + B - 1)
                             >> exact_log2(B))
        # The launch's verdicts on the stream, registered in START's cycle like `beats` (the compares fed the
        # unpacker's and the reader's command enables).
        misaligned, empty = Signal(), Signal()
        m.d.sync += [misaligned.eq(self.insn_addr[:exact_log2(INSN_BYTES)] != 0), empty.eq(self.insn_count == 0)]
        with m.If(launch):
            with m.If(misaligned):
                m.d.sync += [self.error.eq(1), self.error_code.eq(ErrorCode.INSN_ADDR_MISALIGNED),
                             self.error_index.eq(0)]
            with m.Elif(empty):
                m.d.sync += [self.error.eq(1), self.error_code.eq(ErrorCode.NO_FINISH), self.error_index.eq(0)]
            with m.Else():
                m.d.sync += [running.eq(1), index.eq(0), last_index.eq(self.insn_count - 1),
                             is_last.eq(self.insn_count == 1)]
                m.d.comb += [
                    reader.cmd.valid.eq(1), reader.cmd.payload.addr.eq(first),
                    reader.cmd.payload.beats.eq(beats),
                    unpack.cmd.valid.eq(1), unpack.cmd.payload.count.eq(self.insn_count),
                ]
                if B > INSN_BYTES:
                    m.d.comb += unpack.cmd.payload.lane.eq(self.insn_addr[exact_log2(INSN_BYTES):exact_log2(B)])

        word = unpack.elems.payload
        if B < INSN_BYTES:
            # The word is assembled in the unpacker from several beats. From the unpacker's register it moves
            # through two check registers into the dispatch register, a cycle each: into the first with the
            # checks that take the word alone and the range check's sums (the block RAM of the reader's buffer,
            # whose output time ahead of those sums was tiny's longest path, feeds only the unpacker's
            # register), into the second with the range check's sides multiplied (a DSP block's, through
            # routing, into the compare was tiny's longest path before), into the dispatch register with the
            # product's compare with the room. A word is checked and moves into the output register from the
            # cycle after that (FETCH_DECODE_CYCLES after its last beat at the earliest). A check register takes
            # a word as its own moves on; the dispatch register only when empty, so the queues' ready does not
            # reach back into the reader.
            assert FETCH_DECODE_CYCLES == 4  # the unpacker, the range check's sums, its multiply, its compare
            checks, word_unit, word_finish, operands = check_word(m, c, word)
            ranged = [k for k, (_, err) in enumerate(checks) if err == ErrorCode.SRAM_RANGE]
            decoded = Cat(*[Const(0) if k in ranged else cond for k, (cond, _) in enumerate(checks)],
                          word_unit, word_finish)
            summed = {name: Signal.like(value, name=f"summed_{name}")
                      for name, value in {"word": word, "decoded": decoded, **operands}.items()}
            product, coarse = sram_range_parts(**{name: summed[name] for name in operands}, bits=range_bits(c))
            values = {"word": summed["word"], "decoded": summed["decoded"], "product": product, "coarse": coarse,
                      "active": summed["active"], "room": summed["room"]}
            checked = {name: Signal.like(value, name=f"checked_{name}") for name, value in values.items()}
            full_s, full_c, full = Signal(), Signal(), Signal()  # the check and dispatch registers hold a word
            advance = full_c & ~full
            advance_s = full_s & (~full_c | ~full)  # (~full_c | advance)
            move = unpack.elems.valid & (~full_s | ~full_c | ~full)  # (~full_s | advance_s)
            m.d.comb += unpack.elems.ready.eq(move)
            word_d, decoded_d, out_of_range = Signal.like(word), Signal(len(decoded)), Signal()
            with m.If(advance):
                m.d.sync += [full_c.eq(0), full.eq(1), word_d.eq(checked["word"]), decoded_d.eq(checked["decoded"]),
                             out_of_range.eq(sram_range_joined(checked["product"], checked["coarse"],
                                                               checked["active"], checked["room"]))]
            with m.If(advance_s):
                m.d.sync += [full_s.eq(0), full_c.eq(1), *[checked[name].eq(value) for name, value in values.items()]]
            with m.If(move):
                m.d.sync += [full_s.eq(1), summed["word"].eq(word), summed["decoded"].eq(decoded),
                             *[summed[name].eq(value) for name, value in operands.items()]]
            word, present = word_d, full
            checks = [(out_of_range if k in ranged else decoded_d[k], err) for k, (_, err) in enumerate(checks)]
            unit = decoded_d[len(checks):-1]
            is_finish = decoded_d[-1]
        else:
            checks, unit, is_finish, _ = check_word(m, c, word)
            present = unpack.elems.valid
        code = error_code(m, c, checks, is_finish, is_last)
        # Whether any check fails, as one OR beside the priority encoder: the dispatch needs the verdict, not
        # which check it was.
        passed = ~reduce(operator.or_, [cond for cond, _ in placed_checks(checks, is_finish, is_last)])
        live = running & ~self.halt & ~self.error & present
        # The dispatch leaves a register of its own (the word, its index, its unit and decodes), which the
        # command queues write from: the verdict, through each queue's write enable into its level, room,
        # `holds` and LUT RAM address in one cycle, was tiny's longest path after nextpnr with every seed but
        # one at c2cb872. The register loads whenever it is empty or its word goes out, the verdict only sets
        # its valid, so the queues' write enables are a register and a compare of one, a cycle after the
        # verdict (the timing model's `fetch_out_cycles`).
        assert FETCH_OUT_CYCLES == 1
        out = Signal(dispatch_layout(c), name="out")
        out_unit, out_valid = Signal.like(unit, name="out_unit"), Signal(name="out_valid")
        out_ready = Cat(*[q.ready for q in self.queues]).bit_select(out_unit, 1)
        free = ~out_valid | out_ready
        go = live & passed & free
        with m.If(free):
            m.d.sync += [out.insn.eq(word), out.index.eq(index), out_unit.eq(unit), out_valid.eq(live & passed),
                         *[getattr(out, name).eq(value) for name, value in pipe_decodes(c, word).items()]]
        with m.If(self.halt | launch):  # (nothing goes out after an error; a word left by one is dropped)
            m.d.sync += out_valid.eq(0)
        shown = out_valid & ~self.halt  # (the halt a register too: one LUT with the unit's compare)
        for u, q in enumerate(self.queues):
            m.d.comb += [q.payload.eq(out), q.valid.eq(shown & (out_unit == u))]
        m.d.comb += [self.dispatch.eq(shown & out_ready), self.stall.eq(shown & ~out_ready)]
        if B < INSN_BYTES:
            with m.If(go):
                m.d.sync += full.eq(0)
            with m.If(launch):  # (words left by an error or a halt)
                m.d.sync += [full.eq(0), full_c.eq(0), full_s.eq(0)]
        else:
            m.d.comb += unpack.elems.ready.eq(go)
        with m.If(go):
            m.d.sync += [index.eq(index + 1), is_last.eq(index + 1 == last_index)]
            with m.If(is_finish):
                m.d.sync += running.eq(0)
        with m.If(live & ~passed):
            # FINISH_NOT_LAST names the instruction after the FINISH, as the functional simulator does.
            m.d.sync += [self.error.eq(1), self.error_code.eq(code), running.eq(0),
                         self.error_index.eq(Mux(code == ErrorCode.FINISH_NOT_LAST, index + 1, index))]
        with m.If(reader.error & ~self.error):
            m.d.sync += [self.error.eq(1), self.error_code.eq(ErrorCode.BUS_ERROR), self.error_index.eq(index)]
        stop = ~running & ~launch & ~self.start
        # The reader registers its abort, which takes effect a cycle late (start's path through the reader's
        # issue check into the read arbiter's grant was among tiny's longest, and so was the halt's, an error
        # anywhere, at 84.7 MHz, 5f3f626). A cycle late is harmless: START's cycle issues nothing, once
        # running falls every burst is out (FINISH is the stream's last word) unless an error stopped it, and
        # a burst issued in an error's first cycle is waited for and dropped like those in flight (`idle`).
        m.d.comb += [
            reader.abort.eq(stop | self.halt),
            self.idle.eq(stop & reader.idle & ~out_valid),
            self.all_dispatched.eq(~running & ~out_valid),
        ]
        return m
