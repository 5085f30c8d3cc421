"""The compiler's user-facing errors. Each one names its culprit (a node and its op, an input, a field),
so a failed compile says what to change in the model or the options."""

from __future__ import annotations

from weft.errors import WeftError

__all__ = [
    "CalibrationWarning", "CompileError", "GraphError", "ModelError", "QuantizationError", "UnsupportedError",
]


class CompileError(WeftError):
    """A model the compiler cannot turn into an artifact. ``node`` and ``op`` name the culprit when one
    node is to blame; the message then starts with ``node 'NAME' (OP):``."""

    def __init__(self, message: str, *, node: str | None = None, op: str | None = None):
        self.node = node
        self.op = op
        if node is not None:
            message = f"node '{node}' ({op}): {message}"
        super().__init__(message)


class ModelError(CompileError):
    """The model file itself is wrong: unreadable, truncated, inconsistent, missing an input or a value,
    or with a dynamic shape that cannot be fixed."""


class UnsupportedError(CompileError):
    """A valid model that uses an op, an attribute value or a data type weft does not support."""


class QuantizationError(CompileError):
    """Integer quantization is impossible as asked: bad calibration data, or values that would overflow
    the accelerator's accumulator."""


class GraphError(CompileError):
    """The verifier found a broken graph invariant (a bug in a pass, or a hand-made graph)."""


class CalibrationWarning(UserWarning):
    """Quantization ran without real calibration data (seeded random inputs were used instead)."""
