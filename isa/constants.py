"""Architectural constants of the weft ISA: opcodes, memory ids, ALU ops and fixed field widths.

Only what no config can change lives here; every width that follows from a buffer depth is derived in
:mod:`weft.isa.layout`.
"""

from __future__ import annotations

from enum import IntEnum

#: Instruction word width in bits: an architectural constant of the ISA (as in VTA). A config is rejected
#: when a field derived from it no longer fits in this word.
INSN_BITS = 128


__all__ = [
    "ALU_OP_BITS",
    "AXI_ADDR_BITS",
    "AXI_BOUNDARY_BYTES",
    "DRAM_ADDR_BITS",
    "DRAM_STRIDE_BITS",
    "IMM_BITS",
    "INSN_BITS",
    "INSN_BYTES",
    "MEM_ID_BITS",
    "OPCODE_BITS",
    "PAD_BITS",
    "AluOp",
    "MemId",
    "Opcode",
    "Unit",
]

OPCODE_BITS = 3
MEM_ID_BITS = 3
ALU_OP_BITS = 3
#: Zero padding per side of a 2-D DMA, in elements (VTA: 4 bits, so at most 15).
PAD_BITS = 4
#: DRAM byte address width on the AXI bus (the Zynq HP ports are 32-bit): the hardware's master ports, the
#: driver's address checks and the artifact's DRAM bound all follow it.
AXI_ADDR_BITS = 32
#: An AXI burst never crosses a boundary of this many bytes (AXI4, A3.4.1): the DMA's bursts, the timing
#: model's burst split and the testbench DRAM's protocol check all follow it.
AXI_BOUNDARY_BYTES = 4096
#: Every DRAM region of an artifact (a value's buffer, a program, constants) starts on a multiple of this
#: many bytes: the functional simulator tracks DRAM races by lines of this size.
DRAM_ALIGN_BYTES = 64
#: DRAM addresses in instructions count elements of the memory's row size, up to this many bits.
DRAM_ADDR_BITS = 32
#: Row stride of a 2-D DMA, in DRAM elements.
DRAM_STRIDE_BITS = 16
#: Signed ALU immediate.
IMM_BITS = 16
#: Bytes of one instruction in DRAM (the fetch unit's stride, the driver's and simulators' stream size).
INSN_BYTES = INSN_BITS // 8


class Opcode(IntEnum):
    LOAD = 0
    STORE = 1
    GEMM = 2
    FINISH = 3
    ALU = 4


class MemId(IntEnum):
    """Memory a LOAD or STORE moves data to or from."""

    UOP = 0
    WGT = 1
    INP = 2
    ACC = 3
    OUT = 4
    #: out_width-bit integers from DRAM, sign-extended into the accumulator (residual adds, pooling).
    ACC_NARROW = 5


class AluOp(IntEnum):
    MIN = 0
    MAX = 1
    ADD = 2
    #: Arithmetic shift right by the operand; a negative operand shifts left.
    SHR = 3
    MUL = 4
    #: Requantize: the operand packs a signed multiplier, a rounding right shift and a ReLU flag
    #: (:func:`weft.isa.arith.rq_fields`); acc = relu?((acc * m + 2**(s-1)) >> s), the product exact.
    RQ = 5
    #: acc = operand: a tile's accumulators start from its bias (one pass, where a reset and an ADD take two).
    MOV = 6


class Unit(IntEnum):
    """The three decoupled units, in pipeline order (VTA's stage ids minus one)."""

    LOAD = 0
    COMPUTE = 1
    STORE = 2
