"""DMA engines: 2-D strided loads from DRAM into an SRAM (with zero padding) and stores back.

A row of a 2-D transfer is ``x_size`` consecutive *elements* (SRAM rows) in DRAM; element sizes and the bus
width are powers of two, so an element either fills whole beats (E >= B bytes) or several elements share a
beat (E < B, possibly starting mid-beat: element addresses need only be element aligned). The pieces:

* :class:`BurstReader`: a stream of (bus-aligned byte address, beats) requests into AXI bursts of at most
  ``max_burst`` beats that never cross 4 KiB. It only requests a burst when its beat buffer can take all
  of it, so it never stalls the shared R channel.
* :class:`RowUnpacker`: beats into elements (skipping the lanes before the first one).
* :class:`Load2D`: the load instruction: issues one read per DRAM row, writes the SRAM one element per
  cycle in row order, inserting the zero padding.
* :class:`Store2D`: the store instruction: reads the SRAM, packs elements into beats with byte strobes,
  and writes bursts on AW/W, completing when every B response is back.
"""

from __future__ import annotations

import operator
from functools import reduce
from typing import Any

from amaranth import Cat, Const, Module, Mux, ShapeLike, Signal, signed, unsigned
from amaranth.hdl import Value
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from weft.hw.axi import (
    ADDR_BITS,
    BOUNDARY_BITS,
    BOUNDARY_BYTES,
    BURST_INCR,
    CACHE_BITS,
    RESP_OKAY,
    axi4_write_signature,
    read_client_signature,
)
from weft.hw.queues import LutFIFO
from weft.hw.structure import (
    MAX_BURST,
    READER_BEATS,
    STORE_LEN_DEPTH,
    STORE_READ_STAGES,
    STORE_SEG_DEPTH,
    UNPACK_DEPTH,
)
from weft.isa.layout import Format

__all__ = ["LOAD_FIELDS", "STORE_FIELDS", "BurstReader", "Load2D", "RowPacker", "RowUnpacker", "Store2D",
           "command_from", "load_cmd_layout", "store_cmd_layout"]


def _at_most(value: Value, limit: Value | int) -> Value:
    """``value <= limit`` (both unsigned) for a count `value` wider than `limit`: its bits above the limit's
    are all zero, and the rest compare, side by side. As one compare, the carry chain ran over every bit of
    the count (a request's beats), and on into the burst verdicts (the fetch reader's room check, 11.1 ns,
    and the compute reader's next length after nextpnr at bc13940, seed 2)."""
    bits = limit.bit_length() if isinstance(limit, int) else len(limit)
    if len(value) <= bits:
        return value <= limit
    return (value[bits:] == 0) & (value[:bits] <= limit)


def _one_in_all(*parts: Value) -> Value:
    """``sum(parts) == 1``: one part is 1 and the others are 0, compares side by side (a tile's side of one
    position: the instruction's fields through the sum's carry chains into that flag were among tiny's
    longest paths after nextpnr at bd8ef8e)."""
    return reduce(operator.or_, [(part == 1) & (Cat(*parts[:k], *parts[k + 1:]) == 0)
                                 for k, part in enumerate(parts)])


# The burst rule, here only: a burst from bus-aligned `addr` with `beats` left is the least of those beats,
# the longest burst and the beats to the next 4 KiB boundary. Nothing works the least out as a chain of
# compares and multiplexers (each such chain sat on one of tiny's longest paths): `_burst_len` picks it with
# two verdicts worked out side by side (the beats fit one burst and end by the boundary; the boundary comes
# before a whole longest burst), and `_burst_len_at_most` compares with it, from the address's offset in its
# 4 KiB page and sums side by side.
def _boundary_first(addr: Value, bus_bytes: int, max_burst: int) -> Value:
    """Whether the 4 KiB boundary comes before a whole longest burst from `addr` ends."""
    return addr[:BOUNDARY_BITS] > BOUNDARY_BYTES - max_burst * bus_bytes


def _beats_to_boundary(addr: Value, bus_bytes: int, *, less: int = 0) -> Value:
    """The beats from bus-aligned `addr` to the next 4 KiB boundary, less `less`: a constant's difference."""
    s = exact_log2(bus_bytes)
    return ((BOUNDARY_BYTES >> s) - less) - addr[s:BOUNDARY_BITS]


def _burst_len(addr: Value, beats: Value, bus_bytes: int, max_burst: int, *, less: int = 0) -> Value:
    """Beats of the next burst (less `less`, folded into each choice): the beats left, at most `max_burst`,
    never crossing 4 KiB."""
    return Mux(_burst_takes_all(addr, beats, bus_bytes, max_burst), beats - less,
               Mux(_boundary_first(addr, bus_bytes, max_burst), _beats_to_boundary(addr, bus_bytes, less=less),
                   max_burst - less))


def _paged_burst_takes_all(page_left: Value, beats: Value, max_burst: int) -> Value:
    """:func:`_burst_takes_all` where the beats from the address to its 4 KiB boundary (`page_left`) are kept in
    a register beside it: one short compare, not the address's sum and a compare in series (Store2D's AWLEN
    into its length queue after nextpnr at bc13940)."""
    return _at_most(beats, max_burst) & (beats[:max_burst.bit_length()] <= page_left)


def _paged_burst_len(page_left: Value, beats: Value, max_burst: int, *, less: int = 0) -> Value:
    """:func:`_burst_len` from `page_left`, as :func:`_paged_burst_takes_all` (the boundary comes before a whole
    longest burst where fewer beats than that are left to it)."""
    return Mux(_paged_burst_takes_all(page_left, beats, max_burst), beats - less,
               Mux(page_left < max_burst, page_left - less, max_burst - less))


def _page_left_after(page_left: Value, reaches_boundary: Value, length: Value | int, bus_bytes: int) -> Value:
    """`page_left` after a burst of `length` beats: a whole page's beats where the burst reaches the 4 KiB
    boundary (the next burst starts on a new page), else `length` fewer. BurstReader and Store2D keep the
    count with this one rule, each telling `reaches_boundary` from its own registers; a burst that ends
    exactly on the boundary reaches it (see Store2D's `to_boundary`)."""
    return Mux(reaches_boundary, BOUNDARY_BYTES >> exact_log2(bus_bytes), page_left - length)


