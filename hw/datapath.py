"""The arithmetic of the compute unit: the GEMM core, the ALU lanes and the narrowing to the output buffer.

Rows are bit vectors laid out as in DRAM (:mod:`weft.isa.arith`): element ``j`` of a row occupies bits
``[j*w, (j+1)*w)``, two's complement. The GEMM core computes every ``acc[b, o] += sum_i inp[b, i] *
wgt[o, i]`` term of one micro-op per cycle: its operands are registered as they come from the buffers' block
RAMs, then the products, then a balanced adder tree per output, registered halfway and at its root, so its
latency is :data:`GEMM_LATENCY` cycles and it accepts a new operand pair every cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.hdl import Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from weft.hw.structure import GEMM_LATENCY
from weft.isa.arith import rq_layout
from weft.isa.constants import IMM_BITS, AluOp

__all__ = ["DSP48", "GEMM_LATENCY", "MULT18X18D", "AluFirst", "AluRow", "DspPorts", "GemmCore", "alu_lane",
           "alu_lane_first", "alu_lane_last", "alu_multiplicands", "alu_selects", "elements", "multiplier_top",
           "packs_weight_pairs", "saturate_row", "select", "sign_extend_row"]


@dataclass(frozen=True)
class DspPorts:
    """A target FPGA's hard multiplier: its signed operand widths, the wide port's and the narrow one's. The
    GEMM core packs two weights into one multiplier's wide operand only where they fit it."""

    wide: int
    narrow: int
    #: The primitive the compute unit's ALU multipliers are instantiated as, with their operands registered
    #: inside it (:mod:`weft.hw.dsp`); None where the synthesizer maps ``*`` and packs the registers itself.
    registered: str | None = None
    #: Simulate :class:`weft.hw.dsp.Mult18x18dModel` in the primitive's place (tests).
    model: bool = False


#: Xilinx's DSP48E1/E2 (A:D port 25 bits, B 18): the RTL's default, as the PYNQ boards are Xilinx parts.
DSP48 = DspPorts(wide=25, narrow=18)
#: Lattice ECP5's MULT18X18D: a packed int8 pair (24 bits) would spill out of its 18-bit ports into a second
#: multiplier and a carry chain after it (the GEMM core's products were among tiny's longest paths after
#: nextpnr), so the ECP5 flow builds one product per multiplier.
MULT18X18D = DspPorts(wide=18, narrow=18, registered="MULT18X18D")


def packs_weight_pairs(inp_width: int, wgt_width: int, dsp: DspPorts = DSP48) -> bool:
    """Whether the GEMM core packs two weights into one multiplier: the packed operand (two weights and the
    input's width between them) fits the wide port and the input the narrow one (int8: 24 x 8 bits)."""
    return wgt_width + inp_width + wgt_width <= dsp.wide and inp_width <= dsp.narrow


