"""Launch checks: the whole instruction stream is checked before the accelerator starts.

On a board the accelerator masters the DRAM bus, so a stray DMA write corrupts the operating system's
memory (and its addresses are 32 bits: a buffer above 4 GiB would wrap onto someone else's); a stream that
leaves tokens in a queue or pops one nobody pushes hangs the hardware; an encoding the ISA does not define
is refused here by the simulator's own rules (:mod:`weft.isa.semantics`), not left to the hardware decoder. Each check
raises :class:`LaunchError` naming the first bad instruction (index and assembly text), and nothing runs.

This module imports numpy and weft's ISA only (no amaranth, no cocotb): it is part of the board runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from weft.errors import WeftError
from weft.isa import semantics
from weft.isa.asm import format_insn
from weft.isa.constants import AXI_ADDR_BITS, Opcode

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["ADDRESS_LIMIT", "LaunchError", "check_buffers", "check_config_hash", "check_launch", "dma_ranges"]

#: The accelerator's AXI addresses are 32 bits: a byte at or above this wraps onto other memory.
ADDRESS_LIMIT = 1 << AXI_ADDR_BITS


class LaunchError(WeftError):
    """The driver refused to start the accelerator; ``index`` is the culprit instruction (None: none)."""

    def __init__(self, message: str, index: int | None = None):
        self.index = index
        super().__init__(message)


def dma_ranges(config: AcceleratorConfig, insns: np.ndarray) -> list[tuple[int, int, int]]:
    """(instruction index, first byte, one past the last byte) of every LOAD/STORE that moves data."""
    rows = semantics.row_bytes(config)
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
    units = semantics.units(insns)
    for q, queue in enumerate(semantics.QUEUES):
        pushes: list[int] = []
        pops: list[int] = []
        for unit, flags in semantics.FLAG_QUEUE.items():
            for flag, flag_q in flags.items():
                if flag_q == q:
                    hits = np.flatnonzero((units == unit) & (insns[flag] != 0)).tolist()
                    (pops if flag.startswith("pop") else pushes).extend(hits)
        pushes.sort()
        pops.sort()
        if len(pops) > len(pushes):
            i = pops[len(pushes)]
            raise LaunchError(f"instruction {i} ({format_insn(insns[i])}): pops queue {queue} but no instruction "
                              f"pushes its token ({len(pushes)} pushes, {len(pops)} pops): the run would hang", i)
        if len(pushes) > len(pops):
            i = pushes[len(pops)]
            raise LaunchError(f"instruction {i} ({format_insn(insns[i])}): pushes a token on queue {queue} that no "
                              f"instruction pops ({len(pushes)} pushes, {len(pops)} pops): tokens are unbalanced", i)


def _check_legal(config: AcceleratorConfig, insns: np.ndarray) -> None:
    """The encoding rules of :mod:`weft.isa.semantics`, the simulator's: the hardware decoder is not trusted."""
    illegal = semantics.first_illegal(semantics.legality_checks(insns, config.uop_rows))
    if illegal is not None:
        i, rule = illegal
        raise LaunchError(f"instruction {i} ({format_insn(insns[i])}): {rule}", i)


def check_buffers(buffers: Sequence[tuple[int, int]]) -> None:
    for k, (lo, hi) in enumerate(buffers):
        if lo < 0 or hi > ADDRESS_LIMIT:
            raise LaunchError(f"buffer {k} at 0x{lo:x}..0x{hi - 1:x} is not below 4 GiB: the accelerator's 32-bit "
                              "AXI addresses would wrap onto other memory; allocate it in the low 4 GiB")


def check_config_hash(artifact_hash: str, hardware_hash: str, where: str = "bitstream") -> None:
    if artifact_hash != hardware_hash:
        raise LaunchError(f"config hash mismatch: the artifact was compiled for config hash {artifact_hash} but the "
                          f"{where} was built for {hardware_hash}; use the bitstream of the artifact's config")


def check_launch(config: AcceleratorConfig, insns: np.ndarray, insn_addr: int, buffers: Sequence[tuple[int, int]],
                 insn_bytes: int, insn_count: int) -> None:
    """Every check of a launch that programs INSN_ADDR = `insn_addr` and INSN_COUNT = `insn_count` for the
    stream `insns` (exactly what the hardware will fetch): the buffers ([lo, hi) physical byte ranges
    allocated for this run) below 4 GiB, the fetch and every DMA range inside them, every instruction
    legal, tokens balanced per queue."""
    if len(insns) != insn_count:
        raise LaunchError(f"INSN_COUNT {insn_count} differs from the {len(insns)} instructions checked: the "
                          "hardware would fetch instructions nobody checked")
    if len(insns) == 0 or int(insns[-1]["opcode"]) != Opcode.FINISH:
        raise LaunchError(f"instruction {max(len(insns) - 1, 0)}: the stream must end with FINISH",
                          max(len(insns) - 1, 0))
    check_buffers(buffers)
    fetch = (insn_addr, insn_addr + len(insns) * insn_bytes)
    if not any(lo <= fetch[0] and fetch[1] <= hi for lo, hi in buffers):
        raise LaunchError(f"the instruction stream at 0x{fetch[0]:x}..0x{fetch[1] - 1:x} is outside the buffers "
                          "allocated for this run")
    _check_legal(config, insns)
    _check_dma(config, insns, buffers)
    _check_tokens(insns)