def _burst_len_at_most(addr: Value, beats: Value, room: Value, bus_bytes: int, max_burst: int) -> Value:
    """``_burst_len(addr, beats) <= room``: any of the three is at most `room`. The boundary's beats only
    decide where the room is less than a longest burst, and then only where fewer than a longest burst are
    left to the boundary: the offset's bits above a longest burst's are all ones, and the room and the
    offset's bits below them add up to a longest burst (their sum's carry). As the room's bytes added to
    the whole 12-bit offset and compared, the carry chain lay ahead of the first burst's verdict (the load
    reader's pending address into it after nextpnr at bd8ef8e, with two of four seeds)."""
    s, k = exact_log2(bus_bytes), exact_log2(max_burst)
    near_boundary = addr[s + k:BOUNDARY_BITS].all()
    reaches = (room[:k] + addr[s:s + k])[k]
    return _at_most(beats, room) | (max_burst <= room) | (near_boundary & reaches)


def _paged_burst_len_at_most(page_left: Value, beats: Value, room: Value, max_burst: int) -> Value:
    """``_paged_burst_len(page_left, beats) <= room``: any of the three is at most `room`, compared side by
    side from registers."""
    return _at_most(beats, room) | (max_burst <= room) | _at_most(page_left, room)


def _burst_takes_all(addr: Value, beats: Value, bus_bytes: int, max_burst: int) -> Value:
    """``_burst_len(addr, beats) == beats``: the beats fit one burst and end by the boundary."""
    short = beats[:max_burst.bit_length()]  # all of beats where it is at most max_burst
    return _at_most(beats, max_burst) & ((short << exact_log2(bus_bytes)) + addr[:BOUNDARY_BITS] <= BOUNDARY_BYTES)



