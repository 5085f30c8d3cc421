"""Text assembler and disassembler: one instruction a line, every field and flag readable.

Syntax (``#`` or ``;`` starts a comment)::

    LOAD inp sram=0 dram=16 y=2 x=4 stride=8 pad=1,1,0,0 deps=pop_next,push_next
    STORE out sram=0 dram=0 y=2 x=4 stride=4 deps=pop_prev
    GEMM uop=0:4 iter=2x3 dst=4,1 src=8,1 wgt=0,0 reset deps=pop_prev,push_next
    ALU max uop=0:4 iter=2x3 dst=4,1 src=8,1 imm=-3
    FINISH

``pad`` is top,bottom,left,right; factor pairs are outer,inner; ``uop`` is a half-open range; an ALU
instruction's ``inp`` flag takes its operand from inp[src] instead of acc[src]; ``beside`` lets a GEMM or ALU
instruction start while the other compute pipe's runs.
``disassemble(assemble(text))`` gives the canonical text back, and ``assemble(disassemble(p)) == p``.
"""

from __future__ import annotations

import numpy as np

from weft.errors import WeftError
from weft.isa.constants import AluOp, MemId, Opcode
from weft.isa.encoding import make_insns
from weft.isa.program import DEP_FLAGS

__all__ = ["AsmError", "AsmFileError", "assemble", "check_words", "disassemble", "format_insn", "read_source"]


class AsmFileError(WeftError):
    """An input file that is not assembly text or not whole instruction words; names the file."""


