"""How large one tensor may be, checked where a shape first becomes known (graph inputs, shape inference),
so an absurd shape is refused naming its input or node before numpy tries to allocate it."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["MAX_ELEMENTS", "shape_problem"]

#: The most elements one tensor may have (8 GiB of float32; far beyond what an FPGA board's DRAM holds).
MAX_ELEMENTS = 2**31


def shape_problem(shape: Sequence[int], *, allow_zero: bool = False) -> str | None:
    """What is wrong with `shape` (a negative dimension, a zero one unless `allow_zero`, too many elements),
    or None. Inside a graph empty tensors are legitimate (an empty Resize roi); a graph input is not."""
    for axis, d in enumerate(shape):
        if d < 0 or (d == 0 and not allow_zero):
            return f"dimension {axis} is {d}; every dimension must be at least {0 if allow_zero else 1}"
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        return f"{count} elements exceed the limit of {MAX_ELEMENTS} (2**31)"
    return None
