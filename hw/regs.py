"""The accelerator's control and status registers and its error codes, defined once, as data.

This module imports without amaranth: a board driver reads offsets from here (or from the spec JSON that
`weft rtl` writes from here), and the AXI-Lite control block (:mod:`weft.hw.control`) builds its registers
by iterating :func:`register_map`. Nothing else lists an offset.

Every register is 32 bits. A field names the value it shows or drives; counters are 64 bits wide and
appear as a LO/HI register pair (both fields name the counter, ``source_lsb`` says which half). Counters
run from START until the run ends and then hold, so a driver reads a consistent snapshot after DONE.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from weft.isa.constants import AXI_ADDR_BITS

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = [
    "ACCESS_KINDS", "COUNTERS", "DATA_BITS", "ERROR_DOCS", "HW_VERSION", "ErrorCode", "RegField",
    "Register", "addr_bits", "register_map", "register_widths", "registers_spec",
]

#: (major, minor) of the hardware and its register map; a driver refuses a major it does not know.
HW_VERSION = (1, 0)
DATA_BITS = 32

#: ro: shows a hardware value; rw: a value the driver sets (read back as written); w1s: writing 1 makes a
#: one-cycle pulse, reads 0; w1c: a sticky flag the hardware sets and a write of 1 clears; const: fixed.
ACCESS_KINDS = ("ro", "rw", "w1s", "w1c", "const")


class ErrorCode(IntEnum):
    """Why a run stopped early (ERROR_CODE register); ERROR_INDEX holds the instruction index."""

    NONE = 0
    ILLEGAL_OPCODE = 1
    ILLEGAL_MEM_ID = 2
    ILLEGAL_DEP_FLAG = 3
    ILLEGAL_ALU_OP = 4
    BAD_PADDING = 5
    SRAM_RANGE = 6
    UOP_RANGE = 7
    FINISH_NOT_LAST = 8
    NO_FINISH = 9
    INSN_ADDR_MISALIGNED = 10
    LOOP_RANGE = 11
    FINISH_EARLY = 12
    DEADLOCK = 13
    BUS_ERROR = 14


ERROR_DOCS: dict[ErrorCode, str] = {
    ErrorCode.NONE: "no error",
    ErrorCode.ILLEGAL_OPCODE: "opcode is not LOAD, STORE, GEMM, FINISH or ALU",
    ErrorCode.ILLEGAL_MEM_ID: "LOAD takes uop, wgt, inp, acc, acc_narrow; STORE takes out",
    ErrorCode.ILLEGAL_DEP_FLAG: "a dependency flag the instruction's unit does not have",
    ErrorCode.ILLEGAL_ALU_OP: "ALU op is not MIN, MAX, ADD, SHR, MUL, RQ or MOV",
    ErrorCode.BAD_PADDING: "padding on a load into uop or wgt, or on a store",
    ErrorCode.SRAM_RANGE: "a LOAD or STORE reaches past the end of its SRAM",
    ErrorCode.UOP_RANGE: "empty micro-op range, or one past the end of the uop buffer",
    ErrorCode.FINISH_NOT_LAST: "FINISH is not the last instruction",
    ErrorCode.NO_FINISH: "the last instruction is not FINISH (or the count is 0)",
    ErrorCode.INSN_ADDR_MISALIGNED: "INSN_ADDR is not a multiple of the instruction size",
    ErrorCode.LOOP_RANGE: "a GEMM/ALU execution indexes a row past the end of acc, inp or wgt",
    ErrorCode.FINISH_EARLY: "FINISH ran while load or store instructions were still pending",
    ErrorCode.DEADLOCK: "no unit can proceed: every one waits for a token or for fetch",
    ErrorCode.BUS_ERROR: "DRAM answered a read or write with SLVERR or DECERR",
}

#: The 64-bit event counters, in register order: (name, what it counts).
COUNTERS: tuple[tuple[str, str], ...] = (
    ("cycles", "clock cycles from START until the run ends"),
    ("busy_load", "cycles the load unit executes an instruction"),
    ("busy_compute", "cycles the compute unit executes an instruction"),
    ("busy_store", "cycles the store unit executes an instruction"),
    ("stall_load", "cycles the load unit holds its next instruction but waits for a token (or room)"),
    ("stall_compute", "cycles the compute unit holds its next instruction but waits for a token (or room)"),
    ("stall_store", "cycles the store unit holds its next instruction but waits for a token (or room)"),
    ("stall_fetch", "cycles fetch holds a decoded instruction that its full command queue cannot take"),
    ("mac_active", "cycles the GEMM core multiplies (non-reset GEMM micro-op executions)"),
    ("alu_active", "cycles the ALU computes (ALU micro-op executions)"),
    ("insns", "instructions fetch dispatched to the units"),
    ("rd_beats", "DRAM read data beats"),
    ("wr_beats", "DRAM write data beats"),
)

_COUNTER_BASE = 0x40


@dataclass(frozen=True)
class RegField:
    """Bits [lsb, lsb+width) of a register, showing bits [source_lsb, source_lsb+width) of value `name`."""

    name: str
    lsb: int
    width: int
    access: str
    doc: str
    #: The constant of a "const" field; the reset value of a "rw" field.
    value: int = 0
    source_lsb: int = 0

    def __post_init__(self) -> None:
        if self.access not in ACCESS_KINDS:
            raise ValueError(f"register field '{self.name}': access must be one of {ACCESS_KINDS}, "
                             f"got {self.access!r}")
        if self.width < 1 or self.lsb < 0 or self.lsb + self.width > DATA_BITS:
            raise ValueError(f"register field '{self.name}': bits {self.lsb}..{self.lsb + self.width - 1} "
                             f"do not fit a {DATA_BITS}-bit register")


@dataclass(frozen=True)
class Register:
    name: str
    offset: int
    doc: str
    fields: tuple[RegField, ...]


def _counter_registers() -> list[Register]:
    regs = []
    for k, (name, doc) in enumerate(COUNTERS):
        for half, lsb in (("LO", 0), ("HI", 32)):
            regs.append(Register(
                f"{name.upper()}_{half}", _COUNTER_BASE + 8 * k + lsb // 8, f"{doc} (bits {lsb}..{lsb + 31})",
                (RegField(name, 0, 32, "ro", doc, source_lsb=lsb),),
            ))
    return regs


def register_map(config: AcceleratorConfig) -> tuple[Register, ...]:
    """Every register of the accelerator built for `config`, in offset order."""
    config_hash = int(config.hash, 16)
    regs = [
        Register("CTRL", 0x00, "control", (
            RegField("start", 0, 1, "w1s", "write 1 to start a run (ignored while busy)"),
            RegField("irq_en", 1, 1, "rw", "raise irq while STATUS.done is set"),
        )),
        Register("STATUS", 0x04, "status", (
            RegField("busy", 0, 1, "ro", "a run is in progress"),
            RegField("done", 1, 1, "w1c", "the last run ended (FINISH or error); write 1 to clear"),
            RegField("error", 2, 1, "ro", "the last run ended with an error (see ERROR_CODE)"),
        )),
        Register("ERROR_CODE", 0x08, "why the last run stopped early (ErrorCode)", (
            RegField("error_code", 0, 8, "ro", "ErrorCode of the first error; 0 when none"),
        )),
        Register("ERROR_INDEX", 0x0C, "instruction index of the error", (
            RegField("error_index", 0, 32, "ro", "index in the stream of the instruction that failed"),
        )),
        Register("INSN_ADDR", 0x10, "DRAM byte address of the instruction stream", (
            RegField("insn_addr", 0, AXI_ADDR_BITS, "rw", "byte address; a multiple of the instruction size"),
        )),
        Register("INSN_COUNT", 0x14, "number of instructions, FINISH included", (
            RegField("insn_count", 0, 32, "rw", "instructions to fetch"),
        )),
        Register("VERSION", 0x18, "hardware and register map version", (
            RegField("version_minor", 0, 16, "const", "minor version", value=HW_VERSION[1]),
            RegField("version_major", 16, 16, "const", "major version", value=HW_VERSION[0]),
        )),
        Register("CONFIG_HASH_LO", 0x1C, "config hash, low 32 bits (refuse a bitstream built for another config)", (
            RegField("config_hash_lo", 0, 32, "const", "bits 0..31 of the 64-bit config hash",
                     value=config_hash & 0xFFFFFFFF),
        )),
        Register("CONFIG_HASH_HI", 0x20, "config hash, high 32 bits", (
            RegField("config_hash_hi", 0, 32, "const", "bits 32..63 of the 64-bit config hash",
                     value=config_hash >> 32),
        )),
        *_counter_registers(),
    ]
    offsets = [r.offset for r in regs]
    if len(set(offsets)) != len(offsets) or any(o % 4 for o in offsets):
        raise AssertionError("register offsets must be distinct multiples of 4")
    return tuple(sorted(regs, key=lambda r: r.offset))


def register_widths(config: AcceleratorConfig) -> dict[str, int]:
    """Bits of the value behind each field name: the width of every hardware port that shows, drives or
    carries it (a counter is one 64-bit value seen through its LO and HI registers)."""
    widths: dict[str, int] = {}
    for reg in register_map(config):
        for f in reg.fields:
            widths[f.name] = max(widths.get(f.name, 0), f.source_lsb + f.width)
    return widths


def addr_bits(regs: tuple[Register, ...]) -> int:
    """Byte address bits of the AXI-Lite port: enough for the highest register."""
    return max(4, (max(r.offset for r in regs) + 3).bit_length())


def registers_spec(config: AcceleratorConfig) -> dict[str, Any]:
    """The register map as JSON-ready data (the ``registers`` section of the spec and the C header)."""
    regs = register_map(config)
    return {
        "bus": "AXI4-Lite",
        "data_bits": DATA_BITS,
        "addr_bits": addr_bits(regs),
        "version": {"major": HW_VERSION[0], "minor": HW_VERSION[1]},
        "registers": [
            {"name": r.name, "offset": r.offset, "doc": r.doc,
             "fields": [{"name": f.name, "lsb": f.lsb, "width": f.width, "access": f.access, "doc": f.doc,
                         **({"value": f.value} if f.access == "const" else {}),
                         **({"source_lsb": f.source_lsb} if f.source_lsb else {})}
                        for f in r.fields]}
            for r in regs
        ],
        "counters": [{"name": name, "doc": doc} for name, doc in COUNTERS],
        "error_codes": {e.name: {"code": int(e), "doc": ERROR_DOCS[e]} for e in ErrorCode},
        "irq": "level, high while CTRL.irq_en and STATUS.done",
    }
