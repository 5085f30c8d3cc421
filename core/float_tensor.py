"""Float layout ops: Transpose, Split, Expand, Tile, Range, GatherElements and Resize (nearest, linear and cubic, with
antialiasing).

Resize is in its opset-11+ form (inputs X, roi, scales, sizes); the importer rewrites Upsample and the
opset-10 Resize into it with ``coordinate_transformation_mode="asymmetric"`` and ``nearest_mode="legacy"``,
the rounding onnxruntime applies to those older forms (truncate when upsampling, round up when
downsampling).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from weft.core.errors import UnsupportedError
from weft.core.float_base import Known, OpDef, Result, by_running, err, need, shape_of
from weft.core.ir import Node, Value

__all__ = ["RESIZE_MODES", "TENSOR_OPS", "split_sizes"]

RESIZE_MODES = ("nearest", "linear", "cubic")
_TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
               "tf_half_pixel_for_nn")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "legacy")


def _run_transpose(node: Node, a: list[Any]) -> list[np.ndarray]:
    perm = node.attrs.get("perm")
    return [np.ascontiguousarray(np.transpose(a[0], None if perm is None else tuple(perm)))]


def split_sizes(node: Node, dim: int, split: np.ndarray | None) -> list[int]:
    """The piece sizes of a Split along an axis of extent `dim`: given, or `num_outputs` pieces of
    ceil(dim / n) with a smaller last one (opset 18), or equal pieces (older opsets)."""
    count = len(node.outputs)
    if split is not None and np.asarray(split).size:
        sizes = [int(s) for s in np.asarray(split).reshape(-1)]
        if len(sizes) != count or sum(sizes) != dim or min(sizes) < 0:
            raise err(node, f"split {sizes} does not cut an axis of {dim} into {count} outputs")
        return sizes
    chunk = -(-dim // count)
    if "num_outputs" not in node.attrs and dim % count:
        raise err(node, f"an axis of {dim} does not split evenly into {count} outputs")
    return [max(min(chunk, dim - k * chunk), 0) for k in range(count)]


def _run_split(node: Node, a: list[Any]) -> list[np.ndarray]:
    x = a[0]
    axis = int(node.attrs.get("axis", 0)) % x.ndim
    sizes = split_sizes(node, x.shape[axis], a[1] if len(a) > 1 else None)
    return [np.ascontiguousarray(p) for p in np.split(x, np.cumsum(sizes)[:-1], axis=axis)]


def _run_expand(node: Node, a: list[Any]) -> list[np.ndarray]:
    x, shape = a[0], tuple(int(d) for d in a[1].reshape(-1))
    try:
        out = np.broadcast_shapes(x.shape, shape)
    except ValueError:
        raise err(node, f"cannot expand {list(x.shape)} to {list(shape)}") from None
    return [np.ascontiguousarray(np.broadcast_to(x, out))]


def _run_tile(node: Node, a: list[Any]) -> list[np.ndarray]:
    reps = [int(r) for r in a[1].reshape(-1)]
    if len(reps) != a[0].ndim:
        raise err(node, f"{len(reps)} repeats for a rank-{a[0].ndim} input")
    return [np.tile(a[0], reps)]


# ---- Resize ------------------------------------------------------------------------------------------


def _present(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None or np.asarray(a).size == 0 else np.asarray(a)


def _resize_plan(node: Node, shape: tuple[int, ...], scales: np.ndarray | None,
                 sizes: np.ndarray | None) -> tuple[tuple[int, ...], list[float]]:
    """(output shape, scale per axis) from the scales or sizes input (over the `axes` attribute if any)."""
    rank = len(shape)
    axes = [int(a) % rank for a in node.attrs.get("axes", range(rank))]
    out, factors = list(shape), [1.0] * rank
    policy = node.attrs.get("keep_aspect_ratio_policy", "stretch")
    if sizes is not None and policy in ("not_larger", "not_smaller"):  # one scale for every listed axis
        ratios = [int(s) / shape[a] for a, s in zip(axes, sizes.reshape(-1), strict=True)]
        scale = min(ratios) if policy == "not_larger" else max(ratios)
        for a in axes:
            out[a], factors[a] = int(np.round(shape[a] * scale)), scale
    elif sizes is not None:
        if policy != "stretch":
            raise UnsupportedError(f"keep_aspect_ratio_policy '{policy}' is not supported", node=node.name,
                                   op=node.op)
        for a, s in zip(axes, sizes.reshape(-1), strict=True):
            out[a], factors[a] = int(s), int(s) / shape[a]
    elif scales is not None:
        for a, s in zip(axes, scales.reshape(-1), strict=True):
            out[a], factors[a] = int(np.floor(shape[a] * float(s))), float(s)
    else:
        raise err(node, "needs scales or sizes")
    if min(out) < 1:
        raise err(node, f"the output shape {out} is empty")
    return tuple(out), factors


def _source_coords(node: Node, size: int, out: int, scale: float) -> np.ndarray:
    mode = node.attrs.get("coordinate_transformation_mode", "half_pixel")
    i = np.arange(out, dtype=np.float64)
    if mode == "align_corners":
        return np.zeros(out) if out == 1 else i * (size - 1) / (out - 1)
    if mode == "asymmetric":
        return i / scale
    if mode == "tf_half_pixel_for_nn":
        return (i + 0.5) / scale
    if mode == "pytorch_half_pixel" and out == 1:
        return np.zeros(out)
    if mode == "half_pixel_symmetric":  # centre the floor()ed output on the input
        offset = size / 2 * (1 - out / (scale * size))
        return offset + (i + 0.5) / scale - 0.5
    return (i + 0.5) / scale - 0.5


def _nearest_index(node: Node, x: np.ndarray, scale: float) -> np.ndarray:
    rule = node.attrs.get("nearest_mode", "round_prefer_floor")
    if rule == "legacy":
        rule = "ceil" if scale < 1 else "floor"
    pick = {"round_prefer_floor": lambda v: np.ceil(v - 0.5), "round_prefer_ceil": lambda v: np.floor(v + 0.5),
            "floor": np.floor, "ceil": np.ceil}[rule]
    return pick(x).astype(np.int64)


def _resize_axis(node: Node, x: np.ndarray, axis: int, out: int, scale: float) -> np.ndarray:
    size = x.shape[axis]
    coords = _source_coords(node, size, out, scale)
    if node.attrs.get("mode", "nearest") == "nearest":
        return np.take(x, np.clip(_nearest_index(node, coords, scale), 0, size - 1), axis=axis)
    if node.attrs.get("mode") == "cubic" or (node.attrs.get("antialias", 0) and scale < 1):
        return _filter_axis(node, x, axis, coords, scale)
    coords = np.clip(coords, 0, size - 1)
    lo = np.floor(coords).astype(np.int64)
    hi = np.minimum(lo + 1, size - 1)
    w = (coords - lo).reshape([-1 if k == axis else 1 for k in range(x.ndim)])
    return np.take(x, lo, axis=axis) * (1 - w) + np.take(x, hi, axis=axis) * w


def _keys(dist: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel at distances `dist` (0 from 2 on)."""
    d = np.abs(dist)
    near = (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1
    far = a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _filter_axis(node: Node, x: np.ndarray, axis: int, coords: np.ndarray, scale: float) -> np.ndarray:
    """Cubic, and antialiased (downsampling) linear or cubic: a weighted sum of the taps around each source
    coordinate. Antialiasing stretches the kernel by 1/scale (onnx's reference). Taps past the edges repeat
    the edge, or with exclude_outside get weight 0 (the others renormalized)."""
    size = x.shape[axis]
    cubic = node.attrs.get("mode") == "cubic"
    stretch = min(scale, 1.0) if node.attrs.get("antialias", 0) else 1.0
    reach = 2 if cubic else 1
    first = int(np.floor(-reach / stretch)) + 1
    offsets = np.arange(first, 2 - first)
    # the source coordinate x sits at ratio in (0, 1] past its base tap, so an integer x has its taps to the left
    ratio = coords - np.floor(coords)
    ratio = np.where(ratio == 0, 1.0, ratio)
    base = np.round(coords - ratio).astype(np.int64)
    dist = (offsets[None, :] - ratio[:, None]) * stretch
    weights = _keys(dist, float(node.attrs.get("cubic_coeff_a", -0.75))) if cubic else np.clip(1 - np.abs(dist), 0, 1)
    taps = base[:, None] + offsets[None, :]
    if node.attrs.get("exclude_outside", 0):
        weights = np.where((taps >= 0) & (taps < size), weights, 0)
    weights = weights / weights.sum(axis=1, keepdims=True)
    taps = np.clip(taps, 0, size - 1)
    y = np.einsum("...ok,ok->...o", np.moveaxis(x, axis, -1)[..., taps], weights)
    return np.moveaxis(y, -1, axis)


def _check_resize(node: Node) -> None:
    checks = (("mode", RESIZE_MODES), ("coordinate_transformation_mode", _TRANSFORMS), ("nearest_mode", _NEAREST))
    for key, allowed in checks:
        value = node.attrs.get(key)
        if value is not None and value not in allowed:
            raise UnsupportedError(f"{key} '{value}' is not supported (supported: {', '.join(allowed)})",
                                   node=node.name, op=node.op)


def _run_resize(node: Node, a: list[Any]) -> list[np.ndarray]:
    _check_resize(node)
    x = a[0]
    extra = [_present(a[k]) if len(a) > k else None for k in (2, 3)]
    shape, factors = _resize_plan(node, x.shape, *extra)
    y = x.astype(np.float64)
    for axis, (size, out) in enumerate(zip(x.shape, shape, strict=True)):
        if size != out or factors[axis] != 1.0:
            y = _resize_axis(node, y, axis, out, factors[axis])
    return [y.astype(x.dtype)]


def _infer_resize(node: Node, ins: list[Value | None], known: Known) -> Result:
    _check_resize(node)
    x = shape_of(node, ins[0], "the input")
    extra = [_present(need(node, known, k, "scales" if k == 2 else "sizes")) if len(ins) > k and ins[k] is not None
             else None for k in (2, 3)]
    return [(_resize_plan(node, x, *extra)[0], ins[0].dtype)]  # type: ignore[union-attr]


def _run_gather_elements(node: Node, a: list[Any]) -> list[np.ndarray]:
    x, idx = a
    axis = int(node.attrs.get("axis", 0)) % x.ndim
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return [np.take_along_axis(x, idx.astype(np.int64), axis=axis)]


def _run_range(node: Node, a: list[Any]) -> list[np.ndarray]:
    start, limit, delta = (x.reshape(()) for x in a)
    if delta == 0:
        raise err(node, "delta is 0")
    count = max(int(np.ceil((limit - start) / delta)), 0)
    return [(start + np.arange(count, dtype=np.result_type(start, delta)) * delta).astype(start.dtype)]


TENSOR_OPS: dict[str, OpDef] = {
    "Range": OpDef(by_running(_run_range, (0, 1, 2)), _run_range),
    "GatherElements": OpDef(by_running(_run_gather_elements), _run_gather_elements),
    "Transpose": OpDef(by_running(_run_transpose), _run_transpose),
    "Split": OpDef(by_running(_run_split, (1,)), _run_split),
    "Expand": OpDef(by_running(_run_expand, (1,)), _run_expand),
    "Tile": OpDef(by_running(_run_tile, (1,)), _run_tile),
    "Resize": OpDef(_infer_resize, _run_resize),
}
