"""Instruction streams under construction: each instruction with its unit and the SRAM rows it reads and
writes, so that :mod:`weft.compiler.backend.vthread` can derive the dependency tokens from program order.

Only the SRAMs two units share are tracked: inp and wgt (written by the load unit, read by GEMM) and out
(written by GEMM/ALU, read by STORE). The accumulator, the micro-op buffer and loads into them belong to
the compute unit alone, which runs in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from weft.compiler.backend.dma import Transfer
from weft.compiler.backend.te import Kernel
from weft.isa.constants import AluOp, MemId, Opcode, Unit
from weft.isa.encoding import INSN_DTYPE, UOP_DTYPE, layout_of
from weft.isa.layout import INSN_FIELD_NAMES

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["Insn", "Stream"]

Range = tuple[str, int, int]  # (sram, first row, one past the last)


@dataclass
class Insn:
    fields: dict[str, int]
    unit: Unit
    reads: tuple[Range, ...] = ()
    writes: tuple[Range, ...] = ()
    #: What the instruction does in the layer (for error messages and listings).
    note: str = ""
    #: The accumulator rows a GEMM or ALU instruction touches (dst, and an ALU's acc src): their hull.
    acc: tuple[int, int] = (0, 0)


def _hull(base: np.ndarray, kernel: Kernel, which: str) -> tuple[int, int]:
    """First and one-past-last row an operand touches over the kernel's loops (factors are >= 0)."""
    f_out, f_in = getattr(kernel, f"{which}_factor")
    lo = int(base.min())
    hi = int(base.max()) + (kernel.iter_out - 1) * f_out + (kernel.iter_in - 1) * f_in
    return lo, hi + 1