def read_source(data: bytes, name: str) -> str:
    """Assembly text from the bytes of file `name`."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise AsmFileError(f"{name}: byte 0x{data[err.start]:02x} at offset {err.start} is not UTF-8 text; "
                           "is it a binary (disassemble it with -d)?") from None


def check_words(data: bytes, name: str, insn_bytes: int) -> bytes:
    """The bytes of file `name` if they are whole `insn_bytes`-byte instructions."""
    if len(data) % insn_bytes:
        raise AsmFileError(f"{name}: {len(data)} bytes is not a whole number of {insn_bytes}-byte instructions "
                           f"({len(data) % insn_bytes} bytes left over)")
    return data


class AsmError(WeftError, ValueError):
    """A line that does not assemble; names the line number."""

    def __init__(self, line: int, message: str):
        self.line = line
        super().__init__(f"line {line}: {message}")


def _deps_text(rec: np.void) -> str:
    flags = [name for name in DEP_FLAGS if int(rec[name])]
    return f" deps={','.join(flags)}" if flags else ""


def format_insn(rec: np.void) -> str:
    """One instruction as assembly text."""
    op = int(rec["opcode"])
    loop = (
        f"uop={rec['uop_bgn']}:{rec['uop_end']} iter={rec['iter_out']}x{rec['iter_in']} "
        f"dst={rec['dst_factor_out']},{rec['dst_factor_in']} src={rec['src_factor_out']},{rec['src_factor_in']}"
    )
    if op in (Opcode.LOAD, Opcode.STORE):
        try:
            mem = MemId(int(rec["mem_id"])).name.lower()
        except ValueError:
            mem = f"mem{int(rec['mem_id'])}"
        text = (
            f"{Opcode(op).name} {mem} sram={rec['sram_base']} dram={rec['dram_base']} y={rec['y_size']} "
            f"x={rec['x_size']} stride={rec['x_stride']}"
        )
        pads = (rec["y_pad_0"], rec["y_pad_1"], rec["x_pad_0"], rec["x_pad_1"])
        if any(pads):
            text += " pad=" + ",".join(str(int(p)) for p in pads)
    elif op == Opcode.GEMM:
        text = f"GEMM {loop} wgt={rec['wgt_factor_out']},{rec['wgt_factor_in']}"
        if rec["reset"]:
            text += " reset"
        if rec["overwrite"]:
            text += " overwrite"
        if rec["beside"]:
            text += " beside"
    elif op == Opcode.ALU:
        try:
            alu = AluOp(int(rec["alu_op"])).name.lower()
        except ValueError:
            alu = f"op{int(rec['alu_op'])}"
        text = f"ALU {alu} {loop}"
        if rec["use_imm"]:
            text += f" imm={rec['imm']}"
        if rec["src_inp"]:
            text += " inp"
        if rec["beside"]:
            text += " beside"
    elif op == Opcode.FINISH:
        text = "FINISH"
    else:
        text = f"ILLEGAL opcode={op}"
    return text + _deps_text(rec)


def disassemble(insns: np.ndarray) -> str:
    return "\n".join(format_insn(rec) for rec in insns) + ("\n" if len(insns) else "")


def _ints(text: str, count: int, sep: str, line: int, key: str) -> list[int]:
    parts = text.split(sep)
    if len(parts) != count:
        raise AsmError(line, f"'{key}' expects {count} values separated by '{sep}', got '{text}'")
    try:
        return [int(p, 0) for p in parts]
    except ValueError:
        raise AsmError(line, f"'{key}={text}': not an integer") from None


def assemble(text: str) -> np.ndarray:
    """Assemble text into an INSN_DTYPE array (field ranges are checked by the encoder)."""
    rows: list[dict[str, int]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].split(";", 1)[0].strip()
        if not line:
            continue
        tokens = line.split()
        mnemonic = tokens[0].upper()
        if mnemonic not in Opcode.__members__:
            raise AsmError(lineno, f"unknown instruction '{tokens[0]}' (expected {', '.join(Opcode.__members__)})")
        op = Opcode[mnemonic]
        row: dict[str, int] = {"opcode": int(op)}
        args = tokens[1:]
        if op in (Opcode.LOAD, Opcode.STORE, Opcode.ALU):
            if not args or "=" in args[0]:
                what = "memory (inp, wgt, uop, acc, acc_narrow, out)" if op != Opcode.ALU else "ALU op"
                raise AsmError(lineno, f"{mnemonic} needs a {what} first")
            name = args.pop(0).upper()
            table = MemId if op != Opcode.ALU else AluOp
            if name not in table.__members__:
                raise AsmError(lineno, f"unknown {table.__name__} '{name.lower()}' "
                                       f"(expected {', '.join(m.lower() for m in table.__members__)})")
            row["mem_id" if op != Opcode.ALU else "alu_op"] = int(table[name])
        allowed = {
            Opcode.LOAD: {"sram", "dram", "y", "x", "stride", "pad", "deps"},
            Opcode.STORE: {"sram", "dram", "y", "x", "stride", "pad", "deps"},
            Opcode.GEMM: {"uop", "iter", "dst", "src", "wgt", "reset", "overwrite", "beside", "deps"},
            Opcode.ALU: {"uop", "iter", "dst", "src", "imm", "inp", "beside", "deps"},
            Opcode.FINISH: {"deps"},
        }[op]
        for arg in args:
            key, _, value = arg.partition("=")
            if key not in allowed:
                raise AsmError(lineno, f"{mnemonic} takes no '{key}' (allowed: {', '.join(sorted(allowed))})")
            if key in ("reset", "overwrite", "beside"):
                row[key] = 1
            elif key == "inp":
                row["src_inp"] = 1
            elif key == "deps":
                for flag in filter(None, value.split(",")):
                    if flag not in DEP_FLAGS:
                        raise AsmError(lineno, f"unknown dependency flag '{flag}' (expected {', '.join(DEP_FLAGS)})")
                    row[flag] = 1
            elif key in ("sram", "dram", "y", "x", "stride", "imm"):
                field = {"sram": "sram_base", "dram": "dram_base", "y": "y_size", "x": "x_size",
                         "stride": "x_stride", "imm": "imm"}[key]
                row[field] = _ints(value, 1, ",", lineno, key)[0]
                if key == "imm":
                    row["use_imm"] = 1
            elif key == "pad":
                row["y_pad_0"], row["y_pad_1"], row["x_pad_0"], row["x_pad_1"] = _ints(value, 4, ",", lineno, key)
            elif key == "uop":
                row["uop_bgn"], row["uop_end"] = _ints(value, 2, ":", lineno, key)
            elif key == "iter":
                row["iter_out"], row["iter_in"] = _ints(value, 2, "x", lineno, key)
            else:  # dst / src / wgt factor pairs
                row[f"{key}_factor_out"], row[f"{key}_factor_in"] = _ints(value, 2, ",", lineno, key)
        if op in (Opcode.LOAD, Opcode.STORE) and "x_stride" not in row:
            row["x_stride"] = row.get("x_size", 0)  # contiguous rows unless told otherwise
        rows.append(row)
    out = make_insns(len(rows))
    for i, row in enumerate(rows):
        for name, value in row.items():
            out[i][name] = value
    return out