def elements(row: Value, width: int) -> list[Value]:
    """The signed elements of a row, in index order."""
    return [row.word_select(j, width).as_signed() for j in range(len(row) // width)]


def select(values: list[Value], index: Value) -> Value:
    """``values[index]`` as a balanced tree of 2:1 multiplexers on the index's bits, log2(len) deep where a
    chain of compares would be len - 1 deep (an index past the end selects an element of the last pair).
    Continuous assignments, like any :func:`Mux`: 4-state simulators evaluate them from time 0 on."""
    level, bit = list(values), 0
    while len(level) > 1:
        level = [Mux(index[bit], level[k + 1], level[k]) if k + 1 < len(level) else level[k]
                 for k in range(0, len(level), 2)]
        bit += 1
    return level[0]


def _tree_levels(values: list[Value], levels: int) -> list[Value]:
    """`levels` levels of a balanced adder tree: pairs summed, an odd one out passed on."""
    for _ in range(levels):
        values = [values[k] + values[k + 1] if k + 1 < len(values) else values[k]
                  for k in range(0, len(values), 2)]
    return values


class GemmCore(wiring.Component):
    """One BATCH x BLOCK_IN by BLOCK_IN x BLOCK_OUT product per cycle, in :data:`GEMM_LATENCY` cycles
    (the operands, the products, the adder tree's first half, its second half: each registered).

    ``sums`` holds batch*block_out signed dot products of ``sum_bits`` bits each (element b*block_out+o).
    """

    def __init__(self, *, batch: int, block_in: int, block_out: int, inp_width: int, wgt_width: int,
                 packed: bool | None = None, dsp: DspPorts = DSP48):
        self.shape = (batch, block_in, block_out)
        self.inp_width, self.wgt_width = inp_width, wgt_width
        # Two weights per multiplier where they fit it: half the DSPs, the same products to the bit.
        fits = packs_weight_pairs(inp_width, wgt_width, dsp)
        self.packed = fits if packed is None else packed and fits
        self.sum_bits = inp_width + wgt_width + max(1, (block_in - 1).bit_length())
        super().__init__({
            "inp": In(batch * block_in * inp_width),
            "wgt": In(block_out * block_in * wgt_width),
            "sums": Out(batch * block_out * self.sum_bits),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        batch, block_in, block_out = self.shape
        pw = self.inp_width + self.wgt_width  # a product's width
        step = 2 if self.packed else 1
        # The operands are registered first: a block RAM's output straight into a multiplier (with the
        # packing's decrement ahead of it) was the design's longest path.
        x = [self._registered(m, v, f"x_{k}") for k, v in enumerate(elements(self.inp, self.inp_width))]
        w = elements(self.wgt, self.wgt_width)
        operand = {}  # (o, i) -> the multiplier's weight operand for output o (and o + 1 where packed)
        for o in range(0, block_out, step):
            for i in range(block_in):
                if not self.packed or o + 1 == block_out:
                    operand[o, i] = self._registered(m, w[o * block_in + i], f"w_{o}_{i}")
                    continue
                # Two products that share x in one multiplier (one DSP48 instead of two): with
                # W = w[o] * 2^pw + w[o+1], x * W = x*w[o] * 2^pw + x*w[o+1], and x*w[o+1] fits pw signed bits,
                # so the low pw bits are it exactly and the high part is x*w[o] plus its borrow. W itself with
                # no wide adder: w[o+1] sign-extended to pw bits below w[o] less w[o+1]'s borrow (a decrement
                # of w[o]'s bits alone).
                lo, hi = w[(o + 1) * block_in + i], w[o * block_in + i]
                packed = Cat(lo, lo[-1].replicate(pw - len(lo)), hi - lo[-1]).as_signed()
                operand[o, i] = self._registered(m, packed, f"ww_{o}_{i}")
        # products[b][o][i] = x[b, i] * w[o, i], registered.
        products = [[[Signal(signed(pw), name=f"p_{b}_{o}_{i}") for i in range(block_in)] for o in range(block_out)]
                    for b in range(batch)]
        for b in range(batch):
            for (o, i), wo in operand.items():
                xi = x[b * block_in + i]
                if not self.packed or o + 1 == block_out:
                    m.d.sync += products[b][o][i].eq(xi * wo)
                    continue
                both = Signal(signed(2 * pw), name=f"pp_{b}_{o}_{i}")
                m.d.sync += both.eq(xi * wo)
                m.d.comb += products[b][o + 1][i].eq(both[:pw].as_signed())
                m.d.comb += products[b][o][i].eq((both[pw:].as_signed() + both[pw - 1])[:pw].as_signed())
        assert GEMM_LATENCY == 4  # operands, products, half the tree, the rest
        depth = (block_in - 1).bit_length()  # the tree's levels
        sums = []
        for b in range(batch):
            for o in range(block_out):
                partial = _tree_levels(products[b][o], depth // 2)
                halves = [Signal(signed(self.sum_bits), name=f"h_{b}_{o}_{k}") for k in range(len(partial))]
                m.d.sync += [h.eq(v) for h, v in zip(halves, partial, strict=True)]
                s = Signal(signed(self.sum_bits), name=f"s_{b}_{o}")
                m.d.sync += s.eq(_tree_levels(halves, depth - depth // 2)[0])
                sums.append(s)
        m.d.comb += self.sums.eq(Cat(*sums))
        return m

    @staticmethod
    def _registered(m: Module, value: Value, name: str) -> Signal:
        reg = Signal(value.shape(), name=name)
        m.d.sync += reg.eq(value)
        return reg


class AluFirst(NamedTuple):
    """What the ALU's first stage hands on: its result is the operand `b` where `takes_operand` (MIN's or
    MAX's compare chose it), else `kept` (ADD's, SHR's, MOV's result, or the destination `a` for MIN and
    MAX). The compare's carry chain ends in one bit, registered per lane; the select after it, whose fanout
    is the row, waits until the next stage (after tiny's ALU compare, the select into the row's register was
    the longest path after place and route at 89.4 MHz)."""
    kept: Value
    takes_operand: Value
    parts: list[Value]

    def result(self, b: Value) -> Value:
        return Mux(self.takes_operand, b, self.kept)[:len(self.kept)]


def alu_lane(m: Module, op: Value, a: Value, b: Value, width: int) -> Value:
    """One accumulator element through the ALU (spec SEMANTICS["alu"]): `a` the destination, `b` the
    operand, both signed `width`-bit; the result wraps at `width` bits. :func:`alu_lane_first`,
    :func:`alu_lane_mid` and :func:`alu_lane_last`, in one cycle."""
    selects = alu_selects(op)
    first = alu_lane_first(m, selects, a, b, width)
    mids = alu_lane_mid(m, selects, first.kept, first.parts, width)
    return alu_lane_last(m, selects, first.result(b), mids, width)


def alu_selects(op: Value) -> dict[str, Value]:
    """The opcode's decodes that the ALU's stages select with, in every lane: the compute pipeline registers
    them once per instruction (the opcode's decoders ahead of every lane's multiplexers were among tiny's
    longest paths, their outputs' fanout the whole row)."""
    codes = {"max": AluOp.MAX, "add": AluOp.ADD, "shr": AluOp.SHR, "mul": AluOp.MUL, "rq": AluOp.RQ,
             "mov": AluOp.MOV}
    selects = {name: op == code for name, code in codes.items()}
    # ADD, SHR and MOV: the first stage's result is one of theirs, else MIN's or MAX's
    selects["rest"] = selects["add"] | selects["shr"] | selects["mov"]
    return selects


def multiplier_top(selects: dict[str, Value], b: Value, width: int) -> Value:
    """The bits of the ALU's second multiplier operand above b's low half: RQ's multiplier's top bits, 0 for
    MUL (whose operand is the low half, unsigned). The compute pipeline registers them beside the operand, so
    that no multiplexer lies ahead of the multipliers (a multiplier's own delay is most of a cycle on ECP5)."""
    mul_bits, _ = rq_layout(width)
    return Mux(selects["rq"], b[width // 2:mul_bits], 0)


def alu_multiplicands(a: Value, b: Value, top: Value, width: int) -> list[tuple[Value, Value]]:
    """The operands of the ALU's three products (:func:`alu_lane_first`), from the destination `a`, the
    operand `b` and :func:`multiplier_top` of `b`: al * m, ah * m and al * bh."""
    h = width // 2
    al, ah, bh = a.as_unsigned()[:h], a.as_signed()[h:].as_signed(), b.as_unsigned()[h:]
    second = Cat(b.as_unsigned()[:h], top).as_signed()
    return [(al, second), (ah, second), (al, bh)]


def alu_lane_first(m: Module, selects: dict[str, Value], a: Value, b: Value, width: int, *,
                   top: Value | None = None, products: list[Value] | None = None) -> AluFirst:
    """The ALU's first pipeline stage: the result of every op but MUL, RQ and SHR, as :class:`AluFirst` says,
    and the parts the later stages take.

    MUL keeps the low `width` bits of a * b, and those depend only on the halves' products: with
    a = ah * 2^h + al and b = bh * 2^h + bl (al, bl: the low h bits, unsigned), a * b = al * bl +
    (al * bh + ah * bl) * 2^h modulo 2^width. RQ needs all of a * m (m: b's low h + 2 bits, signed) =
    ah * m * 2^h + al * m, so its two products share MUL's first two multipliers (their second operand is
    m for RQ, bl for MUL; MUL keeps only the low h bits of ah * bl, which do not depend on signedness). Each
    is one DSP48 (17 x 18 bits). Both are sums of three terms: the two products (the second 2^h up) and
    the third product 2^h up (MUL) or RQ's rounding constant (RQ). Each is reduced here to two words (their
    sum bit by bit and their carries), which are the first two parts: the next stage adds them with one
    carry chain. The last three parts are the right shift's amount (RQ's or SHR's: both shift through one
    shifter, in the later stages), RQ's ReLU flag and whether SHR shifts left, registered beside them.
    `top`: :func:`multiplier_top` of `b`, where registered apart; `products`: the three products of
    :func:`alu_multiplicands`, where worked out apart."""
    h = width // 2
    mul_bits, shift_bits = rq_layout(width)
    if products is None:
        pairs = alu_multiplicands(a, b, multiplier_top(selects, b, width) if top is None else top, width)
        products = [x * y for x, y in pairs]
    bits = width.bit_length()  # log2(width) + 1: SHR's amount is the operand's low bits, signed
    assert bits <= shift_bits
    # SHR by amount n (its operand's low bits, signed): a >> n for n >= 0; for n < 0, a << -n is a placed
    # width bits up and shifted right by width + n, which is n's low bits (unsigned): the same amount bits
    # either way, and one shifter for both directions (a barrel shifter of its own, for the left shifts, lay
    # on tiny's longest paths after place and route, in this stage).
    left = selects["shr"] & b[bits - 1]
    shift = Mux(selects["shr"], b[:bits - 1], b[mul_bits:mul_bits + shift_bits])
    # RQ's rounding constant 2^(s-1) (0 for s = 0), decoded here from its amount so that the second stage's
    # sum does not wait on the decoder: |a * m| <= 2^(width + mul_bits - 2), so with s < width + mul_bits the
    # constant and the sum fit width + mul_bits + 1 signed bits; from s = width + mul_bits on, the result is 0.
    rq_amount = b[mul_bits:mul_bits + shift_bits]
    total = width + mul_bits + 1  # RQ's sum's bits; MUL's is its low `width`
    rounding = Cat(*[rq_amount == k + 1 for k in range(total)])
    third = Mux(selects["rq"], rounding, _extended(products[2][:width - h] << h, total))
    sums, carries = _three_to_two(products[0].as_signed(), products[1].as_signed() << h, third, total)
    parts = [sums, carries, shift, b[mul_bits + shift_bits], left]
    kept, takes_operand = _alu_lane_but_mul(selects, a, b, width)
    return AluFirst(kept, takes_operand, parts)


#: The right shift's stages (one per bit of the amount) that alu_lane_mid takes, the longest first; the rest
#: are alu_lane_last's (two: with three, Y's sum and its stages failed 100 MHz after nextpnr at 66d9af1; Z's
#: result feeds registers only).
_COARSE_SHIFTS = 2


def alu_lane_mid(m: Module, selects: dict[str, Value], other: Value, parts: list[Value], width: int
                 ) -> list[Value]:
    """The ALU's second stage, from the parts of :func:`alu_lane_first`: MUL's product, RQ's exact product
    plus its rounding constant, and the right shift's longest steps (of RQ's sum, or of SHR's operand: `other`,
    the first stage's kept result, which is a itself for SHR, placed width bits up where SHR shifts left). RQ
    and SHR shift right through one shifter, as Yosys' resource sharing paired them. Returns the parts
    :func:`alu_lane_last` takes."""
    mul_bits, _ = rq_layout(width)
    sums, carries, amount, relu, left = parts
    total = (sums + carries)[:len(sums)]  # RQ's sum; MUL's product is its low `width` bits
    product = total[:width]
    a = other[:width]
    shr = Mux(left, Cat(Const(0, width), a), a.as_signed()).as_signed()  # 2 * width bits
    value = Mux(selects["rq"], total.as_signed(), shr)
    fine = len(amount) - _COARSE_SHIFTS
    # the last stage's result bits come from the width + 2^fine - 1 lowest: the rest need no register
    partial = shift_right(m, value, amount[fine:], first=fine)[:width + (1 << fine) - 1]
    return [partial, product, amount[:fine], amount >= width + mul_bits, relu]


def _three_to_two(x: Value, y: Value, z: Value, bits: int) -> tuple[Value, Value]:
    """Two words whose sum is (x + y + z) mod 2^bits: the three's sum and carries bit by bit (a carry-save
    step, one LUT per bit). Worked out in the multipliers' stage, so the next stage's sum is one carry
    chain: as two carry chains in series (RQ's product's halves and its rounding constant), then the
    shifter's stages, it was one of tiny's longest paths after nextpnr at 2f70b8f; with the carry-save step
    there, at de4d77b (seed 4) and 9ba5a63 (default seed); MUL's product was two sums in series beside it."""
    x, y, z = (_extended(v, bits) for v in (x, y, z))
    return x ^ y ^ z, Cat(Const(0, 1), (x & y) | (x & z) | (y & z))[:bits]


def _extended(v: Value, bits: int) -> Value:
    """`v` sign- or zero-extended (as its shape says) or truncated to `bits` bits, unsigned."""
    if len(v) >= bits:
        return v.as_unsigned()[:bits]
    fill = v[-1] if v.shape().signed else Const(0, 1)
    return Cat(v.as_unsigned(), fill.replicate(bits - len(v)))


def alu_lane_last(m: Module, selects: dict[str, Value], other: Value, parts: list[Value], width: int) -> Value:
    """The ALU's last stage: MUL's, RQ's and SHR's results from the parts of :func:`alu_lane_mid`, or the
    other op's result."""
    partial, product, fine, zero, relu = parts
    shifted = shift_right(m, partial, fine)[:width]
    requantized = Mux(zero | (relu & shifted[width - 1]), 0, shifted)
    return Mux(selects["mul"], product, Mux(selects["rq"], requantized, Mux(selects["shr"], shifted, other)))


def shift_right(m: Module, value: Value, amount: Value, *, first: int = 0) -> Value:
    """`value` shifted right by `amount` << `first` (unsigned; arithmetic where `value` is signed): a
    multiplexer stage per bit of `amount`, the longest shift first, each a signal of `m` (an expression would
    repeat the one before twice). Written out rather than as ``>>``: Yosys' resource sharing pairs every
    shift cell with every other, a SAT problem each, which took minutes on a 64-lane ALU whose lanes never
    share."""
    for k in reversed(range(len(amount))):
        value = _stage(m, Mux(amount[k], value >> (1 << (first + k)), value), value.shape())
    return value


def _stage(m: Module, value: Value, shape: object) -> Signal:
    stage = Signal(shape)
    m.d.comb += stage.eq(value)
    return stage


def _alu_lane_but_mul(selects: dict[str, Value], a: Value, b: Value, width: int) -> tuple[Value, Value]:
    # SHR: a itself, which the later stages shift (alu_lane_first). MIN and MAX share one compare: MIN takes a
    # where a < b, MAX takes b there (and a where they are equal).
    rest = Mux(selects["add"], (a + b)[:width], Mux(selects["shr"], a[:width], b[:width]))
    # Every other code (MUL's and RQ's, which alu_lane_last replaces, and the unused one) gives MIN's result.
    return Mux(selects["rest"], rest, a[:width]), ~selects["rest"] & ~((a < b) ^ selects["max"])


class AluRow(wiring.Component):
    """Combinational ALU over a whole accumulator row (for tests and the compute pipeline)."""

    def __init__(self, *, lanes: int, width: int):
        self.lanes, self.width = lanes, width
        super().__init__({
            "op": In(3), "use_imm": In(1), "imm": In(signed(IMM_BITS)),
            "dst": In(lanes * width), "src": In(lanes * width), "result": Out(lanes * width),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        a = elements(self.dst, self.width)
        b = elements(self.src, self.width)
        imm = self.imm.as_signed()
        lanes = [alu_lane(m, self.op, a[j], Mux(self.use_imm, imm, b[j]), self.width) for j in range(self.lanes)]
        m.d.comb += self.result.eq(Cat(*lanes))
        return m


def saturate_row(row: Value, acc_width: int, out_width: int) -> Value:
    """Accumulator row to output row: each element clipped to the signed out_width range."""
    lo, hi = -(1 << (out_width - 1)), (1 << (out_width - 1)) - 1
    out = []
    # An element fits when its bits from out_width - 1 up are all its sign: the clip is worked out from those
    # bits' AND and OR, not from two magnitude compares (carry chains the width of the accumulator, ahead of
    # the out write's register on tiny's paths after nextpnr).
    for v in elements(row, acc_width):
        sign, upper = v[-1], v[out_width - 1:-1]
        mask = (1 << out_width) - 1  # (the bounds as out_width-bit patterns: a Cat of unsigned elements)
        clipped = Mux(~sign & upper.any(), Const(hi & mask, out_width),
                      Mux(sign & ~upper.all(), Const(lo & mask, out_width), v[:out_width]))
        out.append(clipped)
    return Cat(*out)


def sign_extend_row(row: Value, from_width: int, to_width: int) -> Value:
    """Widen every element of a row, keeping its sign (ACC_NARROW loads)."""
    return Cat(*[Cat(v, v[-1].replicate(to_width - from_width)) for v in elements(row, from_width)])