@dataclass
class Stream:
    """One accelerator program (a layer): instructions in program order and the micro-ops they use."""

    config: AcceleratorConfig
    insns: list[Insn] = field(default_factory=list)
    uops: list[np.ndarray] = field(default_factory=list)
    _uop_at: dict[bytes, int] = field(default_factory=dict)
    _uop_count: int = 0

    # ---- micro-op kernels -----------------------------------------------------------------------------
    def place(self, kernel: Kernel) -> tuple[int, int]:
        """The uop range of a kernel's micro-ops in this program's uop block (identical lists shared)."""
        key = kernel.key()
        if key not in self._uop_at:
            self._uop_at[key] = self._uop_count
            self.uops.append(kernel.uops)
            self._uop_count += len(kernel.uops)
        start = self._uop_at[key]
        return start, start + len(kernel.uops)

    @property
    def uop_count(self) -> int:
        return self._uop_count

    def uop_table(self) -> np.ndarray:
        """The program's micro-op block, as the uop buffer holds it from row 0."""
        return np.concatenate(self.uops) if self.uops else np.zeros(0, dtype=UOP_DTYPE)

    # ---- instructions ---------------------------------------------------------------------------------
    def _add(self, insn: Insn) -> int:
        self.insns.append(insn)
        return len(self.insns) - 1

    def transfer(self, t: Transfer, note: str = "") -> int:
        fields = dict(opcode=int(Opcode.STORE if t.mem == MemId.OUT else Opcode.LOAD), mem_id=int(t.mem),
                      sram_base=t.sram, dram_base=t.dram, y_size=t.y, x_size=t.x, x_stride=t.stride,
                      y_pad_0=t.pads[0], y_pad_1=t.pads[1], x_pad_0=t.pads[2], x_pad_1=t.pads[3])
        rows = (t.sram, t.sram + t.sram_rows)
        if t.mem == MemId.OUT:
            return self._add(Insn(fields, Unit.STORE, reads=(("out", *rows),), note=note))
        if t.mem in (MemId.INP, MemId.WGT):
            return self._add(Insn(fields, Unit.LOAD, writes=((t.mem.name.lower(), *rows),), note=note))
        return self._add(Insn(fields, Unit.COMPUTE, note=note))

    def load_uops(self, dram_row: int) -> None:
        """Load this program's whole micro-op block (at DRAM row `dram_row` of uop words) into the uop SRAM."""
        size_max = layout_of(self.config).formats["mem"].field("x_size").max
        for lo in range(0, self._uop_count, size_max):
            n = min(size_max, self._uop_count - lo)
            self.transfer(Transfer(MemId.UOP, lo, dram_row + lo, 1, n, n), note="micro-ops")

    def gemm(self, kernel: Kernel, *, reset: bool = False, overwrite: bool = False, note: str = "") -> int:
        bgn, end = self.place(kernel)
        fields = dict(opcode=int(Opcode.GEMM), reset=int(reset), overwrite=int(overwrite), uop_bgn=bgn, uop_end=end,
                      iter_out=kernel.iter_out, iter_in=kernel.iter_in,
                      dst_factor_out=kernel.dst_factor[0], dst_factor_in=kernel.dst_factor[1])
        writes = (("out", *_hull(kernel.uops["dst"], kernel, "dst")),)
        reads: tuple[Range, ...] = ()
        if not reset:
            fields.update(src_factor_out=kernel.src_factor[0], src_factor_in=kernel.src_factor[1],
                          wgt_factor_out=kernel.wgt_factor[0], wgt_factor_in=kernel.wgt_factor[1])
            reads = (("inp", *_hull(kernel.uops["src"], kernel, "src")),
                     ("wgt", *_hull(kernel.uops["wgt"], kernel, "wgt")))
        return self._add(Insn(fields, Unit.COMPUTE, reads=reads, writes=writes, note=note, acc=writes[0][1:]))

    def alu(self, op: AluOp, kernel: Kernel, imm: int | None = None, note: str = "", src_inp: bool = False) -> int:
        """acc[dst] = op(acc[dst], imm if given, else inp[src] with `src_inp`, else acc[src])."""
        bgn, end = self.place(kernel)
        fields = dict(opcode=int(Opcode.ALU), alu_op=int(op), use_imm=int(imm is not None),
                      imm=0 if imm is None else int(imm), uop_bgn=bgn, uop_end=end, iter_out=kernel.iter_out,
                      iter_in=kernel.iter_in, dst_factor_out=kernel.dst_factor[0],
                      dst_factor_in=kernel.dst_factor[1], src_inp=int(src_inp and imm is None))
        reads: tuple[Range, ...] = ()
        writes = (("out", *_hull(kernel.uops["dst"], kernel, "dst")),)
        acc = writes[0][1:]
        if imm is None:
            fields.update(src_factor_out=kernel.src_factor[0], src_factor_in=kernel.src_factor[1])
            src = _hull(kernel.uops["src"], kernel, "src")
            if src_inp:
                reads = (("inp", *src),)
            else:
                acc = (min(acc[0], src[0]), max(acc[1], src[1]))
        return self._add(Insn(fields, Unit.COMPUTE, reads=reads, writes=writes, note=note, acc=acc))

    def program(self, uop_dram_row: int) -> Stream:
        """The runnable program: this stream's micro-op block loaded first (from DRAM row `uop_dram_row`
        of uop words), its instructions, then FINISH (dependency flags not injected yet)."""
        out = Stream(self.config)
        out.uops, out._uop_at, out._uop_count = self.uops, self._uop_at, self._uop_count
        out.load_uops(uop_dram_row)
        out.insns += self.insns
        out.finish()
        return out

    def finish(self) -> int:
        return self._add(Insn(dict(opcode=int(Opcode.FINISH)), Unit.COMPUTE, note="finish"))

    def array(self) -> np.ndarray:
        """The program as an INSN_DTYPE array (dependency flags included once injected)."""
        out = np.zeros(len(self.insns), dtype=INSN_DTYPE)
        cols = {name: np.zeros(len(self.insns), dtype=np.int64) for name in INSN_FIELD_NAMES}
        for i, insn in enumerate(self.insns):
            for name, value in insn.fields.items():
                cols[name][i] = value
        for name, col in cols.items():
            out[name] = col
        return out
