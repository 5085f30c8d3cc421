"""Calibration: the ranges of every float tensor on sample inputs, for post-training quantization.

Calibration data comes as a mapping ``input name -> array`` (or the path of an ``.npz`` file), a list of
such mappings (one per batch), or a single array for a single-input model. An array may hold one batch
(the input's shape), a stack of batches (one more leading axis), or samples along the batch axis (a
multiple of the input's batch size); each is split into batches of the model's input shape. Only a
stack of batches can fix a dynamic batch dimension (to its batches' size); samples along the batch axis
leave it at 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from weft.core.errors import QuantizationError
from weft.core.ir import Graph, Node
from weft.core.reference import run_reference

__all__ = ["DEFAULT_SAMPLES", "calibrate", "load_calibration", "random_batches", "sample_shapes", "split_batches"]

#: Batches of seeded random inputs used when no calibration data is given.
DEFAULT_SAMPLES = 4


def load_calibration(path: str | Path) -> dict[str, np.ndarray]:
    """An .npz file of calibration inputs (one array per model input, named like it), without pickle."""
    path = Path(path)
    if not path.is_file():
        raise QuantizationError(f"{path}: no such calibration file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (ValueError, OSError, AttributeError) as err:
        raise QuantizationError(f"{path}: not a readable .npz file of arrays ({err})") from None


def _as_mappings(data: Any, names: Sequence[str]) -> list[Mapping[str, Any]]:
    if isinstance(data, np.ndarray):
        if len(names) != 1:
            raise QuantizationError(f"a single calibration array needs a single-input model; inputs are "
                                    f"{', '.join(names)} (pass a mapping name -> array)")
        return [{names[0]: data}]
    if isinstance(data, Mapping) or hasattr(data, "files"):  # dict, or numpy's NpzFile
        keys = list(data.files) if hasattr(data, "files") else list(data)
        return [{k: data[k] for k in keys}]
    if isinstance(data, (list, tuple)):
        out: list[Mapping[str, Any]] = []
        for item in data:
            out += _as_mappings(item, names)
        return out
    raise QuantizationError(f"calibration data of type {type(data).__name__} is not understood: give a mapping "
                            "input name -> array, a list of them, or an array")


def sample_shapes(data: Any, ranks: Mapping[str, tuple[int, Sequence[Any]]]) -> dict[str, tuple[int, ...]]:
    """The batch shape the calibration data implies for each input, before the model's shapes are fixed:
    `ranks` maps input name -> (rank, declared dims) where declared dims are ints or None/symbols."""
    shapes: dict[str, tuple[int, ...]] = {}
    for mapping in _as_mappings(data, list(ranks)):
        for name, array in mapping.items():
            if name not in ranks or name in shapes:
                continue
            shape = np.shape(array)
            rank, dims = ranks[name]
            if len(shape) == rank + 1:  # a stack of batches: each has the model's batch shape
                shapes[name] = tuple(shape[1:])
            elif len(shape) == rank and rank:  # samples along the batch axis: the batch stays as declared, or 1
                shapes[name] = (dims[0] if isinstance(dims[0], int) else 1, *shape[1:])
    return shapes


def split_batches(data: Any, graph: Graph) -> list[dict[str, np.ndarray]]:
    """Calibration data as a list of feeds, one per batch of the graph's input shapes."""
    names = list(graph.inputs)
    per_input: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for mapping in _as_mappings(data, names):
        for name, array in mapping.items():
            if name not in per_input:
                raise QuantizationError(f"calibration data names '{name}', which is not a model input "
                                        f"(inputs: {', '.join(names)})")
            shape = graph.values[name].shape
            array = np.asarray(array)
            if not np.issubdtype(array.dtype, np.floating):
                raise QuantizationError(f"calibration data for input '{name}' is {array.dtype}, not float")
            if tuple(array.shape) == shape:
                per_input[name].append(array)
            elif tuple(array.shape[1:]) == shape:
                per_input[name] += list(array)
            elif array.ndim == len(shape) and tuple(array.shape[1:]) == shape[1:] and array.shape[0] % shape[0] == 0:  # type: ignore[index]
                per_input[name] += np.split(array, array.shape[0] // shape[0])  # type: ignore[index]
            else:
                raise QuantizationError(f"calibration data for input '{name}' has shape {list(array.shape)}, which is "
                                        f"neither the input shape {list(shape)} nor a stack of it")  # type: ignore[arg-type]
    counts = {n: len(v) for n, v in per_input.items()}
    if any(c == 0 for c in counts.values()):
        missing = [n for n, c in counts.items() if c == 0]
        raise QuantizationError(f"calibration data has nothing for input '{missing[0]}'")
    if len(set(counts.values())) != 1:
        raise QuantizationError(f"calibration inputs have different batch counts: {counts}")
    batches = [{n: per_input[n][k].astype(np.float32) for n in names} for k in range(next(iter(counts.values())))]
    for k, batch in enumerate(batches):
        for name, array in batch.items():
            if not np.all(np.isfinite(array)):
                raise QuantizationError(f"calibration batch {k} of input '{name}' holds NaN or infinity")
    return batches


def random_batches(graph: Graph, count: int = DEFAULT_SAMPLES, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Seeded standard-normal inputs: the documented default when no calibration data is given."""
    rng = np.random.default_rng(seed)
    return [{n: rng.standard_normal(graph.values[n].shape).astype(np.float32) for n in graph.inputs}  # type: ignore[arg-type]
            for _ in range(count)]


def calibrate(graph: Graph, batches: Sequence[Mapping[str, np.ndarray]]) -> Graph:
    """Run the float graph on each batch and record in ``meta["calibration"]``: the largest magnitude of
    every float tensor (``absmax``), and per output channel of every FusedConv its conv + bias stage
    (``acc_absmax``, used only when a worst-case accumulator bound would not fit)."""
    absmax: dict[str, float] = {}
    acc_absmax: dict[str, np.ndarray] = {}

    def observe(node: Node, stage: str, name: str, array: np.ndarray) -> None:
        if stage == "acc":
            per_channel = np.abs(array).max(axis=tuple(a for a in range(array.ndim) if a != 1))
            prev = acc_absmax.get(node.name)
            acc_absmax[node.name] = per_channel if prev is None else np.maximum(prev, per_channel)
            return
        if not np.issubdtype(array.dtype, np.floating):
            return
        if not np.all(np.isfinite(array)):
            raise QuantizationError("produces NaN or infinity on the calibration data", node=node.name, op=node.op)
        absmax[name] = max(absmax.get(name, 0.0), float(np.abs(array).max(initial=0.0)))

    if not batches:
        raise QuantizationError("calibration needs at least one batch")
    for batch in batches:
        for name, array in batch.items():
            absmax[name] = max(absmax.get(name, 0.0), float(np.abs(array).max(initial=0.0)))
        run_reference(graph, batch, observer=observe)
    g = graph.copy()
    g.meta["calibration"] = {
        "batches": len(batches),
        "absmax": absmax,
        "acc_absmax": {k: tuple(float(x) for x in v) for k, v in acc_absmax.items()},
    }
    return g
