"""Launch checks: the whole instruction stream is checked before the accelerator starts.

On a board the accelerator masters the DRAM bus, so a stray DMA write corrupts the operating system's
memory; a stream that leaves tokens in a queue or pops one nobody pushes hangs the hardware. Each check
raises :class:`LaunchError` naming the first bad instruction (index and assembly text), and nothing runs.

This module imports numpy and weft's ISA only (no amaranth, no cocotb): it is part of the board runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from weft.errors import WeftError
from weft.isa.asm import format_insn
from weft.isa.constants import MemId, Opcode, Unit

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["LaunchError", "check_config_hash", "check_launch", "dma_ranges", "mem_row_bytes"]

#: Token queues: name -> (pushing unit and flag, popping unit and flag); the order of weft.sim.fsim.QUEUES.
_QUEUES = {
    "l2g": ((Unit.LOAD, "push_next"), (Unit.COMPUTE, "pop_prev")),
    "g2l": ((Unit.COMPUTE, "push_prev"), (Unit.LOAD, "pop_next")),
    "g2s": ((Unit.COMPUTE, "push_next"), (Unit.STORE, "pop_prev")),
    "s2g": ((Unit.STORE, "push_prev"), (Unit.COMPUTE, "pop_next")),
}


class LaunchError(WeftError):
    """The driver refused to start the accelerator; ``index`` is the culprit instruction (None: none)."""

    def __init__(self, message: str, index: int | None = None):
        self.index = index
        super().__init__(message)


def mem_row_bytes(config: AcceleratorConfig) -> dict[int, int]:
    """DRAM bytes of one row of each memory id a LOAD or STORE moves."""
    c = config
    return {MemId.UOP: c.uop_bits // 8, MemId.WGT: c.wgt_row_bits // 8, MemId.INP: c.inp_row_bits // 8,
            MemId.ACC: c.acc_row_bits // 8, MemId.OUT: c.out_row_bits // 8, MemId.ACC_NARROW: c.out_row_bits // 8}


def unit_of(insn: np.void) -> Unit:
    op, mem = int(insn["opcode"]), int(insn["mem_id"])
    if op == Opcode.LOAD and mem in (MemId.INP, MemId.WGT):
        return Unit.LOAD
    if op == Opcode.STORE:
        return Unit.STORE
    return Unit.COMPUTE


def dma_ranges(config: AcceleratorConfig, insns: np.ndarray) -> list[tuple[int, int, int]]:
    """(instruction index, first byte, one past the last byte) of every LOAD/STORE that moves data."""
    rows = mem_row_bytes(config)
    out = []
    for i, r in enumerate(insns):
        if int(r["opcode"]) not in (Opcode.LOAD, Opcode.STORE) or int(r["x_size"]) == 0 or int(r["y_size"]) == 0:
            continue
        rb = rows.get(int(r["mem_id"]))
        if rb is None:
            raise LaunchError(f"instruction {i} ({format_insn(r)}): memory id {int(r['mem_id'])} has no DRAM rows", i)
        base, y, x, stride = (int(r[k]) for k in ("dram_base", "y_size", "x_size", "x_stride"))
        out.append((i, base * rb, (base + (y - 1) * stride + x) * rb))
    return out


def _check_dma(config: AcceleratorConfig, insns: np.ndarray, buffers: Sequence[tuple[int, int]]) -> None:
    for i, lo, hi in dma_ranges(config, insns):
        if not any(b_lo <= lo and hi <= b_hi for b_lo, b_hi in buffers):
            owned = ", ".join(f"0x{b_lo:x}..0x{b_hi - 1:x}" for b_lo, b_hi in buffers)
            raise LaunchError(f"instruction {i} ({format_insn(insns[i])}): DMA bytes 0x{lo:x}..0x{hi - 1:x} are "
                              f"outside the buffers allocated for this run ({owned})", i)


def _check_tokens(insns: np.ndarray) -> None:
    for queue, ((push_unit, push_flag), (pop_unit, pop_flag)) in _QUEUES.items():
        pushes = [i for i, r in enumerate(insns) if unit_of(r) == push_unit and int(r[push_flag])]
        pops = [i for i, r in enumerate(insns) if unit_of(r) == pop_unit and int(r[pop_flag])]
        if len(pops) > len(pushes):
            i = pops[len(pushes)]
            raise LaunchError(f"instruction {i} ({format_insn(insns[i])}): pops queue {queue} but no instruction "
                              f"pushes its token ({len(pushes)} pushes, {len(pops)} pops): the run would hang", i)
        if len(pushes) > len(pops):
            i = pushes[len(pops)]
            raise LaunchError(f"instruction {i} ({format_insn(insns[i])}): pushes a token on queue {queue} that no "
                              f"instruction pops ({len(pushes)} pushes, {len(pops)} pops): tokens are unbalanced", i)


def _check_uops(config: AcceleratorConfig, insns: np.ndarray) -> None:
    for i, r in enumerate(insns):
        if int(r["opcode"]) not in (Opcode.GEMM, Opcode.ALU):
            continue
        bgn, end = int(r["uop_bgn"]), int(r["uop_end"])
        if bgn >= end or end > config.uop_rows:
            raise LaunchError(f"instruction {i} ({format_insn(r)}): micro-op span {bgn}:{end} is not a non-empty "
                              f"range inside the {config.uop_rows} rows of the uop buffer", i)


def check_config_hash(artifact_hash: str, hardware_hash: str, where: str = "bitstream") -> None:
    if artifact_hash != hardware_hash:
        raise LaunchError(f"config hash mismatch: the artifact was compiled for config hash {artifact_hash} but the "
                          f"{where} was built for {hardware_hash}; use the bitstream of the artifact's config")


def check_launch(config: AcceleratorConfig, insns: np.ndarray, insn_addr: int, buffers: Sequence[tuple[int, int]],
                 insn_bytes: int) -> None:
    """Every check of a launch: the instruction fetch and every DMA range inside `buffers` ([lo, hi) byte
    ranges allocated for this run), tokens balanced per queue, micro-op spans in range."""
    if len(insns) == 0 or int(insns[-1]["opcode"]) != Opcode.FINISH:
        raise LaunchError(f"instruction {max(len(insns) - 1, 0)}: the stream must end with FINISH",
                          max(len(insns) - 1, 0))
    fetch = (insn_addr, insn_addr + len(insns) * insn_bytes)
    if not any(lo <= fetch[0] and fetch[1] <= hi for lo, hi in buffers):
        raise LaunchError(f"the instruction stream at 0x{fetch[0]:x}..0x{fetch[1] - 1:x} is outside the buffers "
                          "allocated for this run")
    _check_dma(config, insns, buffers)
    _check_tokens(insns)
    _check_uops(config, insns)
