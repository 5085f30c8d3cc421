"""The shape of a .weft manifest, checked on load before any array is allocated.

A manifest is data from a file: every key the loader, the graph reader and the accelerator runtime read
is checked here for presence, type and range, names are kept to plain path components, and sizes are
bounded (DRAM to the 32-bit AXI address space, every array to :data:`MAX_ELEMENTS`), so a corrupt or
hostile artifact ends in one :class:`~weft.core.artifact.ArtifactError` naming the key instead of a
traceback or a huge allocation deep in the runtime.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from weft.core.ir import DTYPES
from weft.core.limits import MAX_ELEMENTS
from weft.errors import WeftError
from weft.isa.constants import AXI_ADDR_BITS

__all__ = ["ACCEL_SECTION", "ACCEL_VERSION", "MAX_DRAM_BYTES", "MAX_TOTAL_ELEMENTS", "ArtifactError", "check_manifest",
           "check_shape", "member_name_ok"]

#: The name of the section that holds the accelerator's DRAM image and programs (:mod:`weft.core.accel_section`).
ACCEL_SECTION = "accel"
#: The layout of that section's meta this weft writes and reads; a section of another version loads, unread.
ACCEL_VERSION = 1
#: The accelerator addresses DRAM over 32-bit AXI.
MAX_DRAM_BYTES = 1 << AXI_ADDR_BITS
#: The most elements all of a graph's values together may have.
MAX_TOTAL_ELEMENTS = 2**33

_COMPONENT = re.compile(r"^[A-Za-z0-9_.-]+$")
_SECTION = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
#: Node attributes the kernels divide by, loop over or allocate with: (minimum, maximum, list length on
#: weft's own q* ops, where None means a single int). ONNX host ops keep their own ranks (1-D pools).
_INT_ATTRS: dict[str, tuple[int, int, int | None]] = {
    "kernel": (1, 2**16, 2), "strides": (1, 2**16, 2), "dilations": (1, 2**16, 2), "pads": (0, 2**16, 4),
    "channels": (1, 2**31, 2), "group": (1, 2**31, None), "bits": (1, 32, None),
}

#: qim2col's constant channels fill the spare channels of one channel block at most.
_MAX_CONSTANTS = 1024


class ArtifactError(WeftError):
    """An artifact that cannot be read: not a weft artifact, another format version, or corrupt."""


def member_name_ok(name: str) -> bool:
    """A relative path of plain components: no empty, ``.`` or ``..`` part, no absolute path."""
    parts = name.split("/")
    return all(_COMPONENT.match(p) and p not in (".", "..") for p in parts)


def _fail(what: str, key: str, message: str, label: str = "manifest key") -> ArtifactError:
    return ArtifactError(f"{what}: {label} '{key}' {message}")


def _get(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str, where: str) -> Any:
    if key not in data:
        raise _fail(what, f"{where}{key}", "is missing")
    value = data[key]
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _fail(what, f"{where}{key}", f"must be of type {names}, got {type(value).__name__}")
    return value


def _int(data: Mapping[str, Any], key: str, what: str, where: str, low: int = 0, high: int | None = None) -> int:
    value = _get(data, key, int, what, where)
    if value < low or (high is not None and value > high):
        raise _fail(what, f"{where}{key}", f"is {value}, outside {low}..{high if high is not None else 'inf'}")
    return value


def _strings(value: Any, what: str, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(what, key, "must be a list of strings")
    return value


def check_shape(shape: Any, what: str, key: str, label: str = "manifest key") -> int:
    """The element count of `shape` (a list of non-negative ints, at most MAX_ELEMENTS elements); the
    error names `label` `key` of `what`."""
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                      for d in shape):
        raise _fail(what, key, f"must be a list of integers, got {shape!r:.60}", label)
    if any(d < 0 for d in shape):
        raise _fail(what, key, f"has a negative dimension {list(shape)}", label)
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise _fail(what, key, f"{list(shape)} has {count} elements, more than the limit {MAX_ELEMENTS}", label)
    return count


def _is_object(value: Any) -> bool:
    """A JSON object that the graph reader keeps as a dict (``{"$array": ...}`` and ``{"$float": ...}``
    become an array and a float)."""
    return isinstance(value, dict) and set(value) not in ({"$array"}, {"$float"})


def _check_attrs(attrs: Any, op: str, what: str, key: str) -> None:
    if not _is_object(attrs):
        raise _fail(what, key, "must be an object")
    ours = op.startswith("q")
    for name, (low, high, length) in _INT_ATTRS.items():
        if name not in attrs:
            continue
        value = attrs[name]
        items = [value] if length is None else value if isinstance(value, list) and (value or not ours) else None
        if items is None or (ours and length is not None and len(items) != length) or not all(
                isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in items):
            shape = "an integer" if length is None else f"a list of {length if ours else 'some'} integers"
            raise _fail(what, f"{key}.{name}", f"must be {shape} within {low}..{high}, got {value!r:.60}")
    if op in ("quantize", "dequantize"):
        scale = attrs.get("scale")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
            raise _fail(what, f"{key}.scale", f"must be a positive finite number, got {scale!r:.60}")
    if op == "qim2col":  # the constant channels qim2col writes after each window (weft.compiler.im2col)
        constants = attrs.get("constants", [])
        if not isinstance(constants, list) or len(constants) > _MAX_CONSTANTS or not all(
                isinstance(v, int) and not isinstance(v, bool) and -(1 << 15) <= v < (1 << 15) for v in constants):
            raise _fail(what, f"{key}.constants", f"must be at most {_MAX_CONSTANTS} 16-bit integers, "
                                                  f"got {constants!r:.60}")
    if "epilogue" in attrs:
        steps = attrs["epilogue"]
        if not isinstance(steps, list) or not all(isinstance(step, list) and step and isinstance(step[0], str)
                                                  for step in steps):
            raise _fail(what, f"{key}.epilogue", f"must be a list of [op, operand] steps, got {steps!r:.60}")


def _check_graph(graph: Any, what: str) -> None:
    if not isinstance(graph, dict):
        raise _fail(what, "graph", "must be an object")
    _get(graph, "name", str, what, "graph.")
    values = _get(graph, "values", list, what, "graph.")
    names: set[str] = set()
    total = 0
    for k, v in enumerate(values):
        where = f"graph.values[{k}]."
        if not isinstance(v, dict):
            raise _fail(what, where[:-1], "must be an object")
        names.add(_get(v, "name", str, what, where))
        dtype = _get(v, "dtype", str, what, where)
        if dtype not in DTYPES:
            raise _fail(what, f"{where}dtype", f"is '{dtype:.40}', not one of {', '.join(DTYPES)}")
        shape = _get(v, "shape", list, what, where)
        total += check_shape(shape, what, f"{where}shape")
        if v.get("logical") is not None:
            check_shape(v["logical"], what, f"{where}logical")
            # packing divides by the block dimensions: (batch, channel blocks, H, W, batch block, channel block)
            if len(shape) != 6 or 0 in shape or 0 in v["logical"]:
                raise _fail(what, f"{where}shape", f"of a packed value must be 6 dimensions >= 1, got {shape}")
        if "scale" in v and v["scale"] is not None:
            _get(v, "scale", (int, float), what, where)
    if total > MAX_TOTAL_ELEMENTS:
        raise _fail(what, "graph.values", f"hold {total} elements, more than the limit {MAX_TOTAL_ELEMENTS}")
    shapes = {v["name"]: v["shape"] for v in values}
    for key in ("inputs", "outputs"):
        for name in _strings(_get(graph, key, list, what, "graph."), what, f"graph.{key}"):
            if name not in names:
                raise _fail(what, f"graph.{key}", f"names '{name:.60}', which is not a value of the graph")
            if 0 in shapes[name]:
                raise _fail(what, f"graph.{key}", f"'{name:.60}' has a zero dimension {shapes[name]}")
    constants = _get(graph, "constants", dict, what, "graph.")
    for name, ref in constants.items():
        if not isinstance(ref, str):
            raise _fail(what, f"graph.constants.{name:.60}", "must be a member name")
    for k, n in enumerate(_get(graph, "nodes", list, what, "graph.")):
        where = f"graph.nodes[{k}]."
        if not isinstance(n, dict):
            raise _fail(what, where[:-1], "must be an object")
        _get(n, "name", str, what, where)
        _get(n, "op", str, what, where)
        for key in ("inputs", "outputs"):
            io = _strings(_get(n, key, list, what, where), what, f"{where}{key}")
            # ONNX host ops may skip optional inputs (""); weft's own q* ops never do
            if not io or not io[0] or (n["op"].startswith("q") and not all(io)):
                raise _fail(what, f"{where}{key}", f"must name its values, got {io!r:.60}")
            for name in io:
                if name and name not in names:
                    raise _fail(what, f"{where}{key}", f"names '{name:.60}', which is not a value of the graph")
        _check_attrs(_get(n, "attrs", dict, what, where), n["op"], what, f"{where}attrs")
    if "meta" in graph and not _is_object(graph["meta"]):
        raise _fail(what, "graph.meta", "must be an object")


def _check_accel(meta: dict[str, Any], what: str) -> None:
    """The ``accel`` section's meta as :mod:`weft.core.accel_section` reads it."""
    where = f"sections.{ACCEL_SECTION}.meta."
    if _get(meta, "version", int, what, where) != ACCEL_VERSION:
        return  # the device names the version it reads; nothing else is known about other versions
    dram = _int(meta, "dram_bytes", what, where, 1, MAX_DRAM_BYTES)
    _int(meta, "const_base", what, where, 0, dram)
    values = _get(meta, "values", dict, what, where)
    for name, info in values.items():
        at = f"{where}values.{name:.60}."
        if not isinstance(info, dict):
            raise _fail(what, at[:-1], "must be an object")
        addr = _int(info, "addr", what, at, 0, dram)
        _int(info, "bytes", what, at, 0, dram - addr)
        check_shape(_get(info, "shape", list, what, at), what, f"{at}shape")
        if _get(info, "dtype", str, what, at) not in DTYPES:
            raise _fail(what, f"{at}dtype", f"is '{info['dtype']:.40}', not one of {', '.join(DTYPES)}")
    for k, layer in enumerate(_get(meta, "layers", list, what, where)):
        at = f"{where}layers[{k}]."
        if not isinstance(layer, dict):
            raise _fail(what, at[:-1], "must be an object")
        _get(layer, "name", str, what, at)
        addr = _int(layer, "insn_addr", what, at, 0, dram)
        size = _int(layer, "insn_bytes", what, at, 1, dram)
        count = _int(layer, "insn_count", what, at, 0, dram)
        if addr + count * size > dram:
            raise _fail(what, f"{at}insn_count", f"puts the program past dram_bytes ({addr} + {count} x {size})")
        for name in _strings(_get(layer, "inputs", list, what, at), what, f"{at}inputs"):
            if name not in values:
                raise _fail(what, f"{at}inputs", f"names '{name:.60}', which has no DRAM buffer in 'values'")
        _get(layer, "schedule", dict, what, at)
    _check_chains(meta["layers"], dram, what, where)


