"""Bit-packed rows: how SRAM tiles look in DRAM.

Element ``j`` of a row occupies bits ``[j*w, (j+1)*w)`` of the row, little-endian, as signed two's
complement (so int4 weights sit two to a byte, low nibble first). Byte-wide and wider elements are plain
little-endian integers, which numpy views without copying.
"""

from __future__ import annotations

import numpy as np

__all__ = ["int_dtype", "pack", "unpack", "wrap"]

_WIDE = {8: np.dtype(np.int8), 16: np.dtype("<i2"), 32: np.dtype("<i4")}


def int_dtype(width: int) -> np.dtype:
    """The narrowest numpy signed integer dtype that holds `width`-bit values."""
    for bits, dtype in _WIDE.items():
        if width <= bits:
            return dtype
    raise ValueError(f"no integer dtype for {width}-bit values")


def unpack(raw: np.ndarray, width: int) -> np.ndarray:
    """Bytes (..., nbytes) to signed `width`-bit integers (..., nbytes * 8 // width)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if width in _WIDE:
        return raw.view(_WIDE[width])
    per = 8 // width
    mask, sign = (1 << width) - 1, 1 << (width - 1)
    shifts = (np.arange(per, dtype=np.uint8) * width).astype(np.uint8)
    fields = ((raw[..., None] >> shifts) & mask).astype(np.int8)
    return ((fields ^ sign) - sign).reshape(*raw.shape[:-1], raw.shape[-1] * per)


def pack(values: np.ndarray, width: int) -> np.ndarray:
    """Signed integers (..., n) to bytes (..., n * width // 8); values must already fit `width` bits."""
    values = np.asarray(values)
    if width in _WIDE:
        return np.ascontiguousarray(values.astype(_WIDE[width])).view(np.uint8)
    per = 8 // width
    if values.shape[-1] % per:
        raise ValueError(f"{values.shape[-1]} elements of {width} bits do not fill whole bytes")
    fields = (values.astype(np.int16) & ((1 << width) - 1)).astype(np.uint8)
    fields = fields.reshape(*values.shape[:-1], values.shape[-1] // per, per)
    shifts = (np.arange(per, dtype=np.uint8) * width).astype(np.uint8)
    return np.bitwise_or.reduce(fields << shifts, axis=-1).astype(np.uint8)


def wrap(values: np.ndarray, width: int) -> np.ndarray:
    """int64 values reduced modulo 2**width into the signed `width`-bit range (two's complement wrap)."""
    if width in _WIDE:
        return values.astype(_WIDE[width]).astype(np.int64)
    half = 1 << (width - 1)
    return ((values + half) & ((1 << width) - 1)) - half
