"""The compile driver: ONNX model + config (+ calibration data) -> .weft artifact.

    art = weft.compile("resnet18.onnx", target="accel", config="default", calibration=samples)
    art.save("resnet18.weft")

A pre-quantized model (QDQ or QOperator format, see :mod:`weft.core.qdq`) brings its own activation
scales and needs no calibration data. Otherwise, without calibration data the accel target calibrates on
:data:`~weft.compiler.calibrate.DEFAULT_SAMPLES` batches of seeded standard-normal inputs and warns
(:class:`CalibrationWarning`): fine for a smoke test, not for accuracy.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weft.compiler.backend import generate
from weft.compiler.calibrate import DEFAULT_SAMPLES, load_calibration, random_batches, sample_shapes, split_batches
from weft.compiler.onnx_import import declared_inputs, import_onnx, load_model
from weft.compiler.pipeline import TARGETS, Pass, build_pipeline, run_pipeline
from weft.compiler.tune.log import best_schedules
from weft.compiler.tune.measure import layers_of
from weft.config import AcceleratorConfig, load_config
from weft.core.artifact import Artifact
from weft.core.errors import CalibrationWarning
from weft.core.qdq import model_scales
from weft.errors import UsageError, read_input

if TYPE_CHECKING:
    import onnx

    from weft.core.ir import Graph

__all__ = ["compile_model"]


def _source(model: Any) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """The parsed model, and what the artifact records about where it came from."""
    if isinstance(model, (str, Path)):
        path = Path(model)
        if path.is_file():
            data = read_input(path, "model")
            source = {"name": path.name, "sha256": hashlib.sha256(data).hexdigest()}
            return load_model(data, str(path), path.parent), source
        return load_model(path), {"name": path.name}
    if isinstance(model, (bytes, bytearray)):
        return load_model(bytes(model)), {"name": None, "sha256": hashlib.sha256(model).hexdigest()}
    return load_model(model), {"name": getattr(getattr(model, "graph", None), "name", None)}


def compile_model(model: str | Path | bytes | onnx.ModelProto, *, target: str = "accel",
                  config: str | Path | AcceleratorConfig | Mapping[str, Any] = "default", calibration: Any = None,
                  input_shapes: Mapping[str, Sequence[int]] | None = None, verify: bool = True, seed: int = 0,
                  trace: Callable[[Pass, Graph], None] | None = None, codegen: bool = True,
                  latency_hiding: bool = True, schedules: Mapping[str, Any] | None = None,
                  tuning_log: str | Path | None = None) -> Artifact:
    """Compile `model` for `target` ("accel": integer layers for `config`; "cpu": the float graph).

    `calibration`: a mapping input name -> array (or a list of them, or an array for a one-input model),
    see :mod:`weft.compiler.calibrate`; `input_shapes` fixes dynamic input dimensions; `verify` checks
    the graph after every pass; `trace(pass, graph)` sees each intermediate graph; `tuning_log` (a
    ``weft tune`` JSON-lines log) gives each accelerator layer the best logged schedule of its workload on
    this config (`schedules` still wins for the layers it names).
    """
    if target not in TARGETS:
        raise UsageError(f"target must be one of {', '.join(TARGETS)}, got '{target}'")
    cfg = load_config(config)  # type: ignore[arg-type]
    proto, source = _source(model)
    if isinstance(calibration, (str, Path)):
        calibration = load_calibration(calibration)
    declared = declared_inputs(proto)
    samples = sample_shapes(calibration, {n: (len(d), d) for n, (d, _) in declared.items()}) \
        if calibration is not None else {}
    graph = import_onnx(proto, input_shapes, samples)
    source.update(opset=graph.meta.get("opset"), producer=graph.meta.get("producer"))
    batches = None
    calibration_info: dict[str, Any] = {}
    prequantized = bool(model_scales(graph))
    if target == "accel":
        if calibration is None and prequantized:
            calibration_info = {"source": "model (QDQ)"}
        elif calibration is None:
            warnings.warn(
                f"no calibration data: calibrating on {DEFAULT_SAMPLES} batches of seeded random inputs "
                f"(seed {seed}); int8 accuracy on real data may suffer (give calibration data: "
                "`weft compile --calibration FILE.npz`, calibration= in Python; "
                "`weft model NAME --samples N` writes such a file)",
                CalibrationWarning, stacklevel=3)
            batches = random_batches(graph, DEFAULT_SAMPLES, seed)
            calibration_info = {"source": "random", "seed": seed, "batches": len(batches)}
        else:
            batches = split_batches(calibration, graph)
            calibration_info = {"source": "given", "batches": len(batches)}
    pipeline = build_pipeline(target, cfg, batches, prequantized=prequantized)
    graph = run_pipeline(graph, pipeline, verify_each=verify, trace=trace)
    meta = {"source": source, "pipeline": [p.name for p in pipeline], "input_shapes":
            {n: list(graph.values[n].shape or ()) for n in graph.inputs}}
    if calibration_info:
        meta["calibration"] = calibration_info
    artifact = Artifact(graph, cfg, target, meta=meta)
    if target == "accel" and codegen:
        tuned = {}
        if tuning_log is not None:
            tuned = best_schedules(tuning_log, [layer.geom for layer in layers_of(graph, cfg)], cfg)
            artifact.meta["tuning_log"] = {"path": str(tuning_log), "tuned_layers": sorted(tuned)}
        generate(artifact, latency_hiding=latency_hiding, schedules=schedules, tuned=tuned)
    return artifact