def _check_chains(layers: list[dict[str, Any]], dram: int, what: str, where: str) -> None:
    """A chain's program (``chain`` on its first layer) and the ``chain_head`` of each layer after it: the
    runtime runs the program in the layers' place, and splits its figures at ``ends``."""
    names = [str(layer["name"]) for layer in layers]
    heads: dict[str, str] = {}
    for k, layer in enumerate(layers):
        if "chain" not in layer:
            continue
        at = f"{where}layers[{k}].chain."
        chain = _get(layer, "chain", dict, what, f"{where}layers[{k}].")
        members = _strings(_get(chain, "layers", list, what, at), what, f"{at}layers")
        if len(members) < 2 or members[0] != layer["name"] or members != names[k:k + len(members)]:
            raise _fail(what, f"{at}layers", "must name this layer and the layers after it, in order")
        addr = _int(chain, "insn_addr", what, at, 0, dram)
        count = _int(chain, "insn_count", what, at, 1, dram)
        if addr + count * int(layer["insn_bytes"]) > dram:
            raise _fail(what, f"{at}insn_count", f"puts the program past dram_bytes ({addr} + {count} x ...)")
        ends = _get(chain, "ends", list, what, at)
        if len(ends) != len(members) or not all(isinstance(e, int) and not isinstance(e, bool) for e in ends) \
                or any(b <= a for a, b in itertools.pairwise([0, *ends])) or ends[-1] != count:
            raise _fail(what, f"{at}ends", "must be increasing instruction counts, one per layer, the last insn_count")
        heads.update({m: str(layer["name"]) for m in members[1:]})
    for k, layer in enumerate(layers):
        if heads.get(str(layer["name"])) != layer.get("chain_head"):
            raise _fail(what, f"{where}layers[{k}].chain_head",
                        f"must be {heads.get(str(layer['name']))!r}: the chain that names the layer")


