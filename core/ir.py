"""The compiler's graph IR: a small typed dataflow graph that imports with numpy alone.

A :class:`Graph` holds nodes in execution order, named values with their shape and dtype, and constants
as numpy arrays. It is the one representation every stage shares: the ONNX importer produces it, the
passes rewrite it, the artifact stores it (as JSON plus .npy arrays) and the runtime interprets it.

Quantized tensors carry two more facts on their :class:`Value`: ``scale`` (real = scale * integer) and,
for activations in the accelerator's packed layout, ``logical`` (the NCHW or NK shape they stand for,
while ``shape`` is the packed array's shape).

Node attributes are plain data: ints, floats, strings, bools, None, tuples, dicts and numpy arrays. Lists
become tuples on construction so that a graph compares equal to itself after a JSON round trip.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from weft.core.errors import GraphError

__all__ = [
    "ACCEL_OPS", "DTYPES", "Graph", "Node", "Value", "act_dtype_name", "attr_from_json", "attr_to_json",
    "graph_from_dict", "graph_to_dict", "int_dtype_name", "numpy_dtype", "onnx_type_string",
]

#: Integer layers the accelerator runs (GEMM and ALU work); the back end lowers exactly these, and a run
#: sends them to the device.
ACCEL_OPS = frozenset({"qconv2d", "qmaxpool", "qavgpool", "qalu"})

#: IR dtype name -> numpy storage dtype. Sub-byte integers are stored one per int8 element.
DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "int2": np.dtype(np.int8),
    "int4": np.dtype(np.int8),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}

_ONNX_TYPES = {
    "float32": "tensor(float)", "float64": "tensor(double)", "int8": "tensor(int8)", "uint8": "tensor(uint8)",
    "int16": "tensor(int16)", "int32": "tensor(int32)", "int64": "tensor(int64)", "bool": "tensor(bool)",
}


def int_dtype_name(bits: int) -> str:
    """The IR dtype of `bits`-wide signed integers: int2/int4 (stored in int8), int8, int16 or int32."""
    if bits in (2, 4, 8, 16, 32):
        return f"int{bits}"
    raise GraphError(f"no integer dtype of {bits} bits")


def act_dtype_name(bits: int) -> str:
    """The storage dtype of `bits`-wide activations: whole bytes (int8 up to 8 bits, int16 up to 16)."""
    return "int8" if bits <= 8 else "int16" if bits <= 16 else "int32"


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy storage dtype of an IR dtype name."""
    try:
        return DTYPES[dtype]
    except KeyError:
        raise GraphError(f"unknown dtype '{dtype}' (known: {', '.join(DTYPES)})") from None


def dtype_name(array: np.ndarray) -> str:
    """The IR dtype name of a numpy array (its storage type)."""
    for name, dt in DTYPES.items():
        if dt == array.dtype and name not in ("int2", "int4"):
            return name
    raise GraphError(f"arrays of numpy dtype {array.dtype} have no IR dtype")


def onnx_type_string(dtype: str) -> str:
    """The onnxruntime-style type string ("tensor(float)") of an IR dtype."""
    return _ONNX_TYPES.get(dtype, f"tensor({dtype})")


@dataclass
class Value:
    """A named tensor: its shape and dtype, plus quantization facts when it holds integers."""

    name: str
    shape: tuple[int, ...] | None = None
    dtype: str = "float32"
    #: Quantized tensors: real value = scale * stored integer (symmetric, no zero point).
    scale: float | None = None
    #: Packed activations: the logical NCHW (or NK) shape; ``shape`` is then the packed array's shape.
    logical: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.shape is not None:
            self.shape = tuple(int(d) for d in self.shape)
        if self.logical is not None:
            self.logical = tuple(int(d) for d in self.logical)
        if self.scale is not None:
            self.scale = float(self.scale)

    @property
    def packed(self) -> bool:
        return self.logical is not None

    @property
    def logical_shape(self) -> tuple[int, ...] | None:
        """The shape the tensor stands for: ``logical`` when packed, else ``shape``."""
        return self.logical if self.logical is not None else self.shape


