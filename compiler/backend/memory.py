"""The DRAM image of a compiled model: where every tensor, micro-op block and program lives.

Layout, from address 0: one buffer per activation an accelerator layer reads or writes (two for a value
kept in both row orders of :mod:`weft.core.layout`; zeros in the image; the device writes inputs and the
programs write the rest), then the constants, laid out once at compile time: weights (the packed
``(O/bo, I/bi, kh, kw)`` rows as the weight buffer reads them), the epilogue vectors (acc rows), the
micro-op blocks (identical blocks shared between layers) and the instruction streams. Every region starts
on a boundary of the largest row size, so its address counts whole rows of whichever memory moves it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from weft.isa.arith import pack
from weft.isa.constants import DRAM_ALIGN_BYTES, INSN_BYTES
from weft.isa.semantics import named_row_bytes, row_bytes

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["DramPlan"]


@dataclass
class DramPlan:
    """A bump allocator over the image that keeps the constant bytes it is given."""

    config: AcceleratorConfig
    top: int = 0
    chunks: list[tuple[int, bytes]] = field(default_factory=list)
    regions: dict[str, tuple[int, int]] = field(default_factory=dict)
    _shared: dict[bytes, int] = field(default_factory=dict)

    @property
    def align(self) -> int:
        # (a multiple of each: a region starts on a row of every memory and on a line of the race check)
        return math.lcm(DRAM_ALIGN_BYTES, INSN_BYTES, *row_bytes(self.config).values())

    def alloc(self, name: str, nbytes: int) -> int:
        """A zero-initialized region of `nbytes` bytes; returns its byte address."""
        if name in self.regions:
            raise ValueError(f"DRAM region '{name}' is allocated twice")
        addr = math.ceil(self.top / self.align) * self.align
        self.top = addr + int(nbytes)
        self.regions[name] = (addr, int(nbytes))
        return addr

    def constant(self, name: str, data: bytes, share: bool = False) -> int:
        """A region holding `data`; with `share`, identical data already placed is reused."""
        if share and data in self._shared:
            addr = self._shared[data]
            self.regions[name] = (addr, len(data))
            return addr
        addr = self.alloc(name, len(data))
        self.chunks.append((addr, data))
        if share:
            self._shared[data] = addr
        return addr

    def element(self, addr: int, memory: str) -> int:
        """The byte address `addr` in rows of `memory` (exact: regions are aligned)."""
        size = named_row_bytes(self.config)[memory]
        if addr % size:
            raise ValueError(f"address 0x{addr:x} is not a whole number of {memory} rows of {size} bytes")
        return addr // size

    @property
    def size(self) -> int:
        return math.ceil(self.top / self.align) * self.align

    def image(self, start: int) -> np.ndarray:
        """The constant bytes from `start` (every constant lies above it) to the end of the image."""
        out = np.zeros(self.size - start, dtype=np.uint8)
        for addr, data in self.chunks:
            if addr < start:
                raise ValueError(f"constant at 0x{addr:x} lies below the constant region at 0x{start:x}")
            out[addr - start:addr - start + len(data)] = np.frombuffer(data, dtype=np.uint8)
        return out


def weight_bytes(packed: np.ndarray, config: AcceleratorConfig) -> bytes:
    """Packed weights ``(O/bo, I/bi, kh, kw, bo, bi)`` as wgt rows."""
    rows = np.ascontiguousarray(packed).reshape(-1, config.block_out * config.block_in)
    return pack(rows.astype(np.int64), config.wgt_width).tobytes()


def vector_bytes(vectors: list[np.ndarray], config: AcceleratorConfig) -> bytes:
    """Epilogue vectors as acc rows ``[vector][output block]``: each row holds the block's channel values
    once per batch row."""
    c = config
    rows = []
    for vec in vectors:
        blocks = np.asarray(vec, dtype=np.int64).reshape(-1, c.block_out)
        rows.append(np.repeat(blocks[:, None, :], c.batch, axis=1).reshape(blocks.shape[0], -1))
    table = np.concatenate(rows) if rows else np.zeros((0, c.batch * c.block_out), np.int64)
    return pack(table, c.acc_width).tobytes()
