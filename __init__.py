"""weft: one accelerator config drives the RTL, the ISA, the compiler and the runtime.

The top-level package stays light: ``import weft`` pulls in numpy and the config only. The compiler
(onnx) and the session API load on first use, so a board with pynq's pinned numpy can import weft.
"""

from __future__ import annotations

from typing import Any

from weft.config import PRESETS, AcceleratorConfig, ConfigError, load_config

__version__ = "0.1.0"

__all__ = ["PRESETS", "AcceleratorConfig", "ConfigError", "InferenceSession", "compile", "load_config"]


def __getattr__(name: str) -> Any:
    # Lazy entry points: the compiler needs onnx, which the board runtime must not require.
    if name == "compile":
        from weft.compiler import compile as _compile

        return _compile
    if name == "InferenceSession":
        from weft.runtime import InferenceSession

        return InferenceSession
    raise AttributeError(f"module 'weft' has no attribute '{name}'")