def _norm(value: Any) -> Any:
    """Attribute values as plain, comparable data (lists -> tuples, numpy scalars -> Python)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_norm(v) for v in value)
    if isinstance(value, dict):
        return {str(k): _norm(v) for k, v in value.items()}
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if value is None or isinstance(value, str):
        return value
    raise GraphError(f"attribute value of type {type(value).__name__} is not plain data")


@dataclass
class Node:
    """One operation: ``op`` reads ``inputs`` (value names; "" for an absent optional input) and
    defines ``outputs``. ``name`` is unique in its graph and is how errors and stats refer to it."""

    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        self.inputs = list(self.inputs)
        self.outputs = list(self.outputs)
        self.attrs = {str(k): _norm(v) for k, v in self.attrs.items()}

    def copy(self) -> Node:
        return Node(self.op, list(self.inputs), list(self.outputs), dict(self.attrs), self.name)

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.op}, {self.inputs} -> {self.outputs})"


class Graph:
    """Nodes in execution order over named values; constants are read-only numpy arrays."""

    def __init__(self, name: str = "graph", *, inputs: Iterable[str] = (), outputs: Iterable[str] = (),
                 nodes: Iterable[Node] = (), values: dict[str, Value] | None = None,
                 constants: dict[str, np.ndarray] | None = None, meta: dict[str, Any] | None = None):
        self.name = name
        self.inputs: list[str] = list(inputs)
        self.outputs: list[str] = list(outputs)
        self.nodes: list[Node] = list(nodes)
        self.values: dict[str, Value] = dict(values or {})
        self.constants: dict[str, np.ndarray] = {}
        self.meta: dict[str, Any] = dict(meta or {})
        for key, array in (constants or {}).items():
            self.set_constant(key, array)

    # ---- construction ------------------------------------------------------------------------------
    def copy(self) -> Graph:
        """A structural copy: new node and value objects, shared (read-only) constant arrays."""
        g = Graph(self.name, inputs=self.inputs, outputs=self.outputs, nodes=[n.copy() for n in self.nodes],
                  values={k: Value(v.name, v.shape, v.dtype, v.scale, v.logical) for k, v in self.values.items()},
                  meta=_copy_meta(self.meta))
        g.constants = dict(self.constants)
        return g

    def set_constant(self, name: str, array: np.ndarray, dtype: str | None = None) -> str:
        """Define (or replace) constant `name`; its Value records the shape and dtype."""
        array = np.array(array, copy=True) if np.asarray(array).flags.writeable else np.asarray(array)
        array.flags.writeable = False
        self.constants[name] = array
        self.values[name] = Value(name, array.shape, dtype or dtype_name(array))
        return name

    def unique_name(self, base: str) -> str:
        """`base`, or `base` with a numeric suffix, that no value or node uses yet."""
        taken = self._taken()
        if base not in taken:
            return base
        k = 1
        while f"{base}_{k}" in taken:
            k += 1
        return f"{base}_{k}"

    def _taken(self) -> set[str]:
        names = set(self.values) | set(self.constants) | set(self.inputs)
        for n in self.nodes:
            names.add(n.name)
            names.update(n.outputs)
        return names

    # ---- queries -----------------------------------------------------------------------------------
    def is_constant(self, name: str) -> bool:
        return name in self.constants

    def value(self, name: str) -> Value:
        try:
            return self.values[name]
        except KeyError:
            raise GraphError(f"value '{name}' has no type information") from None

    def producers(self) -> dict[str, Node]:
        """value name -> the node that defines it."""
        return {out: n for n in self.nodes for out in n.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        """value name -> nodes that read it, in order."""
        uses: dict[str, list[Node]] = {}
        for n in self.nodes:
            for name in n.inputs:
                if name:
                    uses.setdefault(name, []).append(n)
        return uses

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"graph '{self.name}' has no node '{name}'")

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    # ---- rewriting helpers -------------------------------------------------------------------------
    def replace_uses(self, old: str, new: str) -> None:
        """Make every reader of `old` (nodes and graph outputs) read `new` instead."""
        for n in self.nodes:
            n.inputs = [new if x == old else x for x in n.inputs]
        self.outputs = [new if x == old else x for x in self.outputs]

    def prune_values(self) -> None:
        """Drop Value entries and constants no longer defined or used."""
        used = set(self.inputs) | set(self.outputs)
        for n in self.nodes:
            used.update(x for x in n.inputs if x)
            used.update(x for x in n.outputs if x)
        for name in [c for c in self.constants if c not in used]:
            del self.constants[name]
        for name in [v for v in self.values if v not in used]:
            del self.values[name]

    def check_structure(self) -> None:
        """Raise GraphError unless every value is defined once, before use, and has a type."""
        defined: dict[str, str] = {}
        for name in self.inputs:
            if name in defined:
                raise GraphError(f"graph input '{name}' is listed twice")
            defined[name] = "graph input"
        for name in self.constants:
            if name in defined:
                raise GraphError(f"constant '{name}' is also a graph input")
            defined[name] = "constant"
        names: set[str] = set()
        for n in self.nodes:
            if not n.name or n.name in names:
                raise GraphError(f"node names must be unique and non-empty, got '{n.name}' ({n.op})")
            names.add(n.name)
            for x in n.inputs:
                if x and x not in defined:
                    raise GraphError(f"node '{n.name}' ({n.op}) reads '{x}' before anything defines it")
            for x in n.outputs:
                if not x:
                    continue
                if x in defined:
                    raise GraphError(f"node '{n.name}' ({n.op}) redefines '{x}' ({defined[x]})")
                defined[x] = f"output of node '{n.name}'"
        for x in self.outputs:
            if x not in defined:
                raise GraphError(f"graph output '{x}' is not defined")
        for x in defined:
            value = self.values.get(x)
            if value is None or value.shape is None:
                raise GraphError(f"value '{x}' ({defined[x]}) has no known shape")
            numpy_dtype(value.dtype)
        for x, array in self.constants.items():
            value = self.values[x]
            if tuple(array.shape) != value.shape or array.dtype != numpy_dtype(value.dtype):
                raise GraphError(
                    f"constant '{x}' is {array.dtype}{list(array.shape)} but its value says "
                    f"{value.dtype}{list(value.shape)}"
                )

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.nodes)} nodes, inputs={self.inputs}, outputs={self.outputs})"


def _copy_meta(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
            for k, v in meta.items()}


# ---- JSON form --------------------------------------------------------------------------------------
# Arrays inside attributes and constants are stored elsewhere (the artifact's .npy members); the JSON
# holds references produced by `put` and resolved by `get`.


def attr_to_json(value: Any, put: Callable[[np.ndarray], str]) -> Any:
    if isinstance(value, np.ndarray):
        return {"$array": put(value)}
    if isinstance(value, tuple):
        return [attr_to_json(v, put) for v in value]
    if isinstance(value, dict):
        return {k: attr_to_json(v, put) for k, v in value.items()}
    if isinstance(value, float) and not np.isfinite(value):
        return {"$float": repr(value)}
    return value


def attr_from_json(value: Any, get: Callable[[str], np.ndarray]) -> Any:
    if isinstance(value, list):
        return tuple(attr_from_json(v, get) for v in value)
    if isinstance(value, dict):
        if set(value) == {"$array"}:
            return get(value["$array"])
        if set(value) == {"$float"}:
            return float(value["$float"])
        return {k: attr_from_json(v, get) for k, v in value.items()}
    return value


def graph_to_dict(graph: Graph, put: Callable[[np.ndarray], str]) -> dict[str, Any]:
    """The graph as JSON-ready data; `put` stores an array and returns its reference."""
    return {
        "name": graph.name,
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "values": [
            {"name": v.name, "shape": list(v.shape) if v.shape is not None else None, "dtype": v.dtype,
             **({"scale": v.scale} if v.scale is not None else {}),
             **({"logical": list(v.logical)} if v.logical is not None else {})}
            for v in graph.values.values()
        ],
        "constants": {name: put(array) for name, array in graph.constants.items()},
        "nodes": [
            {"name": n.name, "op": n.op, "inputs": list(n.inputs), "outputs": list(n.outputs),
             "attrs": attr_to_json(n.attrs, put)}
            for n in graph.nodes
        ],
        "meta": attr_to_json(_norm(graph.meta), put),
    }


def graph_from_dict(data: dict[str, Any], get: Callable[[str], np.ndarray]) -> Graph:
    """Rebuild a graph from :func:`graph_to_dict` data; `get` resolves an array reference."""
    values = {}
    for v in data["values"]:
        values[v["name"]] = Value(v["name"], v["shape"], v["dtype"], v.get("scale"), v.get("logical"))
    graph = Graph(
        data["name"], inputs=data["inputs"], outputs=data["outputs"], values=values,
        nodes=[Node(n["op"], n["inputs"], n["outputs"], attr_from_json(n["attrs"], get), n["name"])
               for n in data["nodes"]],
        meta=attr_from_json(data.get("meta", {}), get),
    )
    for name, ref in data["constants"].items():
        array = get(ref)
        dtype = values[name].dtype if name in values else None
        graph.set_constant(name, array, dtype)
    return graph
