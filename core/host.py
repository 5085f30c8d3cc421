"""The host dispatcher: how every device runs a layer on the host CPU in numpy.

Integer ops run the kernels of :mod:`weft.core.qkernels` (bit-exact with the accelerator), float ops the
kernels of :mod:`weft.core.float_ops`. The reference interpreter, the fsim device and the driver devices
(rtl, pynq) all call :func:`run_host_node`, so a host layer gives the same answer on each of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from weft.core.float_ops import FLOAT_OPS
from weft.core.ir import Node, Value
from weft.core.qkernels import QKERNELS, Widths
from weft.errors import WeftError

__all__ = ["HostRunner", "NoKernelError", "run_host_node"]

#: ``(node, args, ins, outs, widths) -> outputs``: what the graph walker calls for a host layer.
HostRunner = Callable[[Node, list[Any], list[Value | None], list[Value], Widths], list[np.ndarray]]


class NoKernelError(WeftError):
    """A host layer whose op has neither an integer nor a float kernel."""


def run_host_node(node: Node, args: list[Any], ins: list[Value | None], outs: list[Value],
                  widths: Widths) -> list[np.ndarray]:
    """The outputs of `node` on `args` (its input arrays, None for an absent optional input); `ins` and
    `outs` are the node's values (integer kernels read their quantization), `widths` the config's."""
    kernel = QKERNELS.get(node.op)
    if kernel is not None:
        return kernel(node, args, ins, outs, widths)
    opdef = FLOAT_OPS.get(node.op)
    if opdef is None:
        raise NoKernelError(f"node '{node.name}' ({node.op}): no host kernel for this op (neither an integer "
                            "nor a float kernel)")
    return opdef.run(node, args)
