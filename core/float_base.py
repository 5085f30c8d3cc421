"""What every float op table shares: the OpDef record, shape helpers and generic shape rules.

:mod:`weft.core.float_ops` and the op tables it merges (:mod:`~weft.core.float_elementwise`,
:mod:`~weft.core.float_tensor`, :mod:`~weft.core.float_nn`) import from here, never from each other,
so imports flow one way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from weft.core.errors import ModelError, UnsupportedError
from weft.core.ir import Node, Value, dtype_name, numpy_dtype

__all__ = ["Known", "OpDef", "Result", "Shape", "broadcast", "by_running", "err", "need", "same", "shape_of"]

Shape = tuple[int, ...]
#: Resolves input k to its value when statically known (a constant or a folded shape), else None.
Known = Callable[[int], "np.ndarray | None"]
Result = list[tuple[Shape, str]]
Kernel = Callable[[Node, list[Any]], list[np.ndarray]]


@dataclass(frozen=True)
class OpDef:
    """Shape rule and kernel of one op. ``infer(node, inputs, known)`` returns (shape, dtype) per output;
    ``run(node, arrays)`` returns the output arrays (absent optional inputs are None)."""

    infer: Callable[[Node, list[Value | None], Known], Result]
    run: Kernel


def err(node: Node, message: str) -> ModelError:
    return ModelError(message, node=node.name, op=node.op)


def shape_of(node: Node, v: Value | None, what: str) -> Shape:
    if v is None or v.shape is None:
        raise err(node, f"the shape of {what} is unknown")
    return v.shape


def need(node: Node, known: Known, k: int, what: str) -> np.ndarray:
    value = known(k)
    if value is None:
        raise UnsupportedError(
            f"{what} (input {k}, '{node.inputs[k]}') must be a constant or fold to one; it depends on "
            "runtime data", node=node.name, op=node.op)
    return value


def same(node: Node, ins: list[Value | None], known: Known) -> Result:
    v = ins[0]
    return [(shape_of(node, v, "the input"), v.dtype)]  # type: ignore[union-attr]


def broadcast(node: Node, ins: list[Value | None], known: Known) -> Result:
    shapes = [shape_of(node, v, f"input {k}") for k, v in enumerate(ins)]
    try:
        out = np.broadcast_shapes(*shapes)
    except ValueError:
        raise err(node, f"input shapes {[list(s) for s in shapes]} do not broadcast") from None
    return [(tuple(out), ins[0].dtype)]  # type: ignore[union-attr]


def by_running(run: Kernel, value_inputs: Sequence[int] = ()) -> Callable[[Node, list[Value | None], Known], Result]:
    """A shape rule that runs `run` on placeholders of the input shapes (zeros where an input is not
    statically known); the inputs in `value_inputs` decide the output shape, so they must be known."""

    def infer(node: Node, ins: list[Value | None], known: Known) -> Result:
        args = []
        for k, v in enumerate(ins):
            if v is None:
                args.append(None)
                continue
            value = need(node, known, k, "this input") if k in value_inputs else known(k)
            args.append(value if value is not None else np.zeros(shape_of(node, v, f"input {k}"),
                                                                numpy_dtype(v.dtype)))
        return [(o.shape, dtype_name(np.asarray(o))) for o in run(node, args)]

    return infer