#: Checks of known sections' meta; a section this weft does not know is kept as it is.
SECTION_CHECKS: dict[str, Callable[[dict[str, Any], str], None]] = {ACCEL_SECTION: _check_accel}


def check_manifest(manifest: dict[str, Any], what: str) -> None:
    """Raise ArtifactError naming the first key of `manifest` that is missing, mistyped or out of range."""
    members = _get(manifest, "members", dict, what, "")
    for name, digest in members.items():
        if not member_name_ok(name):
            raise _fail(what, "members", f"has the unsafe member name '{name:.80}'")
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            raise _fail(what, f"members.{name}", "must be a SHA-256 hex digest")
    _get(manifest, "target", str, what, "")
    _get(manifest, "config", dict, what, "")
    _get(manifest, "config_hash", str, what, "")
    if not isinstance(manifest.get("meta", {}), dict):
        raise _fail(what, "meta", "must be an object")
    sections = manifest.get("sections", {})
    if not isinstance(sections, dict):
        raise _fail(what, "sections", "must be an object")
    for name, info in sections.items():
        if not _SECTION.match(name):
            raise _fail(what, "sections", f"has the unsafe section name '{name:.80}'")
        if not isinstance(info, dict):
            raise _fail(what, f"sections.{name}", "must be an object")
        meta = _get(info, "meta", dict, what, f"sections.{name}.")
        for fname in _strings(_get(info, "files", list, what, f"sections.{name}."), what, f"sections.{name}.files"):
            if not _SECTION.match(fname) or f"sections/{name}/{fname}" not in members:
                raise _fail(what, f"sections.{name}.files", f"names '{fname:.80}', which is not a member")
        check = SECTION_CHECKS.get(name)
        if check is not None:
            check(meta, what)
    _check_graph(manifest.get("graph"), what)
