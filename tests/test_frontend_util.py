"""Helpers shared by the compiler front-end tests (no tests here): tiny ONNX graphs written with
onnx.helper, onnxruntime as the float reference, and a cosine similarity."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

__all__ = ["cosine", "make_model", "ort_run", "rand"]


def make_model(nodes: Sequence[onnx.NodeProto], inputs: Mapping[str, Sequence[int | str | None]],
               outputs: Mapping[str, Sequence[int] | None], inits: Mapping[str, np.ndarray] | None = None,
               opset: int = 13, name: str = "test") -> onnx.ModelProto:
    """A model with float32 inputs/outputs (output shapes may be None), initializers from numpy arrays,
    and the oldest IR version that holds `opset` (what onnxruntime accepts)."""
    graph = helper.make_graph(
        list(nodes), name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None if s is None else list(s))
         for n, s in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in (inits or {}).items()],
    )
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))


def ort_run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def rand(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)
