"""`weft bench compile`: how long a model takes to compile and to run on the reference device, and how
close its int8 outputs stay to float onnxruntime. Speed targets live here, not in unit tests."""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

__all__ = ["bench_compile"]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def bench_compile(config: str, model: str = "resnet18", repeat: int = 3, calibration_batches: int = 4,
                  seed: int = 0) -> dict[str, Any]:
    """Compile `model` (a name from :data:`weft.compiler.models.MODELS`) for `config` with seeded
    random calibration inputs, then run it on "ref" `repeat` times; medians in seconds."""
    import onnxruntime as ort

    from weft.compiler import models
    from weft.compiler.driver import compile_model
    from weft.config import load_config
    from weft.runtime.session import InferenceSession

    if model not in models.MODELS:
        raise ValueError(f"unknown model '{model}' (models: {', '.join(models.MODELS)})")
    cfg = load_config(config)
    onnx_model = models.MODELS[model]()
    inp = onnx_model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    rng = np.random.default_rng(seed)
    calibration = {inp.name: rng.standard_normal((calibration_batches, *shape)).astype(np.float32)}
    compile_times, artifact = [], None
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        artifact = compile_model(onnx_model, config=cfg, calibration=calibration)
        compile_times.append(time.perf_counter() - start)
    assert artifact is not None
    sess = InferenceSession(artifact, device="ref")
    x = {inp.name: rng.standard_normal(shape).astype(np.float32)}
    run_times, out = [], None
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        out = sess.run(None, x)[0]
        run_times.append(time.perf_counter() - start)
    ort_sess = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    start = time.perf_counter()
    want = ort_sess.run(None, x)[0]
    ort_seconds = time.perf_counter() - start
    stats = sess.stats or {}
    run_seconds = statistics.median(run_times)
    slowest = sorted(stats.get("layers", []), key=lambda layer: -layer["seconds"])[:5]
    return {
        "model": model, "config": cfg.name, "config_hash": cfg.hash, "calibration_batches": calibration_batches,
        "macs": stats.get("macs"), "accel_mac_fraction": stats.get("accel_mac_fraction"),
        "layers": len(artifact.graph.nodes), "artifact_bytes": len(artifact.to_bytes()),
        "compile_seconds": statistics.median(compile_times), "ref_seconds": run_seconds,
        "ref_gmac_per_second": (stats.get("macs") or 0) / run_seconds / 1e9,
        "onnxruntime_float_seconds": ort_seconds, "cosine_vs_onnxruntime": _cosine(out, want),
        "slowest_layers": [{k: layer[k] for k in ("name", "op", "macs", "seconds")} for layer in slowest],
    }
