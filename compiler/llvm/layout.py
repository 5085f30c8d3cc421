"""Host memory layouts of 4-D activations: plain NCHW, or channel-blocked NCHW[b]c.

In the blocked layout a tensor of logical shape (N, C, H, W) is stored as (N, C/b, H, W, b): the b
channels of one pixel are adjacent, so a convolution loads them as one SIMD vector and broadcasts an input
channel against b output channels at once (b = 16 floats fills an AVX-512 register). The block always
divides C: channels are never padded, so no op ever sees a made-up channel.

A blocked tensor with H = W = 1 has exactly the bytes of its plain form, so flattening a global pool's
output costs nothing.

A blocked tensor may carry a *halo*: a border of zeros around H and W, (N, C/b, H+2h, W+2h, b). A
convolution writes its output inside the border and the padded convolutions that read it take their
zeros from the border, with no pad kernel between them. The border is zero when the buffer is allocated
and nothing ever writes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from weft.compiler.llvm.expr import Expr

__all__ = ["PLAIN", "Layout", "block_for"]


@dataclass(frozen=True)
class Layout:
    """``block == 0``: the logical shape, row-major. ``block == b``: (N, C/b, H, W, b) of a 4-D tensor,
    (N, C/b, H+2*halo, W+2*halo, b) with a halo."""

    block: int = 0
    halo: int = 0

    def __post_init__(self) -> None:
        if self.halo and not self.blocked:
            raise ValueError("only channel-blocked layouts have a halo")

    @property
    def blocked(self) -> bool:
        return self.block > 0

    def check(self, shape: Sequence[int], what: str = "tensor") -> None:
        if self.blocked and (len(shape) != 4 or shape[1] % self.block):
            raise ValueError(f"{what} of shape {list(shape)} cannot use blocks of {self.block} channels")

    def physical(self, shape: Sequence[int]) -> tuple[int, ...]:
        self.check(shape)
        if not self.blocked:
            return tuple(shape)
        n, c, h, w = shape
        return (n, c // self.block, h + 2 * self.halo, w + 2 * self.halo, self.block)

    def domain(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The physical shape without the halo: the elements a kernel computes."""
        return self.without_halo().physical(shape)

    def without_halo(self) -> Layout:
        return Layout(self.block) if self.halo else self

    def same_bytes_as_plain(self, shape: Sequence[int]) -> bool:
        """True when this layout stores `shape` exactly like the plain layout does."""
        if self.halo:
            return False
        return not self.blocked or (shape[2] == 1 and shape[3] == 1) or self.block == shape[1] == 1

    def at(self, n: Expr, cb: Expr, h: Expr, w: Expr, c: Expr) -> tuple[Expr, ...]:
        """Buffer indices of element (n, channel block cb, h, w, channel c of the block): halo included."""
        if self.halo:
            return (n, cb, h + self.halo, w + self.halo, c)
        return (n, cb, h, w, c)

    def logical_index(self, axes: Sequence[Expr]) -> list[Expr]:
        """Logical (N, C, H, W...) indices of an element, from its indices in :meth:`domain`."""
        if not self.blocked:
            return list(axes)
        n, co, h, w, ci = axes
        return [n, co * self.block + ci, h, w]

    def physical_index(self, logical: Sequence[Expr]) -> list[Expr]:
        if not self.blocked:
            return list(logical)
        n, c, h, w = logical
        return list(self.at(n, c // self.block, h, w, c % self.block))

    def to_numpy(self, array: np.ndarray) -> np.ndarray:
        """A plain array in this layout (for weights, tests and conversions at the edges)."""
        if not self.blocked:
            return np.ascontiguousarray(array)
        n, c, h, w = array.shape
        out = array.reshape(n, c // self.block, self.block, h, w).transpose(0, 1, 3, 4, 2)
        if self.halo:
            k = self.halo
            out = np.pad(out, ((0, 0), (0, 0), (k, k), (k, k), (0, 0)))
        return np.ascontiguousarray(out)

    def from_numpy(self, array: np.ndarray) -> np.ndarray:
        """The plain array of a tensor held in this layout."""
        if not self.blocked:
            return array
        if self.halo:
            k = self.halo
            array = array[:, :, k:-k, k:-k, :]
        n, co, h, w, b = array.shape
        return np.ascontiguousarray(array.transpose(0, 1, 4, 2, 3).reshape(n, co * b, h, w))

    def __str__(self) -> str:
        if not self.blocked:
            return "plain"
        return f"NCHW{self.block}c" + (f"+halo{self.halo}" if self.halo else "")


PLAIN = Layout(0)


def block_for(channels: int, lanes: int) -> int:
    """The channel block for `channels` on a `lanes`-wide SIMD unit: the largest power of two up to
    `lanes` that divides the channel count (1 when it is odd)."""
    b = lanes
    while b > 1 and channels % b:
        b //= 2
    return b
