"""Grouped convolution on block-packed channels: which channel blocks each output block reduces over.

A grouped convolution (``group`` = G; weights ``(O, C/G, kh, kw)``) is mapped onto the GEMM core in
*super-groups*: the fewest consecutive groups whose input and output channels both fill whole channel
blocks (``block`` = the packed activation block). Super-group ``s`` reads input blocks
``[s*Q, (s+1)*Q)`` and writes output blocks ``[s*P, (s+1)*P)``; inside it the weights are the dense
``(P*block, Q*block)`` matrix, zero outside each group (block-diagonal). So every output block reduces over
the Q input blocks of its own super-group only, never over the whole input: a depthwise layer (one input
channel per output) has ``Q = P = 1`` with a diagonal weight tile, ResNeXt's 4-channel groups put
``block / 4`` groups in one tile, and groups of whole blocks are dense convolutions side by side.

Shapes whose groups never align with the blocks inside the padded channel count (rare: e.g. 5 groups of 3
channels with blocks of 4) fall back to one super-group, the dense convolution with zeros outside the
groups: correct, but it reduces over every input block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from weft.core.layout import pad_to

__all__ = ["SuperGroups", "dense_super_weights", "super_groups"]


@dataclass(frozen=True)
class SuperGroups:
    count: int  # super-groups (M)
    out_blocks: int  # output channel blocks per super-group (P)
    in_blocks: int  # input channel blocks each output block reduces over (Q)


def super_groups(group: int, in_channels: int, out_channels: int, block: int) -> SuperGroups:
    """The super-groups of a grouped convolution (`in_channels`, `out_channels` are the logical counts)."""
    icb, ocb = pad_to(in_channels, block) // block, pad_to(out_channels, block) // block
    cg, og = in_channels // group, out_channels // group
    m = math.lcm(block // math.gcd(block, cg), block // math.gcd(block, og))  # groups per super-group
    count = -(-group // m)
    p, q = m * og // block, m * cg // block
    if count * p == ocb and count * q == icb:
        return SuperGroups(count, p, q)
    return SuperGroups(1, ocb, icb)


def dense_super_weights(w: np.ndarray, group: int, block: int) -> tuple[np.ndarray, SuperGroups]:
    """Grouped weights ``(O, C/G, kh, kw)`` -> ``(M*P*block, Q*block, kh, kw)``: per super-group its dense
    block-diagonal matrix (zeros outside each group and in the padding), stacked along the output axis."""
    o, cg, kh, kw = w.shape
    og = o // group
    sg = super_groups(group, cg * group, o, block)
    rows, cols = sg.out_blocks * block, sg.in_blocks * block
    out = np.zeros((sg.count * rows, cols, kh, kw), dtype=w.dtype)
    for g in range(group):
        oc, ic = g * og, g * cg  # the group's first output and input channel
        s = oc // rows
        out[oc:oc + og, ic - s * cols:ic - s * cols + cg] = w[oc:oc + og]
    return out, sg
