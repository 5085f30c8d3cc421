"""Instruction and micro-op bit layouts, derived from the config.

Each format is an ordered list of fields packed contiguously from bit 0. The RTL decodes these layouts
(as Amaranth ``StructLayout``), the compiler and runtime encode them (vectorized, see
:mod:`weft.isa.encoding`), and the spec JSON, C header and Markdown table are generated from them: no
width is written down twice.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from weft.errors import ConfigError
from weft.isa.constants import (
    ALU_OP_BITS,
    DRAM_ADDR_BITS,
    DRAM_STRIDE_BITS,
    IMM_BITS,
    INSN_BITS,
    MEM_ID_BITS,
    OPCODE_BITS,
    PAD_BITS,
    AluOp,
    MemId,
    Opcode,
)

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["FORMAT_OF_OPCODE", "INSN_FIELD_NAMES", "Field", "Format", "IsaLayout"]


@dataclass(frozen=True)
class Field:
    name: str
    width: int
    lsb: int
    signed: bool = False
    doc: str = ""

    @property
    def msb(self) -> int:
        return self.lsb + self.width - 1

    @property
    def min(self) -> int:
        return -(1 << (self.width - 1)) if self.signed else 0

    @property
    def max(self) -> int:
        return (1 << (self.width - 1)) - 1 if self.signed else (1 << self.width) - 1


@dataclass(frozen=True)
class Format:
    """A named bit layout: fields packed from bit 0 upwards, within `bits`."""

    name: str
    fields: tuple[Field, ...]
    bits: int

    @property
    def used_bits(self) -> int:
        return self.fields[-1].lsb + self.fields[-1].width if self.fields else 0

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"format '{self.name}' has no field '{name}'")

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def has(self, name: str) -> bool:
        """Whether the format has field `name` (an optional one, like ``beside``, may be left out)."""
        return name in self.field_names

    def as_struct_layout(self) -> Any:
        """The Amaranth ``data.StructLayout`` of this format (imports amaranth: hardware side only)."""
        from amaranth.lib import data

        members: dict[str, Any] = {}
        for f in self.fields:
            members[f.name] = data.signed(f.width) if f.signed else data.unsigned(f.width)
        pad = self.bits - self.used_bits
        if pad:
            members["_reserved"] = data.unsigned(pad)
        return data.StructLayout(members)


def _pack(name: str, bits: int, spec: list[tuple[str, int, bool, str]]) -> Format:
    fields, lsb = [], 0
    for field_name, width, signed, doc in spec:
        fields.append(Field(field_name, width, lsb, signed, doc))
        lsb += width
    return Format(name, tuple(fields), bits)


def _with_beside(spec: list[tuple[str, int, bool, str]]) -> list[tuple[str, int, bool, str]]:
    """A GEMM or ALU format with its last bit ``beside`` (spec "beside") where the word has room for it: a
    config whose fields fill the word keeps its other fields and runs its compute instructions one at a
    time (its compiler never asks for beside)."""
    if sum(width for _, width, _, _ in spec) >= INSN_BITS:
        return spec
    return [*spec, ("beside", 1, False, "may start while the other compute pipe's instruction runs (spec beside)")]


def _enum_doc(enum: type[IntEnum]) -> str:
    """The values of a field's enum, e.g. "LOAD=0 STORE=1 ...", as the spec documents them."""
    return " ".join(f"{m.name}={int(m)}" for m in enum)


_HEADER = [
    ("opcode", OPCODE_BITS, False, _enum_doc(Opcode)),
    ("pop_prev", 1, False, "wait for a token from the previous unit before starting"),
    ("pop_next", 1, False, "wait for a token from the next unit before starting"),
    ("push_prev", 1, False, "send a token to the previous unit when done"),
    ("push_next", 1, False, "send a token to the next unit when done"),
]

#: Which format each opcode uses.
FORMAT_OF_OPCODE = {
    Opcode.LOAD: "mem", Opcode.STORE: "mem", Opcode.GEMM: "gemm", Opcode.ALU: "alu",
    Opcode.FINISH: "finish",
}


