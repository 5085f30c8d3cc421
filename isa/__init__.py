"""The weft ISA: instruction and micro-op layouts derived from the config, their encoders, the
assembler, and the generated spec. Imports with numpy alone (amaranth only for hardware layouts)."""

from weft.isa.asm import AsmError, assemble, disassemble, format_insn
from weft.isa.constants import AluOp, MemId, Opcode, Unit
from weft.isa.encoding import (
    INSN_DTYPE,
    UOP_DTYPE,
    EncodeError,
    decode_insns,
    decode_uops,
    encode_insns,
    encode_uops,
    layout_of,
    make_insns,
    make_uops,
)
from weft.isa.layout import Field, Format, IsaLayout
from weft.isa.program import DEP_FLAGS, ProgramBuilder, insn_kind, uops_from
from weft.isa.spec import c_header, intrinsic, isa_spec, markdown

__all__ = [
    "DEP_FLAGS", "INSN_DTYPE", "UOP_DTYPE", "AluOp", "AsmError", "EncodeError", "Field", "Format",
    "IsaLayout", "MemId", "Opcode", "ProgramBuilder", "Unit", "assemble", "c_header", "decode_insns",
    "decode_uops", "disassemble", "encode_insns", "encode_uops", "format_insn", "insn_kind", "intrinsic",
    "isa_spec", "layout_of", "make_insns", "make_uops", "markdown", "uops_from",
]
