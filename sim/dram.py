"""A DRAM image: the memory the accelerator's DMA engines and fetch unit see, as one byte array."""

from __future__ import annotations

import numpy as np

__all__ = ["Dram"]


class Dram:
    """Byte-addressed memory of a fixed size; ``data`` is the image (np.uint8), addresses start at 0.

    ``alloc`` is a bump allocator for tests and small programs: it hands out aligned regions from the
    bottom of the image and never frees.
    """

    def __init__(self, size_bytes: int):
        if not isinstance(size_bytes, (int, np.integer)) or size_bytes < 0:
            raise ValueError(f"DRAM size must be a non-negative number of bytes, got {size_bytes!r}")
        self.data = np.zeros(int(size_bytes), dtype=np.uint8)
        self._top = 0

    @property
    def size(self) -> int:
        return int(self.data.size)

    def __len__(self) -> int:
        return self.size

    def _check(self, addr: int, nbytes: int, what: str) -> None:
        if addr < 0 or nbytes < 0 or addr + nbytes > self.size:
            raise ValueError(
                f"DRAM {what} of {nbytes} bytes at 0x{addr:x} is outside the {self.size}-byte image"
            )

    def write(self, addr: int, payload: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Copy bytes (or the raw bytes of a numpy array) to `addr`."""
        if isinstance(payload, np.ndarray):
            raw = np.ascontiguousarray(payload).reshape(-1).view(np.uint8)
        else:
            raw = np.frombuffer(bytes(payload), dtype=np.uint8)
        addr = int(addr)
        self._check(addr, raw.size, "write")
        self.data[addr:addr + raw.size] = raw

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        """A copy of `nbytes` bytes at `addr`."""
        addr, nbytes = int(addr), int(nbytes)
        self._check(addr, nbytes, "read")
        return self.data[addr:addr + nbytes].copy()

    def alloc(self, nbytes: int, align: int = 64) -> int:
        """Reserve `nbytes` bytes aligned to `align` (a power of two); returns the byte address."""
        if align <= 0 or align & (align - 1):
            raise ValueError(f"alignment must be a power of two, got {align}")
        addr = -(-self._top // align) * align
        self._check(addr, int(nbytes), "allocation")
        self._top = addr + int(nbytes)
        return addr