class IsaLayout:
    """Every bit layout of the ISA for one config."""

    def __init__(self, config: AcceleratorConfig):
        self.config = config
        self.insn_bits = INSN_BITS
        c = config
        self.sram_bits = max(c.uop_index_bits, c.inp_index_bits, c.wgt_index_bits, c.acc_index_bits)
        # A transfer may fill a whole buffer, so sizes need one bit more than indices.
        self.size_bits = self.sram_bits + 1
        # A loop extent never needs to exceed the deepest buffer it can walk.
        self.iter_bits = max(c.inp_index_bits, c.wgt_index_bits, c.acc_index_bits) + 1
        uop_dst, uop_src, uop_wgt = c.uop_field_bits
        self.uop = _pack("uop", c.uop_bits, [
            ("dst", uop_dst, False, "accumulator row"),
            ("src", uop_src, False, "input row (GEMM) or accumulator row (ALU)"),
            ("wgt", uop_wgt, False, "weight row (GEMM only)"),
        ])
        loop = [
            ("uop_bgn", c.uop_index_bits, False, "first micro-op"),
            ("uop_end", c.uop_index_bits + 1, False, "one past the last micro-op"),
            ("iter_out", self.iter_bits, False, "outer loop extent"),
            ("iter_in", self.iter_bits, False, "inner loop extent"),
            ("dst_factor_out", c.acc_index_bits, False, "acc row step per outer iteration"),
            ("dst_factor_in", c.acc_index_bits, False, "acc row step per inner iteration"),
        ]
        self.formats: dict[str, Format] = {
            "mem": _pack("mem", INSN_BITS, [
                *_HEADER,
                ("mem_id", MEM_ID_BITS, False, _enum_doc(MemId)),
                ("sram_base", self.sram_bits, False, "first SRAM row"),
                ("dram_base", DRAM_ADDR_BITS, False, "DRAM address in elements of the memory's row size"),
                ("y_size", self.size_bits, False, "rows to move"),
                ("x_size", self.size_bits, False, "elements per row; 0 makes a sync-only no-op"),
                ("x_stride", DRAM_STRIDE_BITS, False, "DRAM elements between row starts"),
                ("y_pad_0", PAD_BITS, False, "zero rows before (loads into inp/acc only)"),
                ("y_pad_1", PAD_BITS, False, "zero rows after"),
                ("x_pad_0", PAD_BITS, False, "zero elements before each row"),
                ("x_pad_1", PAD_BITS, False, "zero elements after each row"),
            ]),
            "gemm": _pack("gemm", INSN_BITS, _with_beside([
                *_HEADER,
                ("reset", 1, False, "write zeros to the accumulator rows instead of accumulating"),
                *loop,
                ("src_factor_out", c.inp_index_bits, False, "inp row step per outer iteration"),
                ("src_factor_in", c.inp_index_bits, False, "inp row step per inner iteration"),
                ("wgt_factor_out", c.wgt_index_bits, False, "wgt row step per outer iteration"),
                ("wgt_factor_in", c.wgt_index_bits, False, "wgt row step per inner iteration"),
                # last, so the fields before it keep their bits (streams without it read overwrite = 0)
                ("overwrite", 1, False, "write the products instead of adding them to the accumulator rows"),
            ])),
            "alu": _pack("alu", INSN_BITS, _with_beside([
                *_HEADER,
                *loop,
                ("src_factor_out", c.acc_index_bits, False, "acc source row step per outer iteration"),
                ("src_factor_in", c.acc_index_bits, False, "acc source row step per inner iteration"),
                ("alu_op", ALU_OP_BITS, False, _enum_doc(AluOp)),
                ("use_imm", 1, False, "take the immediate instead of acc[src]"),
                ("imm", IMM_BITS, True, "signed immediate"),
                # last, so the fields before it keep their bits (streams without it read src_inp = 0)
                ("src_inp", 1, False, "take the operand from inp[src], sign-extended, instead of acc[src]"),
            ])),
            "finish": _pack("finish", INSN_BITS, list(_HEADER)),
        }

    @staticmethod
    def check_fits(config: AcceleratorConfig) -> None:
        """Raise ConfigError when a derived field no longer fits the instruction or micro-op word; the
        message names the fields and, for each buffer, the largest size that would fit."""
        problem = IsaLayout._overflow(config)
        if problem is None:
            return
        if _SUGGESTING.get():  # a trial point of the search below: the caller only needs to know it fails
            raise ConfigError("buffer sizes", problem)
        token = _SUGGESTING.set(True)
        try:
            fits = [f"{name}={size}" for name, size in IsaLayout._fitting_sizes(config)]
        finally:
            _SUGGESTING.reset(token)
        hint = (f"sizes that fit, changing one buffer: {', '.join(fits)}" if fits
                else "no single buffer change fits: shrink several, or narrow block_in / block_out")
        raise ConfigError("buffer sizes", f"{problem}; {hint}")

    @staticmethod
    def _overflow(config: AcceleratorConfig) -> str | None:
        """What does not fit, naming the fields and the buffers their widths come from; None when all fit."""
        layout = IsaLayout(config)
        for fmt in layout.formats.values():
            if fmt.used_bits > fmt.bits:
                widest = sorted(fmt.fields, key=lambda f: -f.width)[:3]
                return (f"the {fmt.name.upper()} instruction needs {fmt.used_bits} bits but the instruction word "
                        f"has {fmt.bits} (widest fields: {', '.join(f'{f.name} {f.width}' for f in widest)} bits; "
                        f"buffers: {_buffer_sizes(config)})")
        if layout.uop.used_bits > layout.uop.bits:
            return (f"a micro-op needs {layout.uop.used_bits} bits, more than {layout.uop.bits} "
                    f"(buffers: {_buffer_sizes(config)})")
        return None

    @staticmethod
    def _fitting_sizes(config: AcceleratorConfig) -> list[tuple[str, int]]:
        """For each buffer, the largest power-of-two size below today's that makes the config fit."""
        found = []
        for name in _BUFFERS:
            size = getattr(config, name) // 2
            while size >= 1:
                try:
                    config.replace(**{name: size}, out_buff_bytes=None)
                except ConfigError as err:
                    if err.field != "buffer sizes":
                        break  # smaller than one row, or another rule: this buffer cannot help
                    size //= 2
                    continue
                found.append((name, size))
                break
        return found


#: The buffers whose depths set field widths, and the flag that keeps a fit search from recursing.
_BUFFERS = ("uop_buff_bytes", "inp_buff_bytes", "wgt_buff_bytes", "acc_buff_bytes")
_SUGGESTING: ContextVar[bool] = ContextVar("weft_isa_fit_search", default=False)


def _buffer_sizes(config: AcceleratorConfig) -> str:
    return ", ".join(f"{name}={getattr(config, name)}" for name in _BUFFERS)


#: Every field name any instruction format uses, in a stable order (the columns of a decoded program).
INSN_FIELD_NAMES: tuple[str, ...] = (
    "opcode", "pop_prev", "pop_next", "push_prev", "push_next",
    "mem_id", "sram_base", "dram_base", "y_size", "x_size", "x_stride",
    "y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1",
    "reset", "uop_bgn", "uop_end", "iter_out", "iter_in",
    "dst_factor_out", "dst_factor_in", "src_factor_out", "src_factor_in",
    "wgt_factor_out", "wgt_factor_in", "alu_op", "use_imm", "imm", "overwrite", "src_inp", "beside",
)
