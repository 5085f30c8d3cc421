"""The accelerator's packed tensor layouts, derived from the config.

Activations: logical NCHW (or NK, read as NK11) -> ``(N/batch, C/block, H, W, batch, block)``, where
``block`` is the activation channel block :func:`act_block` and N and C are zero-padded up to multiples of
``batch`` and ``block``. One ``(batch, block)`` tile is what the GEMM core reads per input row when
``block == block_in`` and what it writes per output row when ``block == block_out``.

Weights: ``(O, I, kh, kw)`` -> ``(O/block_out, I/block_in, kh, kw, block_out, block_in)``, with O and I
zero-padded to the activation block (a multiple of both GEMM blocks) so that a layer's padded output
channels are exactly the next layer's padded input channels.

Per-channel vectors (bias, multipliers) are padded with zeros to the padded channel count. Zero weights,
zero bias and zero multipliers keep padded channels at exactly zero through every layer.

In DRAM, the accelerator moves whole rows of ``(batch, r)`` elements, ``r`` the GEMM block of the memory
(``block_in`` for inp rows, ``block_out`` for out and acc rows). With ``batch > 1`` and ``r < block``, the
``(batch, r)`` rows of one ``(batch, block)`` tile are not contiguous in the packed order, so a value the
accelerator touches sits in DRAM in its *row order* for ``r``: each tile as ``(block/r, batch, r)``
(:func:`to_rows`, :func:`from_rows`; the identity when batch is 1 or ``r == block``). A value read by a
convolution (inp rows) and written or read by anything else (out rows) then has two DRAM copies, one per
order (:func:`dram_rows` says which orders a config needs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = [
    "act_block", "dram_rows", "from_nhwc", "from_rows", "pack_act", "pack_weights", "packed_act_shape", "pad_to",
    "reordered", "row_order_refusal", "to_nhwc", "to_rows", "unpack_act", "unpack_weights",
]


def act_block(config: AcceleratorConfig) -> int:
    """Channel block of packed activations: the larger GEMM block (both are powers of two, so it is a
    multiple of the other and padded channel counts fit both)."""
    return max(config.block_in, config.block_out)


def dram_rows(config: AcceleratorConfig) -> tuple[int, int]:
    """(inp, out) row blocks: the channels of one DRAM row a convolution's input load moves, and of one
    row every other transfer of activations moves (stores, residuals, pooling windows)."""
    return config.block_in, config.block_out


def reordered(batch: int, block: int, rows: int) -> bool:
    """Whether the row order for `rows` differs from the packed order (tiles of `batch` x `block`)."""
    return batch > 1 and rows != block


def row_order_refusal(config: AcceleratorConfig) -> str | None:
    """Why the config cannot keep activations in its row orders, or None when it can.

    A value written in out rows and read in inp rows is converted on the accelerator by an identity 1x1
    convolution (:func:`weft.compiler.backend.codegen.lower_relayout`) whose GEMM rows hold one sub-block
    of the smaller GEMM block per batch slot: exact only when a tile holds `batch` such sub-blocks."""
    c = config
    small = min(c.block_in, c.block_out)
    if c.batch == 1 or c.block_in == c.block_out or act_block(c) // small == c.batch:
        return None
    ratio = act_block(c) // small
    return (f"batch {c.batch} with block_in {c.block_in} and block_out {c.block_out}: activations move between "
            f"inp and out rows only when batch is 1, block_in == block_out or batch == max(block_in, block_out) / "
            f"min(block_in, block_out) (set batch=1 or batch={ratio})")


def to_rows(packed: np.ndarray, rows: int) -> np.ndarray:
    """Packed ``(..., batch, block)`` -> the same shape holding the row order for `rows`: each tile's
    elements in ``(block/rows, batch, rows)`` order (a copy)."""
    *lead, b, blk = packed.shape
    tiles = packed.reshape(*lead, b, blk // rows, rows)
    return np.ascontiguousarray(np.moveaxis(tiles, -2, -3)).reshape(packed.shape)


def from_rows(x: np.ndarray, rows: int) -> np.ndarray:
    """Inverse of :func:`to_rows`."""
    *lead, b, blk = x.shape
    tiles = x.reshape(*lead, blk // rows, b, rows)
    return np.ascontiguousarray(np.moveaxis(tiles, -3, -2)).reshape(x.shape)


def pad_to(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _as4(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    if len(shape) == 2:
        return shape[0], shape[1], 1, 1
    if len(shape) == 4:
        return shape  # type: ignore[return-value]
    raise ValueError(f"packed activations are NCHW or NK, got a rank-{len(shape)} shape {list(shape)}")


def packed_act_shape(logical: tuple[int, ...], batch: int, block: int) -> tuple[int, ...]:
    n, c, h, w = _as4(logical)
    return (pad_to(n, batch) // batch, pad_to(c, block) // block, h, w, batch, block)


def to_nhwc(packed: np.ndarray) -> np.ndarray:
    """(N/b, C/B, H, W, b, B) -> (N_pad, H, W, C_pad): the padded tensor with channels last."""
    nb, cb, h, w, b, blk = packed.shape
    return packed.transpose(0, 4, 2, 3, 1, 5).reshape(nb * b, h, w, cb * blk)


def from_nhwc(x: np.ndarray, batch: int, block: int) -> np.ndarray:
    """(N_pad, H, W, C_pad) with N_pad, C_pad multiples of batch and block -> packed (a copy)."""
    n, h, w, c = x.shape
    return np.ascontiguousarray(x.reshape(n // batch, batch, h, w, c // block, block).transpose(0, 4, 2, 3, 1, 5))


def pack_act(x: np.ndarray, batch: int, block: int) -> np.ndarray:
    """Logical NCHW/NK integers -> packed layout, zero-padding N and C."""
    n, c, h, w = _as4(x.shape)
    nhwc = np.zeros((pad_to(n, batch), h, w, pad_to(c, block)), dtype=x.dtype)
    nhwc[:n, :, :, :c] = x.reshape(n, c, h, w).transpose(0, 2, 3, 1)
    return from_nhwc(nhwc, batch, block)


def unpack_act(packed: np.ndarray, logical: tuple[int, ...]) -> np.ndarray:
    """Packed layout -> the logical NCHW/NK tensor (padding dropped)."""
    n, c, _, _ = _as4(logical)
    nhwc = to_nhwc(packed)[:n, :, :, :c]
    return np.ascontiguousarray(nhwc.transpose(0, 3, 1, 2)).reshape(logical)


def pack_weights(w: np.ndarray, block_out: int, block_in: int, out_pad: int, in_pad: int) -> np.ndarray:
    """(O, I, kh, kw) -> (O_pad/block_out, I_pad/block_in, kh, kw, block_out, block_in), zero-padded."""
    o, i, kh, kw = w.shape
    full = np.zeros((out_pad, in_pad, kh, kw), dtype=w.dtype)
    full[:o, :i] = w
    blocks = full.reshape(out_pad // block_out, block_out, in_pad // block_in, block_in, kh, kw)
    return np.ascontiguousarray(blocks.transpose(0, 2, 4, 5, 1, 3))


def unpack_weights(packed: np.ndarray, out_ch: int | None = None, in_ch: int | None = None) -> np.ndarray:
    """Packed weights -> (O, I, kh, kw), cropped to `out_ch` x `in_ch` when given."""
    ob, ib, kh, kw, bo, bi = packed.shape
    full = packed.transpose(0, 4, 1, 5, 2, 3).reshape(ob * bo, ib * bi, kh, kw)
    return full[:out_ch, :in_ch]