class BurstReader(wiring.Component):
    """Reads (bus-aligned byte address, beat count) requests as AXI bursts into a beat stream.

    A request is taken into a register (the next may be taken while the one before still issues) and starts
    a cycle later at the earliest, its first burst the cycle after. ``abort`` is registered: from the cycle
    after it rises the reader issues nothing and drops every request taken and every beat still due, so a
    halted unit leaves the bus clean; ``idle`` is high when no request is waiting or in progress and no beat
    is outstanding or buffered.

    ``bus.ar.ready`` must stay low in the cycle after a burst is taken, as :class:`weft.hw.axi.ReadArbiter`
    keeps it (it registers each grant): the reader's buffer room check is a cycle behind an issue.
    """

    def __init__(self, *, bus_bytes: int, count_bits: int, depth: int = READER_BEATS,
                 max_burst: int = MAX_BURST):
        if max_burst > depth:
            raise ValueError(f"burst of {max_burst} beats does not fit a buffer of {depth} beats")
        if max_burst * bus_bytes > BOUNDARY_BYTES:
            raise ValueError(f"{max_burst} beats of {bus_bytes} bytes cross 4 KiB")
        self.bus_bytes, self.depth, self.max_burst = bus_bytes, depth, max_burst
        bits = bus_bytes * 8
        super().__init__({
            "cmd": In(stream.Signature(data.StructLayout({"addr": ADDR_BITS, "beats": count_bits}))),
            "bus": Out(read_client_signature(addr_bits=ADDR_BITS, data_bits=bits)),
            "beats": Out(stream.Signature(bits)),
            "abort": In(1),
            "idle": Out(1),
            "error": Out(1),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        B = self.bus_bytes
        m.submodules.buffer = buf = LutFIFO(width=B * 8, depth=self.depth)
        active = Signal()
        addr = Signal(ADDR_BITS)
        remaining = Signal.like(self.cmd.payload.beats)
        # The beats the buffer has room for: its depth less the beats requested and not yet taken from it,
        # less the take of the cycle before (`took`, registered: room + took is the room). It is kept in a
        # register, and so is one more than it, so that the room check below starts from registers, not from
        # a sum of them. (The take itself, the consumer's ready, as the sums' carry in was tiny's longest path
        # after nextpnr at 2649d23, 86.3 MHz.)
        room = Signal(range(self.depth + 1), init=self.depth)
        room_1 = Signal(range(self.depth + 2), init=self.depth + 1)
        # The next burst's length, registered: worked out when the command starts and, the cycle after each
        # burst (`settling`, when the arbiter holds its grant), from registers: the beats left and the beats to
        # the 4 KiB boundary (`page_left`, kept beside the address as Store2D keeps it), each brought up to date
        # as the burst issues by one difference. Neither the sums nor the compares lie ahead of the grant, nor
        # one after the other: from the address as the grant had just registered it, the boundary's carry into
        # the room verdict below was seed 3's longest path after nextpnr at de4d77b; the differences and the
        # compares in series, in the grant's cycle, the default seed's at 9b8fceb.
        page = BOUNDARY_BYTES >> exact_log2(B)
        length = Signal(range(self.max_burst + 1))
        page_left = Signal(range(page + 1))
        settling = Signal()

        aborted = Signal()
        m.d.sync += aborted.eq(self.abort)
        pending = Signal()
        pending_addr = Signal.like(self.cmd.payload.addr)
        pending_beats = Signal.like(self.cmd.payload.beats)
        starting = pending & ~active

        ar = self.bus.ar
        issued = ar.valid & ar.ready
        taken = self.beats.valid & self.beats.ready
        # Whether the next burst fits the buffer (length <= room), registered: the compare lay ahead of the
        # arbiter's grant on tiny's longest path. It is worked out for the state after a cycle without an
        # issue; after an issue the arbiter holds its grant for a cycle, when the flag is not looked at, and it
        # is exact again the cycle after. Where the length is still to be worked out (a request starting, or
        # settling after a burst), the verdict compares with what the length will be (`_burst_len_at_most`,
        # `_paged_burst_len_at_most`).
        # The verdict counts the takes up to the cycle before (the room and `took`, registers), not this
        # cycle's: a burst is requested two cycles after the take that makes room for it
        # (`Microarch.reader_room_cycles`), and the consumer's ready (through its unpacker's state) leads
        # nowhere near ARVALID. (Picked by this cycle's take, the consumer's chain and two long routes into
        # ARVALID failed 100 MHz after nextpnr in every reader: the compute reader's, seed 4 at de4d77b, -0.92
        # ns; fetch's, seed 4 at 2ece543, -0.27 ns; the keep wires that made the take the last LUT's input at
        # de4d77b had not been enough.)
        def fits_in(room: Value) -> Value:
            return Mux(starting, _burst_len_at_most(pending_addr, pending_beats, room, B, self.max_burst),
                       Mux(settling, _paged_burst_len_at_most(page_left, remaining, room, self.max_burst),
                           length <= room))

        took = Signal()
        fits = Mux(took, fits_in(room_1), fits_in(room))
        # ARVALID is a register, the verdict's next value and the state's: no issue this cycle (the cycle
        # after an issue settles), no abort, a request in progress or starting with beats. As an AND of
        # registers, one reader's request lay a LUT and a long route ahead of the arbiter's ready for the
        # others, and on through their issues into their counters' enables (fetch's abort into the compute
        # reader's after nextpnr at bd8ef8e, the default seed's longest path; fetch's `active` with seed 4).
        going = ~aborted & ~self.abort & (active | (pending & (pending_beats != 0)))
        want = Signal()
        m.d.sync += [want.eq(fits & going & ~issued), took.eq(taken)]
        m.d.comb += [
            ar.payload.addr.eq(addr),
            ar.payload.len.eq(length - 1),
            ar.valid.eq(want),
        ]
        # The room after this cycle, with and without an issue, picked by the issue: the grant (which waits on
        # every client's request) selects after the sums instead of leading into their carry chains (as
        # room - Mux(issued, length, 0) + taken it did: tiny's longest path after nextpnr at 84.7 MHz, 5f3f626).
        # The take of the cycle before (a register) is a carry in. (The pick is an AND-OR, which Yosys'
        # opt_share cannot fold back into one sum on a multiplexed operand.)
        for register in (room, room_1):
            after_issue, without_issue = (register - length + took)[:len(register)], (register + took)[:len(register)]
            m.d.sync += register.eq((after_issue & issued.replicate(len(register)))
                                    | (without_issue & (~issued).replicate(len(register))))
        m.d.sync += settling.eq(issued)
        with m.If(issued):
            m.d.sync += [addr.eq(addr + (length << exact_log2(B))), remaining.eq(remaining - length),
                         page_left.eq(_page_left_after(page_left, page_left == length, length, B))]
            with m.If(remaining == length):
                m.d.sync += active.eq(0)
        with m.If(settling):
            m.d.sync += length.eq(_paged_burst_len(page_left, remaining, self.max_burst))
        # The command, registered as it is taken and started from that register once the request before it
        # has issued its last burst: the first burst's length is worked out from registers, not from the
        # client's address arithmetic (Load2D's row address into the 4 KiB compares was tiny's longest path).
        # A client hands its next request over while the one before is still issuing.
        m.d.comb += self.cmd.ready.eq(~pending & ~aborted)
        with m.If(self.cmd.valid & self.cmd.ready):
            m.d.sync += [pending.eq(1), pending_addr.eq(self.cmd.payload.addr),
                         pending_beats.eq(self.cmd.payload.beats)]
        with m.If(starting):
            m.d.sync += [pending.eq(0), addr.eq(pending_addr), remaining.eq(pending_beats),
                         active.eq(pending_beats != 0), page_left.eq(_beats_to_boundary(pending_addr, B)),
                         length.eq(_burst_len(pending_addr, pending_beats, B, self.max_burst))]
        with m.If(aborted):
            m.d.sync += [active.eq(0), pending.eq(0)]

        r = self.bus.r
        m.d.comb += [buf.w_data.eq(r.payload.data), buf.w_en.eq(r.valid), r.ready.eq(buf.w_rdy)]
        with m.If(r.valid & r.ready & (r.payload.resp != RESP_OKAY)):
            m.d.sync += self.error.eq(1)
        # A skid register between the buffer and the consumer: the buffer's read enable is a register (the
        # skid is empty), not the consumer's ready, which waits on the consumer's state and the data's valid:
        # that ready through the buffer's read side into its level was tiny's longest path after place and
        # route (77.8 MHz, 689eb37). A beat the consumer does not take as it leaves the buffer waits in the
        # skid, and the consumer sees the same beats in the same cycles; the room counts the consumer's takes,
        # so at most `depth` beats are due, in the buffer or the skid.
        skid_full = Signal()
        skid = Signal(B * 8)
        m.d.comb += [
            self.beats.payload.eq(Mux(skid_full, skid, buf.r_data)),
            self.beats.valid.eq((skid_full | buf.r_rdy) & ~aborted),
            buf.r_en.eq(~skid_full | aborted),
            self.idle.eq(~active & ~pending & (Mux(took, room_1, room) == self.depth)),
        ]
        with m.If(aborted | (skid_full & self.beats.ready)):
            m.d.sync += skid_full.eq(0)
        with m.Elif(~skid_full & buf.r_rdy & ~self.beats.ready):
            m.d.sync += skid_full.eq(1)
        # The skid's data follows the buffer's while it is empty, so its enable is a register, not the
        # consumer's ready (which fanned out to every bit of it on one of tiny's longest paths at e11ebcc).
        with m.If(~skid_full):
            m.d.sync += skid.eq(buf.r_data)
        return m


class _RowConverter(wiring.Component):
    """Between beats of `bus_bytes` and elements of `elem_bytes`; per command, `count` elements starting at
    element lane `lane` of the first beat (lane is 0 when elements fill whole beats)."""

    def __init__(self, *, bus_bytes: int, elem_bytes: int, count_bits: int):
        self.bus_bytes, self.elem_bytes = bus_bytes, elem_bytes
        self.lanes = max(1, bus_bytes // elem_bytes)
        super().__init__({
            "cmd": In(stream.Signature(data.StructLayout({
                "lane": max(1, exact_log2(self.lanes)), "count": count_bits}))),
            **self.data_ports(),
        })

    def data_ports(self) -> dict[str, wiring.Member]:
        """The beat and element streams, in the direction of the conversion."""
        raise NotImplementedError


class RowUnpacker(_RowConverter):
    """Beats into elements of `elem_bytes`. Every beat of a command is consumed; an element that spans
    several beats is assembled in a register."""

    def data_ports(self) -> dict[str, wiring.Member]:
        return {"beats": In(stream.Signature(self.bus_bytes * 8)), "elems": Out(stream.Signature(self.elem_bytes * 8))}

    def elaborate(self, platform: object) -> Module:
        m = Module()
        B, E = self.bus_bytes, self.elem_bytes
        active = Signal()
        remaining = Signal.like(self.cmd.payload.count)
        cmd, beats, elems = self.cmd, self.beats, self.elems
        load = cmd.valid & cmd.ready
        # Whether one element is left (or none, below), kept in a register beside the count: the count's
        # compare ahead of the beats' ready lay on the paths back into the burst reader's buffer.
        if E <= B:
            k = B // E
            last = Signal()
            take = elems.valid & elems.ready
            m.d.comb += [elems.valid.eq(active & beats.valid), cmd.ready.eq(~active | (take & last))]
            with m.If(take):
                m.d.sync += [remaining.eq(remaining - 1), last.eq(remaining == 2)]
                with m.If(last):
                    m.d.sync += active.eq(0)
            with m.If(load):
                m.d.sync += [active.eq(cmd.payload.count != 0), remaining.eq(cmd.payload.count),
                             last.eq(cmd.payload.count == 1)]
            # The beats' ready does not wait on their valid (a ready without a valid moves nothing): the
            # buffer's valid through the take back into its read enable and level was among tiny's longest
            # paths after place and route (0c30693).
            if k == 1:
                m.d.comb += [elems.payload.eq(beats.payload), beats.ready.eq(active & elems.ready)]
            else:
                lane = Signal(range(k))
                # Whether the unpacker is active and its next take ends a beat (the beat's last lane or the
                # command's last element), a register beside the three: as their AND and compare, the beats'
                # ready lay three LUTs behind them on the way into the burst reader's ARVALID (the compute
                # unit's accumulator rows, seed 4's longest path after nextpnr at de4d77b).
                beat_due = Signal()
                m.d.comb += [elems.payload.eq(beats.payload.word_select(lane, E * 8)),
                             beats.ready.eq(elems.ready & beat_due)]
                with m.If(take):
                    m.d.sync += [lane.eq(lane + 1), beat_due.eq(~last & ((lane == k - 2) | (remaining == 2)))]
                with m.If(load):
                    m.d.sync += [lane.eq(cmd.payload.lane), beat_due.eq(
                        (cmd.payload.count != 0) & ((cmd.payload.lane == k - 1) | (cmd.payload.count == 1)))]
        else:
            beats_per = E // B
            buf = Signal(E * 8)
            n = Signal(range(beats_per))
            full = Signal()
            none_left = Signal()  # remaining == 0
            open_ = Signal()  # active & ~none_left, a register (as `beat_due` above)
            out = full & elems.ready
            accept = open_ & (~full | elems.ready)
            m.d.comb += [
                elems.valid.eq(full), elems.payload.eq(buf), beats.ready.eq(accept),
                cmd.ready.eq(~active | (none_left & ~full)),
            ]
            with m.If(out):
                m.d.sync += full.eq(0)
            with m.If(beats.valid & accept):
                m.d.sync += [buf.eq(Cat(buf[B * 8:], beats.payload)), n.eq(n + 1)]
                with m.If(n == beats_per - 1):
                    m.d.sync += [full.eq(1), n.eq(0), remaining.eq(remaining - 1), none_left.eq(remaining == 1),
                                 open_.eq(remaining != 1)]
            with m.If(active & none_left & ~full):
                m.d.sync += active.eq(0)
            with m.If(load):
                m.d.sync += [active.eq(cmd.payload.count != 0), remaining.eq(cmd.payload.count),
                             none_left.eq(cmd.payload.count == 0), open_.eq(cmd.payload.count != 0)]
        return m


#: The mem-format fields a 2-D store takes from its instruction; a load takes the padding too.
STORE_FIELDS = ("sram_base", "dram_base", "y_size", "x_size", "x_stride")
LOAD_FIELDS = (*STORE_FIELDS, "y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1")


def _isa_members(mem_format: Format, names: tuple[str, ...]) -> dict[str, ShapeLike]:
    """The shapes of fields `names` of the ISA's mem format: a wider ISA field makes a wider command."""
    fields = [mem_format.field(name) for name in names]
    return {f.name: signed(f.width) if f.signed else unsigned(f.width) for f in fields}


def load_cmd_layout(mem_format: Format, *, targets: int) -> data.StructLayout:
    """The fields of a LOAD that the DMA needs (the unit resolves mem_id into a target index)."""
    return data.StructLayout({"target": range(max(2, targets)), **_isa_members(mem_format, LOAD_FIELDS)})


def store_cmd_layout(mem_format: Format) -> data.StructLayout:
    """The fields of a STORE that the DMA needs."""
    return data.StructLayout(_isa_members(mem_format, STORE_FIELDS))


def command_from(payload: data.View, insn: data.View) -> list[Any]:
    """Assign each ISA field of the DMA command `payload` from the mem-format view `insn` (not the target)."""
    names = [name for name in payload.shape().members if name in LOAD_FIELDS]
    return [getattr(payload, name).eq(getattr(insn, name)) for name in names]


def _segment(m: Module, row_addr: Signal, x_size: Signal, elem_bytes: int, bus_bytes: int
             ) -> tuple[Signal, Signal, Signal]:
    """Aligned start, beat count and first lane of the DRAM row [row_addr, row_addr + x_size) elements."""
    shift, bshift = exact_log2(elem_bytes), exact_log2(bus_bytes)
    start = Signal(ADDR_BITS + 8)
    aligned = Signal(ADDR_BITS + 8)
    beats = Signal(len(x_size) + 9)
    lane = Signal(max(1, bshift - shift) if elem_bytes < bus_bytes else 1)
    # The row's bytes from the aligned start are its own and the start's offset in its beat: a sum of the row's
    # size and a few bits, not the address's end less its aligned start (two address-wide carry chains in
    # series, into Store2D's `remaining` after nextpnr at b89318d).
    m.d.comb += [
        start.eq(row_addr << shift),
        aligned.eq(start & ~Const(bus_bytes - 1, len(start))),
        beats.eq(((x_size << shift) + start[:bshift] + bus_bytes - 1) >> bshift),
    ]
    if elem_bytes < bus_bytes:
        m.d.comb += lane.eq(start[shift:bshift])
    return aligned, beats, lane


class Load2D(wiring.Component):
    """A padded 2-D load into one of several SRAMs (`targets`: element bytes of each).

    ``write`` carries one element per cycle (``en``, ``target``, ``addr`` = sram_base + position, ``data``
    zero-extended to the widest target), registered: it trails the walk by a cycle, and the last write is in
    the cycle busy falls; padding positions write zeros. The caller resolves x_size == 0
    (a no-op) itself: every command here moves at least one element per DRAM row.
    """

    def __init__(self, *, bus_bytes: int, targets: tuple[int, ...], mem_format: Format,
                 unpack_depth: int = UNPACK_DEPTH):
        self.bus_bytes, self.targets = bus_bytes, tuple(targets)
        self.unpack_depth = unpack_depth
        self.data_bits = max(targets) * 8
        self.cmd_layout = load_cmd_layout(mem_format, targets=len(targets))
        sram_bits = mem_format.field("sram_base").width
        self.count_bits = mem_format.field("x_size").width + 9
        super().__init__({
            "cmd": In(stream.Signature(self.cmd_layout)),
            "bus": Out(read_client_signature(addr_bits=ADDR_BITS, data_bits=bus_bytes * 8)),
            "write": Out(data.StructLayout({
                "en": 1, "target": range(max(2, len(targets))), "addr": sram_bits, "data": self.data_bits})),
            "busy": Out(1),
            "error": Out(1),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        B = self.bus_bytes
        m.submodules.reader = reader = BurstReader(bus_bytes=B, count_bits=self.count_bits)
        wiring.connect(m, wiring.flipped(self.bus), reader.bus)
        m.d.comb += self.error.eq(reader.error)
        f = Signal(self.cmd_layout)
        empty = Signal()  # a tile of no rows or no columns

        # Issue: one read per DRAM row. Whether rows are left to issue, and which target the command names, are
        # kept in registers (issue_y != y_size; target == t): their compares fed the reader's command and the
        # unpackers' queues, among tiny's longest paths.
        issue_y = Signal.like(f.y_size)
        issue_last = Signal.like(f.y_size)  # y_size - 1
        row_addr = Signal.like(f.dram_base)
        issuing = Signal()
        to = Signal(len(self.targets))  # one-hot: the command's target
        # One queue of unpack commands serves every target's unpacker: a command names one target and its walk
        # ends (every element taken) before the next command starts, so only the command's unpacker reads it.
        # The issue then waits on one queue's room, not a pick among each target's (the pick, through the
        # reader's command into its every register, was among tiny's longest paths after nextpnr at 1a2b4b4).
        unpackers = [RowUnpacker(bus_bytes=B, elem_bytes=elem_bytes, count_bits=self.count_bits)
                     for elem_bytes in self.targets]
        cmd_bits = max(len(unp.cmd.payload.as_value()) for unp in unpackers)
        m.submodules.unpack_queue = q = LutFIFO(width=cmd_bits, depth=self.unpack_depth)
        go = issuing & reader.cmd.ready & q.w_rdy  # (issuing only while busy: it falls with busy at the latest)
        m.d.comb += [q.w_en.eq(go), reader.cmd.valid.eq(issuing & q.w_rdy)]
        for t, (unp, elem_bytes) in enumerate(zip(unpackers, self.targets, strict=True)):
            m.submodules[f"unpack{t}"] = unp
            m.d.comb += [unp.cmd.payload.eq(q.r_data), unp.cmd.valid.eq(q.r_rdy & to[t])]
            aligned, beats, lane = _segment(m, row_addr, f.x_size, elem_bytes, B)
            m.d.comb += [
                unp.beats.payload.eq(reader.beats.payload),
                unp.beats.valid.eq(reader.beats.valid & to[t]),
            ]
            with m.If(to[t]):
                m.d.comb += [
                    q.w_data.eq(Cat(lane, f.x_size)), q.r_en.eq(unp.cmd.ready),
                    reader.cmd.payload.addr.eq(aligned), reader.cmd.payload.beats.eq(beats),
                ]
        # The reader's beats go to whichever unpacker is ready, not through the target's pick: only the
        # command's unpacker is ever loaded, and it has taken its last beat before the walk ends and the next
        # command moves `to` (an idle unpacker's ready is low). Through the pick, the target register lay a
        # LUT and a long route further from the reader's take (into its ARVALID: seed 4's longest path).
        m.d.comb += reader.beats.ready.eq(reduce(operator.or_, [unp.beats.ready for unp in unpackers]))
        with m.If(go):
            m.d.sync += [issue_y.eq(issue_y + 1), row_addr.eq(row_addr + f.x_stride), issuing.eq(issue_y != issue_last)]

        # Write: walk the padded tile in row order. Whether the position holds data (not padding) is registered
        # with it, worked out for the next position ahead of the step: it gates the unpackers' ready, whose
        # chain back into the burst reader's buffer was the design's longest path. It is kept as two flags,
        # the row's and the column's, which flip where the walk's next position meets a bound: equality with
        # the bounds less one, registered as the command is taken, where the position's magnitude compares
        # with the bounds and their carries were among tiny's longest paths. (A bound of 0 less one is all
        # ones, which no position reaches: a side of n-bit size and 4-bit pads spans at most 2**n + 29
        # positions, counted in n + 5 bits.) Whether the walk is at a row's last column, in the last row, or
        # past the tile are flags of the same kind, so that the step and the end of the walk (the unit's busy)
        # see registers, not compares of the position with the bounds.
        yy = Signal(len(f.y_size) + 5)
        xx = Signal(len(f.x_size) + 5)
        pos = Signal.like(f.sram_base)
        inside = Signal()
        # busy & inside, the unpackers' ready, kept in its own register beside the two (it changes where they
        # do): the AND ahead of an unpacker's take, and so of the enables of its wide element register, was
        # among tiny's longest paths after nextpnr at 1a2b4b4.
        wants = Signal()
        in_y, in_x = Signal(), Signal()
        row_end, last_row, walked = Signal(), Signal(), Signal()
        one_col = Signal()  # a tile one column wide: every position ends its row
        y_stop, x_stop = Signal.like(yy), Signal.like(xx)  # the tile's height and width less two
        y_first, y_last = Signal.like(yy), Signal.like(yy)  # a data row's bounds, less one
        x_first, x_last = Signal.like(xx), Signal.like(xx)
        x_starts = Signal()  # a row starts with data: no padding before its columns
        y_data = Signal()  # y_size != 0 (x_size is not 0: see the class)
        next_x, next_y = Mux(row_end, 0, xx + 1), Mux(row_end, yy + 1, yy)
        in_x_next = Mux(row_end, x_starts, (in_x & (xx != x_last)) | (xx == x_first))
        in_y_next = Mux(row_end, (in_y & (yy != y_last)) | ((yy == y_first) & y_data), in_y)
        elem_valid = Signal()
        elem_data = Signal(self.data_bits)
        for t, unp in enumerate(unpackers):
            # (every unpacker sees the walk's ready: an idle one offers no element, and the target's pick
            # kept out of the unpackers' beats ready, as below)
            m.d.comb += unp.elems.ready.eq(wants)
            with m.If(to[t]):
                m.d.comb += [elem_valid.eq(unp.elems.valid), elem_data.eq(unp.elems.payload)]
        writing = self.busy & ~empty & ~walked
        step = writing & (~inside | elem_valid)
        # The write is registered: the reader's buffer (a block RAM) through the unpacker into a target's write
        # port (the accumulator's through its bank muxes) was the design's longest path. The last write is in
        # the first cycle with busy low, the cycle its unit takes to end the instruction: no reader sees a row
        # early and the timing is as before.
        # (Its data are read only beside its enable, so the unit's reset leaves them alone: the reset ORed into
        # the padding's zeroing, on every data bit's reset input, failed 100 MHz after nextpnr at 57a6132.)
        write_data = Signal.like(self.write.data, reset_less=True)
        m.d.sync += [
            self.write.en.eq(step), self.write.target.eq(f.target), self.write.addr.eq(f.sram_base + pos),
            write_data.eq(Mux(inside, elem_data, 0)),
        ]
        m.d.comb += self.write.data.eq(write_data)
        with m.If(step):
            m.d.sync += [pos.eq(pos + 1), xx.eq(next_x), yy.eq(next_y), in_x.eq(in_x_next), in_y.eq(in_y_next),
                         inside.eq(in_x_next & in_y_next), wants.eq(in_x_next & in_y_next),
                         row_end.eq(Mux(row_end, one_col, xx == x_stop)), walked.eq(last_row & row_end)]
            with m.If(row_end):
                m.d.sync += last_row.eq(yy == y_stop)
        finished = empty | (last_row & row_end & step)
        with m.If(self.busy & finished & (~issuing | empty)):
            m.d.sync += [self.busy.eq(0), issuing.eq(0), wants.eq(0)]

        m.d.comb += self.cmd.ready.eq(~self.busy)
        with m.If(self.cmd.valid & self.cmd.ready):
            p = self.cmd.payload
            rows, cols = p.y_pad_0 + p.y_size + p.y_pad_1, p.x_pad_0 + p.x_size + p.x_pad_1
            # an axis starts inside its data when nothing pads before it and it has data at all
            y_inside0, x_inside0 = (p.y_pad_0 == 0) & (p.y_size != 0), (p.x_pad_0 == 0) & (p.x_size != 0)
            at_data = y_inside0 & x_inside0
            x_one = _one_in_all(p.x_pad_0, p.x_size, p.x_pad_1)
            m.d.sync += [
                f.eq(p), self.busy.eq(1), issue_y.eq(0), row_addr.eq(p.dram_base), yy.eq(0), xx.eq(0), pos.eq(0),
                issuing.eq(p.y_size != 0), issue_last.eq(p.y_size - 1),
                to.eq(Cat(*[p.target == t for t in range(len(self.targets))])),
                # a side is empty when its three parts are: no sum and compare from the instruction's fields
                # into the flag (that carry chain was among tiny's longest paths after nextpnr at fd83085)
                empty.eq((Cat(p.y_pad_0, p.y_size, p.y_pad_1) == 0) | (Cat(p.x_pad_0, p.x_size, p.x_pad_1) == 0)),
                # position (0, 0) holds data when there is no padding before it on either axis
                inside.eq(at_data), wants.eq(at_data),
                in_y.eq(y_inside0), in_x.eq(x_inside0), x_starts.eq(x_inside0), y_data.eq(p.y_size != 0),
                row_end.eq(x_one), one_col.eq(x_one), last_row.eq(_one_in_all(p.y_pad_0, p.y_size, p.y_pad_1)),
                walked.eq(0),
                y_stop.eq(rows - 2), x_stop.eq(cols - 2),
                y_first.eq(p.y_pad_0 - 1), y_last.eq(p.y_pad_0 + p.y_size - 1),
                x_first.eq(p.x_pad_0 - 1), x_last.eq(p.x_pad_0 + p.x_size - 1),
            ]
        return m


class RowPacker(_RowConverter):
    """Elements of `elem_bytes` into beats with byte strobes (the inverse of :class:`RowUnpacker`)."""

    def data_ports(self) -> dict[str, wiring.Member]:
        return {
            "elems": In(stream.Signature(self.elem_bytes * 8)),
            "beats": Out(stream.Signature(data.StructLayout({"data": self.bus_bytes * 8, "strb": self.bus_bytes}))),
        }

    def elaborate(self, platform: object) -> Module:
        m = Module()
        B, E = self.bus_bytes, self.elem_bytes
        cmd, elems, beats = self.cmd, self.elems, self.beats
        if E < B:
            k = B // E
            active = Signal()
            remaining = Signal.like(cmd.payload.count)
            lane = Signal(range(k))
            acc_data = Signal(B * 8)
            acc_strb = Signal(B)
            last = Signal()  # remaining == 1, in a register: its compare fed the W channel's valid and ready
            # whether this element completes a beat (`completes`), a register too: it leads into the
            # W channel's valid and into the row queue's and the segment queue's read enables and levels, which
            # were among tiny's longest paths after place and route
            emit = Signal()

            def completes(lane: Value, last: Value) -> Value:
                return (lane == k - 1) | last

            word = Signal(B * 8)
            strb = Signal(B)
            m.d.comb += [
                word.eq(elems.payload << (lane * (E * 8))),
                strb.eq(Const((1 << E) - 1, B) << (lane * E)),
                beats.payload.data.eq(acc_data | word),
                beats.payload.strb.eq(acc_strb | strb),
                beats.valid.eq(active & elems.valid & emit),
                elems.ready.eq(active & (~emit | beats.ready)),
            ]
            take = elems.valid & elems.ready
            m.d.comb += cmd.ready.eq(~active | (take & last))
            with m.If(take):
                m.d.sync += [remaining.eq(remaining - 1), last.eq(remaining == 2), lane.eq(lane + 1),
                             emit.eq(completes((lane + 1)[:len(lane)], remaining == 2))]
                with m.If(emit):
                    m.d.sync += [acc_data.eq(0), acc_strb.eq(0)]
                with m.Else():
                    m.d.sync += [acc_data.eq(acc_data | word), acc_strb.eq(acc_strb | strb)]
                with m.If(last):
                    m.d.sync += active.eq(0)
            with m.If(cmd.valid & cmd.ready):
                m.d.sync += [active.eq(cmd.payload.count != 0), remaining.eq(cmd.payload.count),
                             last.eq(cmd.payload.count == 1), lane.eq(cmd.payload.lane),
                             emit.eq(completes(cmd.payload.lane, cmd.payload.count == 1))]
        elif E == B:
            m.d.comb += [
                cmd.ready.eq(1),  # whole beats: the burst lengths alone frame the data
                beats.payload.data.eq(elems.payload), beats.payload.strb.eq((1 << B) - 1),
                beats.valid.eq(elems.valid), elems.ready.eq(beats.ready),
            ]
        else:
            per = E // B
            buf = Signal(E * 8)
            n = Signal(range(per))
            have = Signal()
            done = beats.valid & beats.ready & (n == per - 1)
            m.d.comb += [
                cmd.ready.eq(1),
                beats.payload.data.eq(buf[:B * 8]), beats.payload.strb.eq((1 << B) - 1),
                beats.valid.eq(have), elems.ready.eq(~have | done),
            ]
            with m.If(beats.valid & beats.ready):
                m.d.sync += [buf.eq(buf >> (B * 8)), n.eq(n + 1)]
                with m.If(n == per - 1):
                    m.d.sync += [have.eq(0), n.eq(0)]
            with m.If(elems.valid & elems.ready):
                m.d.sync += [buf.eq(elems.payload), have.eq(1), n.eq(0)]
        return m


class Store2D(wiring.Component):
    """A 2-D store from an SRAM (through ``rd_addr``/``rd_data``, one cycle read latency) to DRAM.

    Reads ``y_size * x_size`` consecutive SRAM rows from ``sram_base``; DRAM row y starts at element
    ``dram_base + y * x_stride``. Rows are written in order, one burst sequence per row, so overlapping
    rows end as the later one wrote them. ``busy`` drops when every B response is back. The caller resolves
    x_size == 0 (a no-op) itself.
    """

    ROW_QUEUE = 4

    def __init__(self, *, bus_bytes: int, elem_bytes: int, mem_format: Format, max_burst: int = MAX_BURST,
                 read_stages: int = STORE_READ_STAGES):
        if read_stages < 1:
            raise ValueError(f"an SRAM read takes at least one stage, got {read_stages}")
        self.bus_bytes, self.elem_bytes, self.max_burst = bus_bytes, elem_bytes, max_burst
        self.read_stages = read_stages
        self.cmd_layout = store_cmd_layout(mem_format)
        self.count_bits = mem_format.field("x_size").width + 9
        super().__init__({
            "cmd": In(stream.Signature(self.cmd_layout)),
            "axi": Out(axi4_write_signature(addr_bits=ADDR_BITS, data_bits=bus_bytes * 8, id_bits=1)),
            "rd_addr": Out(mem_format.field("sram_base").width),
            "rd_en": Out(1),
            "rd_data": In(elem_bytes * 8),
            "busy": Out(1),
            "error": Out(1),
            "beats": Out(1),  # one W beat accepted this cycle
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        B, E = self.bus_bytes, self.elem_bytes
        axi = self.axi
        f = Signal(self.cmd_layout)

        # SRAM -> row queue, one read per cycle while the queue has room for what is in flight. The reads are
        # counted by row and column (the caller sends x_size >= 1), not against y_size * x_size: that product
        # into the read enable was tiny's longest path after place and route.
        m.submodules.rows = rows = fifo.SyncFIFO(width=E * 8, depth=self.ROW_QUEUE)
        rd_pos = Signal.like(f.sram_base)
        rd_x, x_last = Signal.like(f.x_size), Signal.like(f.x_size)
        rd_y = Signal.like(f.y_size)
        reading = rd_y != f.y_size
        # The read data are registered before they enter the queue (`read_stages`): `in_flight` holds a bit per
        # read in the block RAM or a data register, so the room counts them.
        in_flight = Signal(self.read_stages)
        read: Value = self.rd_data
        for k in range(self.read_stages - 1):
            registered = Signal.like(self.rd_data, name=f"read_{k}")
            m.d.sync += registered.eq(read)
            read = registered
        can_read = self.busy & reading & (rows.level + sum(in_flight) < self.ROW_QUEUE)
        m.d.comb += [self.rd_addr.eq(f.sram_base + rd_pos), self.rd_en.eq(can_read),
                     rows.w_data.eq(read), rows.w_en.eq(in_flight[-1])]
        m.d.sync += in_flight.eq(Cat(can_read, in_flight[:-1]))
        row_read = rd_x == x_last
        with m.If(can_read):
            m.d.sync += [rd_pos.eq(rd_pos + 1), rd_x.eq(Mux(row_read, 0, rd_x + 1))]
            with m.If(row_read):
                m.d.sync += rd_y.eq(rd_y + 1)

        m.submodules.packer = packer = RowPacker(bus_bytes=B, elem_bytes=E, count_bits=self.count_bits)
        m.d.comb += [packer.elems.payload.eq(rows.r_data), packer.elems.valid.eq(rows.r_rdy),
                     rows.r_en.eq(packer.elems.ready)]
        m.submodules.seg_queue = seg_q = LutFIFO(
            width=len(packer.cmd.payload.as_value()), depth=STORE_SEG_DEPTH)
        m.d.comb += [packer.cmd.payload.eq(seg_q.r_data), packer.cmd.valid.eq(seg_q.r_rdy),
                     seg_q.r_en.eq(packer.cmd.ready)]

        # Segments (one per DRAM row) and their bursts on AW; burst lengths queue up for WLAST.
        m.submodules.len_queue = len_q = LutFIFO(width=len(axi.awlen), depth=STORE_LEN_DEPTH)
        seg_y = Signal.like(f.y_size)
        # Whether rows are left to address (seg_y != y_size), kept in a register beside seg_y: the compare
        # lay ahead of the AW address's enable on one of tiny's longest paths.
        segs_left = Signal()
        seg_last = Signal.like(f.y_size)  # y_size - 1
        row_addr = Signal.like(f.dram_base)
        in_burst = Signal()
        addr = Signal(ADDR_BITS)
        remaining = Signal(self.count_bits)
        aligned, beats, lane = _segment(m, row_addr, f.x_size, E, B)
        # Whether a segment is due (busy, no burst in progress, rows left), kept in a register of its own beside
        # the three: their AND ahead of the segment's start, which enables the address and the burst's
        # registers, failed 100 MHz after nextpnr at a52c849 (in_burst into them, the default seed's only
        # failing family). It falls as a segment starts, rises with the row's last burst where rows are left,
        # and is set as a command is taken (busy falls only once every row has issued).
        seg_due = Signal()
        start_seg = seg_due & seg_q.w_rdy
        m.d.comb += [seg_q.w_data.eq(Cat(lane, f.x_size)), seg_q.w_en.eq(start_seg)]
        # The beats from the address to its 4 KiB boundary, kept in a register beside it: after a burst that
        # ends there, the beats left are the remaining less this register, not less a difference worked out
        # from the address (two carry chains in series from the address into `remaining`: 10.9 ns after
        # nextpnr at 84408ed).
        page_left = Signal(BOUNDARY_BITS - exact_log2(B) + 1)
        with m.If(start_seg):
            m.d.sync += [in_burst.eq(1), seg_due.eq(0), addr.eq(aligned), page_left.eq(_beats_to_boundary(aligned, B)),
                         remaining.eq(beats), seg_y.eq(seg_y + 1),
                         segs_left.eq(seg_y != seg_last),
                         row_addr.eq(row_addr + f.x_stride)]
        # The row's last burst: the one that takes all that remains (the length's multiplexers lay ahead of
        # in_burst on one of tiny's longest paths).
        last_burst = _paged_burst_takes_all(page_left, remaining, self.max_burst)
        # A burst that is not a row's last ends at the 4 KiB boundary where at most a longest burst's beats are
        # left to it (page_left), else it is a longest burst short of it; the burst after it starts there: two
        # sums from the address side by side, not the length's compares and multiplexers into one (the address
        # through the length back into itself was tiny's longest path). After a row's last burst the next row
        # reloads them. A longest burst that ends exactly at the boundary counts as reaching it, so the next
        # page's beats are reloaded: as `page_left < max_burst` it left page_left at 0 on the next page, whose
        # first burst then asked for page_left - 1 beats and the unit hung (`weft bench rtl` on `default`, its
        # third block's store, from 0d59170 on).
        assert self.max_burst * B <= BOUNDARY_BYTES
        to_boundary = _at_most(page_left, self.max_burst)
        next_page = Cat(Const(0, BOUNDARY_BITS), addr[BOUNDARY_BITS:] + 1)
        # AWLEN, the burst's length less one (the length's chain of compares and multiplexers from the address
        # into the length queue was tiny's longest path at 76.8 MHz)
        awlen = Signal.like(axi.awlen)
        m.d.comb += awlen.eq(_paged_burst_len(page_left, remaining, self.max_burst, less=1))
        m.d.comb += [
            axi.awaddr.eq(addr), axi.awlen.eq(awlen), axi.awsize.eq(exact_log2(B)),
            axi.awburst.eq(BURST_INCR), axi.awcache.eq(CACHE_BITS), axi.awvalid.eq(in_burst & len_q.w_rdy),
            len_q.w_data.eq(awlen), len_q.w_en.eq(axi.awvalid & axi.awready),
        ]
        outstanding = Signal(16)  # bursts whose B response is due
        aw_done = axi.awvalid & axi.awready
        b_done = axi.bvalid & axi.bready
        # Its next value picked from sums of the register alone, the handshakes last (the AW handshake through
        # one carry chain into it failed 100 MHz after nextpnr at 7f9ca06, seed 2: 10 bits).
        more, fewer = Signal.like(outstanding), Signal.like(outstanding)
        m.d.comb += [more.eq(outstanding + 1), fewer.eq(outstanding - 1)]
        m.d.sync += outstanding.eq(Mux(aw_done == b_done, outstanding, Mux(aw_done, more, fewer)))
        with m.If(aw_done):
            m.d.sync += [
                addr.eq(Mux(to_boundary, next_page, addr + self.max_burst * B)),
                remaining.eq(Mux(to_boundary, remaining - page_left, remaining - self.max_burst)),
                page_left.eq(_page_left_after(page_left, to_boundary, self.max_burst, B)),
            ]
            with m.If(last_burst):
                m.d.sync += [in_burst.eq(0), seg_due.eq(segs_left)]

        # W: packed beats, WLAST from the burst lengths.
        w_count = Signal(len(axi.awlen))
        m.d.comb += [
            axi.wdata.eq(packer.beats.payload.data), axi.wstrb.eq(packer.beats.payload.strb),
            axi.wvalid.eq(packer.beats.valid & len_q.r_rdy), axi.wlast.eq(w_count == len_q.r_data),
            packer.beats.ready.eq(axi.wready & len_q.r_rdy),
            len_q.r_en.eq(axi.wvalid & axi.wready & axi.wlast),
            self.beats.eq(axi.wvalid & axi.wready),
            axi.bready.eq(1),
        ]
        with m.If(axi.wvalid & axi.wready):
            m.d.sync += w_count.eq(Mux(axi.wlast, 0, w_count + 1))
        with m.If(b_done & (axi.bresp != RESP_OKAY)):
            m.d.sync += self.error.eq(1)

        all_issued = ~in_burst & ~segs_left
        drained = ~len_q.r_rdy & (outstanding == 0) & ~rows.r_rdy & (in_flight == 0) & ~reading
        with m.If(self.busy & all_issued & drained & ~start_seg):
            m.d.sync += self.busy.eq(0)
        m.d.comb += self.cmd.ready.eq(~self.busy)
        with m.If(self.cmd.valid & self.cmd.ready):
            m.d.sync += [f.eq(self.cmd.payload), self.busy.eq(1), seg_y.eq(0), rd_pos.eq(0), rd_x.eq(0), rd_y.eq(0),
                         segs_left.eq(self.cmd.payload.y_size != 0), seg_last.eq(self.cmd.payload.y_size - 1),
                         x_last.eq(self.cmd.payload.x_size - 1), row_addr.eq(self.cmd.payload.dram_base),
                         in_burst.eq(0), seg_due.eq(self.cmd.payload.y_size != 0)]
        return m
