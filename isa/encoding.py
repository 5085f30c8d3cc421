"""Encode and decode instructions and micro-ops, vectorized with numpy.

A program in memory is a numpy structured array with one int64 column per field name any format uses
(:data:`INSN_DTYPE`); fields a format does not have are zero. The binary form is little-endian
`insn_bits`-wide words, as the fetch unit reads them from DRAM. Round trips are exact.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from weft.errors import WeftError
from weft.isa.constants import INSN_BYTES, Opcode
from weft.isa.layout import FORMAT_OF_OPCODE, INSN_FIELD_NAMES, Format, IsaLayout

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = [
    "INSN_DTYPE",
    "UOP_DTYPE",
    "EncodeError",
    "decode_insns",
    "decode_uops",
    "encode_insns",
    "encode_uops",
    "layout_of",
    "make_insns",
    "make_uops",
]

INSN_DTYPE = np.dtype([(name, np.int64) for name in INSN_FIELD_NAMES])
UOP_DTYPE = np.dtype([("dst", np.int64), ("src", np.int64), ("wgt", np.int64)])


class EncodeError(WeftError, ValueError):
    """A field value that does not fit its format; names the instruction index and the field."""

    def __init__(self, index: int, field: str, message: str):
        self.index = index
        self.field = field
        super().__init__(f"instruction {index}: field '{field}': {message}")


@lru_cache(maxsize=64)
def layout_of(config: AcceleratorConfig) -> IsaLayout:
    """The (cached) ISA layout of a config."""
    return IsaLayout(config)


def make_insns(count: int) -> np.ndarray:
    """A zeroed program of `count` instructions."""
    return np.zeros(count, dtype=INSN_DTYPE)


def make_uops(count: int) -> np.ndarray:
    return np.zeros(count, dtype=UOP_DTYPE)


def _words(bits: int) -> int:
    return (bits + 63) // 64


def _pack_fields(fmt: Format, columns: dict[str, np.ndarray], count: int, first_index: np.ndarray) -> np.ndarray:
    """Pack field columns into (count, words) uint64, checking every value fits."""
    out = np.zeros((count, _words(fmt.bits)), dtype=np.uint64)
    for f in fmt.fields:
        values = columns[f.name]
        bad = (values < f.min) | (values > f.max)
        if bad.any():
            k = int(np.argmax(bad))
            raise EncodeError(
                int(first_index[k]), f.name,
                f"value {int(values[k])} does not fit {f.width} {'signed ' if f.signed else ''}bits "
                f"(range {f.min}..{f.max}) in the {fmt.name.upper()} format",
            )
        raw = (values.astype(np.int64) & ((1 << f.width) - 1)).astype(np.uint64)
        word, shift = divmod(f.lsb, 64)
        out[:, word] |= raw << np.uint64(shift)
        spill = shift + f.width - 64
        if spill > 0:  # the field crosses into the next 64-bit word
            out[:, word + 1] |= raw >> np.uint64(64 - shift)
    return out


def _unpack_fields(fmt: Format, words: np.ndarray) -> dict[str, np.ndarray]:
    columns = {}
    for f in fmt.fields:
        word, shift = divmod(f.lsb, 64)
        raw = words[:, word] >> np.uint64(shift)
        if shift + f.width > 64:
            raw = raw | (words[:, word + 1] << np.uint64(64 - shift))
        mask = np.uint64((1 << f.width) - 1) if f.width < 64 else np.uint64(0xFFFFFFFFFFFFFFFF)
        value = (raw & mask).astype(np.int64)
        if f.signed:
            value = np.where(value >= (1 << (f.width - 1)), value - (1 << f.width), value)
        columns[f.name] = value
    return columns


def encode_insns(config: AcceleratorConfig, insns: np.ndarray) -> bytes:
    """Encode a program (INSN_DTYPE array) into little-endian instruction words.

    Raises EncodeError for an unknown opcode, a value that does not fit its field, or a field set that
    the instruction's format does not have.
    """
    layout = layout_of(config)
    insns = np.asarray(insns, dtype=INSN_DTYPE)
    count = len(insns)
    nwords = _words(layout.insn_bits)
    out = np.zeros((count, nwords), dtype=np.uint64)
    opcodes = insns["opcode"]
    known = np.isin(opcodes, [int(op) for op in Opcode])
    if not known.all():
        k = int(np.argmax(~known))
        raise EncodeError(k, "opcode", f"unknown opcode {int(opcodes[k])}")
    indices = np.arange(count)
    for fmt_name in sorted(set(FORMAT_OF_OPCODE.values())):
        ops = [int(op) for op, name in FORMAT_OF_OPCODE.items() if name == fmt_name]
        select = np.isin(opcodes, ops)
        if not select.any():
            continue
        fmt = layout.formats[fmt_name]
        sub = insns[select]
        for name in INSN_FIELD_NAMES:
            if name not in fmt.field_names and sub[name].any():
                k = int(np.argmax(sub[name] != 0))
                raise EncodeError(
                    int(indices[select][k]), name,
                    f"{Opcode(int(sub['opcode'][k])).name} instructions have no '{name}' field",
                )
        columns = {f.name: sub[f.name] for f in fmt.fields}
        out[select] = _pack_fields(fmt, columns, len(sub), indices[select])
    return out.astype("<u8").tobytes()


def decode_insns(config: AcceleratorConfig, data: bytes | np.ndarray) -> np.ndarray:
    """Decode instruction words back into an INSN_DTYPE array.

    An unknown opcode decodes its header only (the simulators report it as illegal when they reach it).
    """
    layout = layout_of(config)
    nbytes = INSN_BYTES
    data = bytes(data) if not isinstance(data, np.ndarray) else data.tobytes()
    if len(data) % nbytes:  # before numpy reads 8-byte words, whose message would name no instruction size
        raise ValueError(f"instruction stream of {len(data)} bytes is not a multiple of the {nbytes}-byte "
                         "instruction")
    raw = np.frombuffer(data, dtype="<u8")
    words = raw.reshape(-1, _words(layout.insn_bits)).astype(np.uint64)
    result = make_insns(len(words))
    header = _unpack_fields(layout.formats["finish"], words)
    for name, column in header.items():
        result[name] = column
    for fmt_name in sorted(set(FORMAT_OF_OPCODE.values())):
        ops = [int(op) for op, name in FORMAT_OF_OPCODE.items() if name == fmt_name]
        select = np.isin(result["opcode"], ops)
        if not select.any():
            continue
        columns = _unpack_fields(layout.formats[fmt_name], words[select])
        for name, column in columns.items():
            result[name][select] = column
    return result


def encode_uops(config: AcceleratorConfig, uops: np.ndarray) -> bytes:
    """Encode micro-ops (UOP_DTYPE array) into little-endian words of `config.uop_bits`."""
    layout = layout_of(config)
    uops = np.asarray(uops, dtype=UOP_DTYPE)
    columns = {name: uops[name] for name in ("dst", "src", "wgt")}
    try:
        packed = _pack_fields(layout.uop, columns, len(uops), np.arange(len(uops)))
    except EncodeError as err:
        raise EncodeError(err.index, err.field, str(err).split(": ", 2)[-1].replace("instruction", "uop")) \
            from None
    if layout.uop.bits == 32:
        return packed[:, 0].astype("<u4").tobytes()
    return packed[:, 0].astype("<u8").tobytes()


def decode_uops(config: AcceleratorConfig, data: bytes | np.ndarray) -> np.ndarray:
    layout = layout_of(config)
    dtype = "<u4" if layout.uop.bits == 32 else "<u8"
    raw = np.frombuffer(bytes(data) if not isinstance(data, np.ndarray) else data.tobytes(), dtype=dtype)
    columns = _unpack_fields(layout.uop, raw.astype(np.uint64).reshape(-1, 1))
    result = make_uops(len(raw))
    for name, column in columns.items():
        result[name] = column
    return result
