"""weft.compiler: ONNX import, graph passes, int8 quantization and packing into a .weft artifact.

Only :mod:`weft.compiler.onnx_import` (and the driver that calls it) imports onnx: the passes and the
quantization math import with numpy alone. What the runtime needs too (the IR, the kernels, the layouts,
the artifact) is in :mod:`weft.core`; the compiler never imports :mod:`weft.runtime`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from weft.core.artifact import Artifact

__all__ = ["compile"]


def compile(model: Any, target: str = "accel", config: Any = "default", calibration: Any = None,
            **options: Any) -> Artifact:
    """Compile an ONNX model (path, bytes or ModelProto) into an :class:`~weft.runtime.Artifact`.
    See :func:`weft.compiler.driver.compile_model` for the options."""
    from weft.compiler.driver import compile_model  # optional dependency: onnx

    return compile_model(model, target=target, config=config, calibration=calibration, **options)
