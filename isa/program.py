"""Building instruction streams one instruction at a time (tests, the assembler, small programs).

The compiler emits whole columns into :func:`weft.isa.encoding.make_insns` arrays instead; both produce
the same INSN_DTYPE records.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from weft.isa.constants import AluOp, MemId, Opcode
from weft.isa.encoding import INSN_DTYPE, UOP_DTYPE

__all__ = ["DEP_FLAGS", "ProgramBuilder", "insn_kind"]

DEP_FLAGS = ("pop_prev", "pop_next", "push_prev", "push_next")


def insn_kind(record: np.void | dict) -> str:
    """A short name for an instruction: 'load_inp', 'store', 'gemm', 'alu', 'finish'..."""
    op = int(record["opcode"])
    if op == Opcode.LOAD:
        try:
            return f"load_{MemId(int(record['mem_id'])).name.lower()}"
        except ValueError:
            return "load_?"
    try:
        return Opcode(op).name.lower()
    except ValueError:
        return "illegal"


@dataclass
class ProgramBuilder:
    """Appends instructions; `.insns` gives the INSN_DTYPE array."""

    def __post_init__(self) -> None:
        self._rows: list[dict[str, int]] = []

    def __len__(self) -> int:
        return len(self._rows)

    @staticmethod
    def _deps(deps: Iterable[str]) -> dict[str, int]:
        out = {}
        for dep in deps:
            if dep not in DEP_FLAGS:
                raise ValueError(f"unknown dependency flag '{dep}' (expected one of {', '.join(DEP_FLAGS)})")
            out[dep] = 1
        return out

    def _add(self, row: dict[str, int]) -> int:
        self._rows.append(row)
        return len(self._rows) - 1

    def load(self, mem: MemId | str, sram: int, dram: int, y: int, x: int, stride: int | None = None,
             pad: tuple[int, int, int, int] = (0, 0, 0, 0), deps: Iterable[str] = ()) -> int:
        """2-D DMA into `mem`: y rows of x elements, DRAM rows `stride` apart; pad = (top, bottom, left, right)."""
        mem = MemId[mem.upper()] if isinstance(mem, str) else MemId(mem)
        return self._add(dict(
            opcode=Opcode.LOAD, mem_id=mem, sram_base=sram, dram_base=dram, y_size=y, x_size=x,
            x_stride=x if stride is None else stride, y_pad_0=pad[0], y_pad_1=pad[1], x_pad_0=pad[2],
            x_pad_1=pad[3], **self._deps(deps),
        ))

    def store(self, sram: int, dram: int, y: int, x: int, stride: int | None = None,
              deps: Iterable[str] = ()) -> int:
        return self._add(dict(
            opcode=Opcode.STORE, mem_id=MemId.OUT, sram_base=sram, dram_base=dram, y_size=y, x_size=x,
            x_stride=x if stride is None else stride, **self._deps(deps),
        ))

    def gemm(self, uop_bgn: int, uop_end: int, iter_out: int = 1, iter_in: int = 1,
             dst: tuple[int, int] = (0, 0), src: tuple[int, int] = (0, 0), wgt: tuple[int, int] = (0, 0),
             reset: bool = False, deps: Iterable[str] = (), overwrite: bool = False, beside: bool = False) -> int:
        """GEMM over uops [uop_bgn, uop_end) in a loop iter_out x iter_in; factors are (outer, inner)."""
        return self._add(dict(
            opcode=Opcode.GEMM, reset=int(reset), overwrite=int(overwrite), beside=int(beside),
            uop_bgn=uop_bgn, uop_end=uop_end,
            iter_out=iter_out, iter_in=iter_in, dst_factor_out=dst[0], dst_factor_in=dst[1], src_factor_out=src[0],
            src_factor_in=src[1], wgt_factor_out=wgt[0], wgt_factor_in=wgt[1], **self._deps(deps),
        ))

    def alu(self, op: AluOp | str, uop_bgn: int, uop_end: int, iter_out: int = 1, iter_in: int = 1,
            dst: tuple[int, int] = (0, 0), src: tuple[int, int] = (0, 0), imm: int | None = None,
            deps: Iterable[str] = (), src_inp: bool = False, beside: bool = False) -> int:
        """acc[dst] = op(acc[dst], imm if given else inp[src] if src_inp else acc[src]) over the uop loop."""
        op = AluOp[op.upper()] if isinstance(op, str) else AluOp(op)
        return self._add(dict(
            opcode=Opcode.ALU, alu_op=op, use_imm=int(imm is not None), imm=0 if imm is None else imm,
            src_inp=int(src_inp), beside=int(beside),
            uop_bgn=uop_bgn, uop_end=uop_end, iter_out=iter_out, iter_in=iter_in,
            dst_factor_out=dst[0], dst_factor_in=dst[1], src_factor_out=src[0], src_factor_in=src[1],
            **self._deps(deps),
        ))

    def finish(self, deps: Iterable[str] = ()) -> int:
        return self._add(dict(opcode=Opcode.FINISH, **self._deps(deps)))

    def add_deps(self, index: int, deps: Iterable[str]) -> None:
        """Set dependency flags on an instruction already appended."""
        self._rows[index].update(self._deps(deps))

    @property
    def insns(self) -> np.ndarray:
        out = np.zeros(len(self._rows), dtype=INSN_DTYPE)
        for i, row in enumerate(self._rows):
            for name, value in row.items():
                out[i][name] = int(value)
        return out


def uops_from(rows: Iterable[tuple[int, int, int]]) -> np.ndarray:
    """Micro-ops from (dst, src, wgt) triples."""
    rows = list(rows)
    out = np.zeros(len(rows), dtype=UOP_DTYPE)
    if rows:
        arr = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
        out["dst"], out["src"], out["wgt"] = arr[:, 0], arr[:, 1], arr[:, 2]
    return out
