"""ONNX -> IR. The only module of weft that imports onnx.

It reads a model (a path, bytes or a ``ModelProto``; tensors kept in an external data file are read from
the model's folder), checks what weft supports, and emits the IR with attributes normalized across opsets
7 to current: optional inputs that older opsets gave as attributes (Clip's bounds, Pad's pads, Slice's
ranges, Squeeze/Unsqueeze/Reduce* axes, Split's sizes, Upsample's scales) become constant inputs,
Softmax and LogSoftmax record whether they have the pre-13 "coerce to 2-D" meaning, Upsample and the
opset-10 Resize become the opset-11 Resize, Dropout becomes Identity (and its mask a constant), Sum
becomes a chain of Add, and Constant nodes become constants.

Dynamic input dimensions are fixed from, in order: ``input_shapes``, the shape of the calibration data
(see :func:`weft.compiler.calibrate.sample_shapes`), and for the leading (batch) dimension only, 1.
Anything else is a :class:`ModelError` naming the input.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from weft.core import qdq
from weft.core.errors import ModelError, UnsupportedError
from weft.core.float_tensor import RESIZE_MODES
from weft.core.ir import Graph, Node, Value
from weft.core.limits import shape_problem
from weft.errors import read_input

__all__ = ["MIN_OPSET", "SUPPORTED_OPS", "declared_inputs", "import_onnx", "load_model"]

MIN_OPSET = 7
MAX_OPSET = onnx.defs.onnx_opset_version()

_ELEM_TYPES = {
    onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64", onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.INT16: "int16", onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64", onnx.TensorProto.BOOL: "bool",
}


def load_model(source: str | Path | bytes | onnx.ModelProto, what: str | None = None,
               folder: str | Path | None = None) -> onnx.ModelProto:
    """Read an ONNX model; unreadable, truncated or empty files raise ModelError naming the file (or
    `what`, for bytes read elsewhere). Tensors kept in external data files are read from the model's
    folder (`folder` for bytes read from a file there); see :func:`_load_external_data`."""
    if isinstance(source, onnx.ModelProto):
        _load_external_data(source, what or "the model", None)
        return source
    if isinstance(source, (bytes, bytearray)):
        what, data = what or "the model bytes", bytes(source)
    else:
        path = Path(source)
        what, folder = str(path), path.parent
        if not path.is_file():
            raise ModelError(f"{path}: no such model file")
        data = read_input(path, "model")
    if not data:
        raise ModelError(f"{what}: the file is empty")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as err:
        raise ModelError(f"{what}: not a readable ONNX model, the file may be truncated or corrupt ({err})") \
            from None
    if not model.HasField("graph") or not model.graph.output:
        raise ModelError(f"{what}: the ONNX model has no graph outputs (is the file truncated?)")
    _load_external_data(model, what, None if folder is None else Path(folder))
    return model


def _external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    tensors = list(model.graph.initializer)
    for node in model.graph.node:
        for attr in node.attribute:
            tensors.extend([attr.t] if attr.HasField("t") else attr.tensors)
    return [t for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL]


def _load_external_data(model: onnx.ModelProto, what: str, folder: Path | None) -> None:
    """Read external tensor data into the tensors, in place: each tensor's location is a file inside
    `folder` (the model's own folder; never a path outside it), at its offset and length."""
    for t in _external_tensors(model):
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        if folder is None:
            raise ModelError(f"{what}: tensor '{t.name}' keeps its data in the external file '{location}', which "
                             "only a model loaded from its path can read; pass the .onnx path instead")
        rel = PurePath(location)
        target = (folder / rel).resolve()
        if not location or rel.is_absolute() or ".." in rel.parts or not target.is_relative_to(folder.resolve()):
            raise ModelError(f"{what}: tensor '{t.name}' names the external data file '{location}', which is not "
                             "inside the model's folder")
        if not target.is_file():
            raise ModelError(f"{what}: the external data file '{folder / rel}' (tensor '{t.name}') is missing")
        offset, length = int(info.get("offset", 0)), info.get("length")
        with target.open("rb") as f:
            f.seek(offset)
            data = f.read(int(length)) if length is not None else f.read()
        if length is not None and len(data) != int(length):
            raise ModelError(f"{what}: the external data file '{folder / rel}' is too short for tensor '{t.name}' "
                             f"({len(data)} of {length} bytes at offset {offset})")
        t.raw_data = data
        t.data_location = onnx.TensorProto.DEFAULT
        del t.external_data[:]


def _opset(model: onnx.ModelProto) -> int:
    versions = {op.domain: op.version for op in model.opset_import}
    version = versions.get("", versions.get("ai.onnx"))
    if version is None:
        raise ModelError("the model imports no version of the default ONNX operator set")
    if version < MIN_OPSET:
        raise UnsupportedError(f"opset {version} is older than {MIN_OPSET}, the oldest weft imports; "
                               "convert the model with onnx.version_converter")
    if version > MAX_OPSET:
        raise UnsupportedError(f"opset {version} is newer than {MAX_OPSET}, the newest this onnx knows")
    return version


def _tensor(t: onnx.TensorProto, what: str) -> np.ndarray:
    if t.data_type not in _ELEM_TYPES:
        raise UnsupportedError(f"{what} '{t.name}' has data type "
                               f"{onnx.TensorProto.DataType.Name(t.data_type)}, which weft does not support")
    try:
        return numpy_helper.to_array(t)
    except (ValueError, TypeError) as err:
        raise ModelError(f"{what} '{t.name}' is corrupt or truncated ({err})") from None


def declared_inputs(model: onnx.ModelProto) -> dict[str, tuple[list[int | str | None], str]]:
    """Graph inputs that are not initializers: name -> (dims as declared (int, symbol or None), dtype)."""
    inits = {t.name for t in model.graph.initializer}
    out: dict[str, tuple[list[int | str | None], str]] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedError(f"graph input '{vi.name}' is not a tensor")
        tt = vi.type.tensor_type
        dtype = _ELEM_TYPES.get(tt.elem_type)
        if dtype is None:
            raise UnsupportedError(f"graph input '{vi.name}' has element type "
                                   f"{onnx.TensorProto.DataType.Name(tt.elem_type)}; weft supports float32 inputs")
        if not tt.HasField("shape"):
            raise ModelError(f"graph input '{vi.name}' has no shape, not even a rank; give it with input_shapes")
        dims: list[int | str | None] = []
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value <= 0:
                raise ModelError(f"graph input '{vi.name}' declares dimension {axis} as {d.dim_value}; every "
                                 "dimension must be at least 1")
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            else:
                dims.append(d.dim_param or None)
        out[vi.name] = (dims, dtype)
    return out


def _fix_shape(name: str, dims: list[int | str | None], given: Sequence[int] | None,
               sample: Sequence[int] | None) -> tuple[int, ...]:
    shape = _fill_shape(name, dims, given, sample)
    problem = shape_problem(shape)
    if problem is not None:
        raise ModelError(f"graph input '{name}' has the shape {list(shape)}: {problem}")
    return shape


def _fill_shape(name: str, dims: list[int | str | None], given: Sequence[int] | None,
                sample: Sequence[int] | None) -> tuple[int, ...]:
    if given is not None:
        given = tuple(int(d) for d in given)
        if len(given) != len(dims) or any(isinstance(d, int) and d != g for d, g in zip(dims, given, strict=True)):
            raise ModelError(f"input_shapes gives input '{name}' the shape {list(given)}, but the model declares "
                             f"{[d if d is not None else '?' for d in dims]}")
        return given
    fixed: list[int] = []
    for axis, d in enumerate(dims):
        if isinstance(d, int):
            fixed.append(d)
        elif sample is not None and len(sample) == len(dims):
            fixed.append(int(sample[axis]))
        elif axis == 0:
            fixed.append(1)  # documented default: a dynamic batch dimension becomes 1
        else:
            label = f"'{d}'" if d else "unnamed"
            raise ModelError(
                f"graph input '{name}' has a dynamic dimension {axis} ({label}) that cannot be fixed; give the "
                f"shape with input_shapes={{'{name}': (...)}} or --input-shape {name}=D0,D1,..."
            )
    return tuple(fixed)


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """Attribute values, with strings decoded (onnx gives bytes)."""
    out = {}
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode() for v in value]
        out[a.name] = value
    return out


class _Importer:
    def __init__(self, model: onnx.ModelProto, opset: int):
        self.model = model
        self.opset = opset
        self.graph = Graph(model.graph.name or "model", meta={"opset": opset, "producer": model.producer_name})
        self.defined: set[str] = set()
        self._names: set[str] = set()

    # ---- helpers -----------------------------------------------------------------------------------
    def const(self, base: str, array: np.ndarray) -> str:
        name = self.graph.unique_name(base)
        self.graph.set_constant(name, np.asarray(array))
        self.defined.add(name)
        return name

    def emit(self, op: str, inputs: Sequence[str], outputs: Sequence[str], attrs: dict[str, Any] | None,
             name: str) -> None:
        self.graph.nodes.append(Node(op, list(inputs), list(outputs), attrs or {}, name))
        self.defined.update(o for o in outputs if o)

    def node_name(self, node: onnx.NodeProto, k: int) -> str:
        return self.fresh_node_name(node.name or f"{node.op_type}_{k}")

    def fresh_node_name(self, base: str) -> str:
        """A node name no other node has."""
        name, n = base, 1
        while name in self._names:
            name, n = f"{base}_{n}", n + 1
        self._names.add(name)
        return name

    # ---- the walk ----------------------------------------------------------------------------------
    def run(self, shapes: Mapping[str, tuple[int, ...]]) -> Graph:
        g = self.graph
        for t in self.model.graph.initializer:
            g.set_constant(t.name, _tensor(t, "initializer"))
            self.defined.add(t.name)
        for t in self.model.graph.sparse_initializer:
            raise UnsupportedError(f"sparse initializer '{t.values.name}' is not supported")
        for name, shape in shapes.items():
            g.inputs.append(name)
            g.values[name] = Value(name, shape, "float32")
            self.defined.add(name)
        # the model's node names first, so that the nodes the converters add take other names
        names = [self.node_name(node, k) for k, node in enumerate(self.model.graph.node)]
        for node, name in zip(self.model.graph.node, names, strict=True):
            if node.domain not in ("", "ai.onnx"):
                raise UnsupportedError(f"operator domain '{node.domain}' is not supported", node=name,
                                       op=node.op_type)
            for x in node.input:
                if x and x not in self.defined:
                    raise ModelError(
                        f"input '{x}' is not defined by an initializer, a graph input or an earlier node "
                        "(is the file truncated, or are the nodes out of order?)", node=name, op=node.op_type)
            convert = _CONVERTERS.get(node.op_type)
            if convert is None:
                raise UnsupportedError(
                    f"op '{node.op_type}' is not supported (weft imports: {', '.join(sorted(SUPPORTED_OPS))})",
                    node=name, op=node.op_type)
            allowed = _ATTRS.get(node.op_type, set())
            attrs = _attrs(node)
            for a in attrs:
                if a not in allowed:
                    raise UnsupportedError(f"attribute '{a}' is not supported", node=name, op=node.op_type)
            convert(self, node, name, attrs)
        for vi in self.model.graph.output:
            if vi.name not in self.defined:
                raise ModelError(f"graph output '{vi.name}' is not computed by any node (is the file truncated?)")
            g.outputs.append(vi.name)
        return g


# ---- converters ---------------------------------------------------------------------------------------
Converter = Callable[[_Importer, onnx.NodeProto, str, dict[str, Any]], None]


def _unsupported(name: str, op: str, message: str) -> UnsupportedError:
    return UnsupportedError(message, node=name, op=op)


def _window_attrs(node: onnx.NodeProto, name: str, a: dict[str, Any], *, conv: bool) -> dict[str, Any]:
    kernel = a.get("kernel_shape")
    if kernel is not None and len(kernel) != 2:
        raise _unsupported(name, node.op_type, f"only 2-D windows are supported, got kernel_shape {list(kernel)}")
    if any(d != 1 for d in a.get("dilations", ())):
        raise _unsupported(name, node.op_type, f"dilations {list(a['dilations'])} are not supported; only 1")
    pads = tuple(a.get("pads", (0, 0, 0, 0)))
    if len(pads) != 4:
        raise _unsupported(name, node.op_type, f"pads {list(pads)} are not 2-D (top, left, bottom, right)")
    out: dict[str, Any] = {"strides": tuple(a.get("strides", (1, 1))), "pads": pads}
    if len(out["strides"]) != 2:
        raise _unsupported(name, node.op_type, f"strides {list(out['strides'])} are not 2-D")
    auto_pad = a.get("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", ""):
        out["auto_pad"] = auto_pad
    if not conv:
        if kernel is None:
            raise ModelError("kernel_shape is missing", node=name, op=node.op_type)
        out["kernel_shape"] = tuple(kernel)
        out["ceil_mode"] = int(a.get("ceil_mode", 0))
    return out


def _conv(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    attrs = _window_attrs(node, name, a, conv=True)
    if a.get("group", 1) != 1:
        attrs["group"] = int(a["group"])
    inputs = list(node.input) + [""] * (3 - len(node.input))
    im.emit("Conv", inputs, node.output, attrs, name)


def _pool(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
        raise _unsupported(name, node.op_type, "the Indices output is not supported")
    attrs = _window_attrs(node, name, a, conv=False)
    if node.op_type == "AveragePool":
        attrs["count_include_pad"] = int(a.get("count_include_pad", 0))
    im.emit(node.op_type, node.input, node.output[:1], attrs, name)


def _clip(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    inputs = list(node.input) + [""] * (3 - len(node.input))
    if im.opset < 11:
        if "min" in a:
            inputs[1] = im.const(f"{name}_min", np.array(a["min"], np.float32))
        if "max" in a:
            inputs[2] = im.const(f"{name}_max", np.array(a["max"], np.float32))
    im.emit("Clip", inputs[:3], node.output, {}, name)


def _pad(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    mode = a.get("mode", "constant")
    if mode != "constant":
        raise _unsupported(name, node.op_type, f"mode '{mode}' is not supported; only 'constant'")
    if im.opset < 11:
        pads = im.const(f"{name}_pads", np.array(a.get("pads", ()), np.int64))
        value = im.const(f"{name}_value", np.array(a.get("value", 0.0), np.float32))
        im.emit("Pad", [node.input[0], pads, value], node.output, {}, name)
    else:
        im.emit("Pad", node.input, node.output, {}, name)


def _softmax(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    legacy = im.opset < 13
    axis = int(a.get("axis", 1 if legacy else -1))
    im.emit(node.op_type, node.input, node.output, {"axis": axis, "legacy": legacy}, name)


def _dropout(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    """Inference Dropout is the identity. Its mask (bool from opset 10, the input's type before) is all
    true from opset 12; onnxruntime gives an all-false (zero) mask for the older forms, and so does weft.
    It is written as ConstantOfShape(Shape(x)), which folds to a constant."""
    if a.get("is_test", 1) == 0:
        raise _unsupported(name, node.op_type, "is_test=0 (training mode) is not supported")
    if len(node.input) > 2 and node.input[2]:
        mode = im.graph.constants.get(node.input[2])
        if mode is None or bool(mode):
            raise _unsupported(name, node.op_type, "training_mode must be a constant false at inference")
    im.emit("Identity", node.input[:1], node.output[:1], {}, name)
    if len(node.output) > 1 and node.output[1]:
        shape = im.graph.unique_name(f"{name}_shape")
        im.emit("Shape", node.input[:1], [shape], {}, im.fresh_node_name(f"{name}_mask_shape"))
        fill = np.full(1, im.opset >= 12, np.bool_ if im.opset >= 10 else np.float32)
        im.emit("ConstantOfShape", [shape], node.output[1:2], {"value": fill}, im.fresh_node_name(f"{name}_mask"))


def _batchnorm(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    if a.get("training_mode", 0):
        raise _unsupported(name, node.op_type, "training_mode=1 is not supported at inference")
    if any(node.output[1:]):
        raise _unsupported(name, node.op_type, "the running mean/var outputs (training) are not supported")
    if a.get("spatial", 1) != 1:
        _per_activation_batchnorm(im, node, name, float(a.get("epsilon", 1e-5)))
        return
    im.emit("BatchNormalization", node.input, node.output[:1], {"epsilon": float(a.get("epsilon", 1e-5))}, name)


def _per_activation_batchnorm(im: _Importer, node: onnx.NodeProto, name: str, epsilon: float) -> None:
    """BatchNormalization with spatial=0 (opsets 7-8): statistics per activation, shaped (C, D1, ...), so
    it is no per-channel affine; it becomes x * inv + shift with both folded from the constant inputs."""
    params = [im.graph.constants.get(x) for x in node.input[1:5]]
    if any(p is None for p in params):
        raise _unsupported(name, node.op_type, "spatial=0 needs constant scale, bias, mean and variance")
    scale, bias, mean, var = (np.asarray(p, np.float64) for p in params)
    inv = scale / np.sqrt(var + epsilon)
    scaled = im.graph.unique_name(f"{name}_scaled")
    im.emit("Mul", [node.input[0], im.const(f"{name}_inv", inv.astype(np.float32))], [scaled], {},
            im.fresh_node_name(f"{name}_mul"))
    im.emit("Add", [scaled, im.const(f"{name}_shift", (bias - mean * inv).astype(np.float32))], node.output[:1], {},
            name)


def _sum(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    inputs = list(node.input)
    if len(inputs) == 1:
        im.emit("Identity", inputs, node.output, {}, name)
        return
    acc = inputs[0]
    for k, x in enumerate(inputs[1:]):
        last = k == len(inputs) - 2
        out = node.output[0] if last else im.graph.unique_name(f"{name}_partial{k}")
        im.emit("Add", [acc, x], [out], {}, name if last else im.fresh_node_name(f"{name}_add{k}"))
        acc = out


def _constant(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    if len(a) != 1:
        raise ModelError("a Constant needs exactly one value attribute", node=name, op=node.op_type)
    key, value = next(iter(a.items()))
    if key == "value":
        array = _tensor(value, "constant")
    elif key in ("value_float", "value_floats"):
        array = np.array(value, np.float32)
    elif key in ("value_int", "value_ints"):
        array = np.array(value, np.int64)
    else:
        raise _unsupported(name, node.op_type, f"attribute '{key}' is not supported")
    im.graph.set_constant(node.output[0], array)
    im.defined.add(node.output[0])


def _constant_of_shape(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    attrs = {"value": _tensor(a["value"], "value")} if "value" in a else {}
    im.emit("ConstantOfShape", node.input, node.output, attrs, name)


def _axes_to_input(min_opset: int, arity: int) -> Converter:
    """Squeeze/Unsqueeze (axes) and Slice (starts, ends, axes, steps): attributes before `min_opset`."""

    def convert(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
        inputs = list(node.input)
        if im.opset < min_opset:
            keys = ("axes",) if arity == 1 else ("starts", "ends", "axes")
            inputs = inputs[:1]
            for key in keys:
                inputs.append(im.const(f"{name}_{key}", np.array(a[key], np.int64)) if key in a else "")
            while inputs and inputs[-1] == "":
                inputs.pop()
        im.emit(node.op_type, inputs, node.output, {}, name)

    return convert


def _cast(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    to = _ELEM_TYPES.get(a["to"])
    if to is None:
        raise _unsupported(name, node.op_type, f"casting to {onnx.TensorProto.DataType.Name(a['to'])} is not "
                                               "supported")
    im.emit("Cast", node.input, node.output, {"to": to}, name)


def _reduce(axes_input_opset: int) -> Converter:
    """Reduce*: `axes` is an attribute before `axes_input_opset` (18; 13 for ReduceSum), an input from it."""

    def convert(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
        inputs = list(node.input)
        if im.opset < axes_input_opset and "axes" in a:
            inputs = [inputs[0], im.const(f"{name}_axes", np.array(a["axes"], np.int64))]
        attrs = {k: int(a[k]) for k in ("keepdims", "noop_with_empty_axes") if k in a}
        im.emit(node.op_type, inputs, node.output, attrs, name)

    return convert


def _split(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    inputs = list(node.input)
    if im.opset < 13 and "split" in a:
        inputs = [inputs[0], im.const(f"{name}_split", np.array(a["split"], np.int64))]
    attrs: dict[str, Any] = {"axis": int(a.get("axis", 0))}
    if "num_outputs" in a:
        if int(a["num_outputs"]) != len(node.output):
            raise ModelError(f"num_outputs {a['num_outputs']} differs from its {len(node.output)} outputs",
                             node=name, op=node.op_type)
        attrs["num_outputs"] = int(a["num_outputs"])
    im.emit("Split", inputs, node.output, attrs, name)


def _resize_mode(node: onnx.NodeProto, name: str, a: dict[str, Any]) -> str:
    mode = {"bilinear": "linear"}.get(a.get("mode", "nearest"), a.get("mode", "nearest"))
    if mode not in RESIZE_MODES:
        raise _unsupported(name, node.op_type, f"mode '{mode}' is not supported (supported: "
                                               f"{', '.join(RESIZE_MODES)})")
    return mode


def _resize(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    """Resize/Upsample in the opset-11+ form (X, roi, scales, sizes). Upsample (any opset) and Resize-10
    map source coordinates asymmetrically, with onnxruntime's rounding for them ("legacy")."""
    mode = _resize_mode(node, name, a)
    if node.op_type == "Resize" and im.opset >= 11:
        if a.get("coordinate_transformation_mode") == "tf_crop_and_resize":
            raise _unsupported(name, node.op_type, "coordinate_transformation_mode 'tf_crop_and_resize' is not "
                                                   "supported")
        keep = ("coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a", "exclude_outside", "antialias",
                "axes", "keep_aspect_ratio_policy")
        attrs = {"mode": mode, **{k: a[k] for k in keep if k in a}}
        im.emit("Resize", node.input, node.output, attrs, name)
        return
    if "scales" in a:  # Upsample before opset 9
        scales = im.const(f"{name}_scales", np.array(a["scales"], np.float32))
    else:
        scales = node.input[1]
    attrs = {"mode": mode, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "legacy"}
    im.emit("Resize", [node.input[0], "", scales], node.output, attrs, name)


def _conv_transpose(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    kernel = a.get("kernel_shape")
    if kernel is not None and len(kernel) not in (1, 2):
        raise _unsupported(name, node.op_type, f"only 1-D and 2-D kernels are supported, got kernel_shape "
                                               f"{list(kernel)}")
    keep = ("dilations", "group", "output_padding", "output_shape", "pads", "strides")
    attrs: dict[str, Any] = {k: a[k] for k in keep if k in a}
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", ""):
        attrs["auto_pad"] = a["auto_pad"]
    im.emit("ConvTranspose", node.input, node.output, attrs, name)


def _layer_norm(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    if a.get("stash_type", 1) != 1:
        raise _unsupported(name, node.op_type, "only stash_type=1 (float32 statistics) is supported")
    im.emit(node.op_type, node.input, node.output, {k: a[k] for k in ("axis", "epsilon") if k in a}, name)


def _plain(*keep: str, defaults: Mapping[str, Any] | None = None) -> Converter:
    def convert(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
        attrs = {**(defaults or {}), **{k: a[k] for k in keep if k in a}}
        im.emit(node.op_type, node.input, node.output, attrs, name)

    return convert


# ---- pre-quantized models (QDQ and QOperator formats; the arithmetic lives in weft.core.qdq) ---------
#: Ops that move or select integers without arithmetic.
_INT_MOVES = ("Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "MaxPool", "Identity")


def _producer(im: _Importer, value: str) -> Node | None:
    return next((n for n in reversed(im.graph.nodes) if value in n.outputs), None)


def _quantize_linear(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    x = node.input[0]
    constant = im.graph.constants.get(x)
    dtype = _ELEM_TYPES.get(a.get("output_dtype", onnx.TensorProto.UINT8), "unsupported")
    p = qdq.read_qparams(im.graph, node.input, a, node=name, op=node.op_type,
                         rank=None if constant is None else constant.ndim, default_dtype=dtype)
    if constant is not None:  # a float weight quantized in the graph: quantize it now
        im.graph.set_constant(node.output[0], qdq.quantize(np.asarray(constant, np.float32), p))
        im.defined.add(node.output[0])
        return
    if p.axis is not None:
        raise _unsupported(name, node.op_type, "per-axis quantization of activations is not supported")
    im.emit("QuantizeLinear", [x], node.output, p.attrs(), name)


def _dequantize_linear(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    x, y = node.input[0], node.output[0]
    # Data movement on the integers (QOperator models flatten or max-pool int8 tensors) commutes with the
    # monotonic quantization: fake-quant the float tensor, then move it.
    moves: list[Node] = []
    q = _producer(im, x)
    while q is not None and q.op in _INT_MOVES:
        moves.append(q)
        q = _producer(im, q.inputs[0])
    constant = im.graph.constants.get(x)
    dtype = im.graph.values[x].dtype if x in im.graph.values else \
        qdq.quantize_dtype(q) if q is not None and q.op == "QuantizeLinear" else "uint8"
    p = qdq.read_qparams(im.graph, node.input, a, node=name, op=node.op_type,
                         rank=None if constant is None else constant.ndim, default_dtype=dtype)
    if constant is not None:  # weights and biases: exactly the dequantized values, as a float constant
        im.graph.set_constant(y, qdq.dequantize(constant, p))
        im.defined.add(y)
        return
    if p.axis is not None:
        raise _unsupported(name, node.op_type, "per-axis dequantization of activations is not supported")
    if q is None or q.op != "QuantizeLinear" or q.attrs != p.attrs():
        im.emit("DequantizeLinear", [x], [y], p.attrs(), name)
        return
    src = q.inputs[0]
    value = y if not moves else im.graph.unique_name(f"{src}_fake_quant")
    im.emit(qdq.FAKE_QUANT, [src], [value], p.attrs(), name)
    entry = [p.attrs()[k] for k in ("scale", "zero_point", "qmin", "qmax")]
    scales = im.graph.meta.setdefault("qdq_scales", {})
    scales.setdefault(src, entry)
    scales.setdefault(value, entry)
    for k, move in enumerate(reversed(moves)):
        out = y if k == len(moves) - 1 else im.graph.unique_name(f"{move.outputs[0]}_float")
        im.emit(move.op, [value, *move.inputs[1:]], [out], move.attrs, f"{name}_{move.name}")
        value = out


def _dq_operand(im: _Importer, name: str, x: str, scale: str, zero_point: str, axis: int = 1) -> str:
    """A QOperator op's integer operand as a float value (a fake quant, or a folded constant)."""
    out = im.graph.unique_name(f"{x}_dequantized")
    inputs = [x, scale, zero_point]
    _dequantize_linear(im, onnx.helper.make_node("DequantizeLinear", inputs, [out]), f"{name}_dq_{x}",
                       {"axis": axis})
    return out


def _q_result(im: _Importer, name: str, y: str, scale: str, zero_point: str, out: str) -> None:
    _quantize_linear(im, onnx.helper.make_node("QuantizeLinear", [y, scale, zero_point], [out]), f"{name}_q", {})


def _bias_scale(im: _Importer, name: str, x_scale: str, w_scale: str) -> str:
    """The int32 bias's scale, x_scale * w_scale, as a constant."""
    product = np.asarray(im.graph.constants[x_scale], np.float32) * np.asarray(im.graph.constants[w_scale], np.float32)
    return im.const(f"{name}_bias_scale", product.astype(np.float32))


def _qlinear_conv(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    """QLinearConv = DequantizeLinear (x, w, bias) -> Conv -> QuantizeLinear."""
    x, xs, xz, w, ws, wz, ys, yz = node.input[:8]
    for s in (xs, ws):
        if s not in im.graph.constants:
            raise _unsupported(name, node.op_type, "the scales must be constants (initializers)")
    inputs = [_dq_operand(im, name, x, xs, xz), _dq_operand(im, name, w, ws, wz, axis=0)]
    if len(node.input) > 8 and node.input[8]:
        zero = im.const(f"{name}_bias_zero", np.zeros((), np.int32))
        inputs.append(_dq_operand(im, name, node.input[8], _bias_scale(im, name, xs, ws), zero, axis=0))
    y = im.graph.unique_name(f"{node.output[0]}_float")
    _conv(im, onnx.helper.make_node("Conv", inputs, [y], **a), name, a)
    _q_result(im, name, y, ys, yz, node.output[0])


def _qlinear_matmul(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
    """QLinearMatMul = DequantizeLinear (a, b; b per column) -> MatMul -> QuantizeLinear."""
    x, xs, xz, w, ws, wz, ys, yz = node.input[:8]
    inputs = [_dq_operand(im, name, x, xs, xz), _dq_operand(im, name, w, ws, wz, axis=-1)]
    y = im.graph.unique_name(f"{node.output[0]}_float")
    im.emit("MatMul", inputs, [y], {}, name)
    _q_result(im, name, y, ys, yz, node.output[0])


def _integer_op(op: str) -> Converter:
    """ConvInteger / MatMulInteger: the float op on zero-point-shifted operands (scale 1), cast to int32;
    exact while the accumulator stays within float32's 24-bit integers."""

    def convert(im: _Importer, node: onnx.NodeProto, name: str, a: dict[str, Any]) -> None:
        x, w = node.input[:2]
        zps = [*node.input[2:4], "", ""][:2]
        one = im.const(f"{name}_one", np.ones((), np.float32))
        operands = [_dq_operand(im, name, v, one, zp) for v, zp in zip((x, w), zps, strict=True)]
        y = im.graph.unique_name(f"{node.output[0]}_float")
        if op == "Conv":
            _conv(im, onnx.helper.make_node("Conv", operands, [y], **a), f"{name}_conv", a)
        else:
            im.emit("MatMul", operands, [y], {}, f"{name}_matmul")
        im.emit("Cast", [y], node.output, {"to": "int32"}, name)

    return convert


_QDQ_CONVERTERS: dict[str, Converter] = {
    "QuantizeLinear": _quantize_linear,
    "DequantizeLinear": _dequantize_linear,
    "QLinearConv": _qlinear_conv,
    "QLinearMatMul": _qlinear_matmul,
    "ConvInteger": _integer_op("Conv"),
    "MatMulInteger": _integer_op("MatMul"),
}
_QDQ_ATTRS: dict[str, set[str]] = {
    "QuantizeLinear": {"axis", "block_size", "saturate", "output_dtype", "precision"},
    "DequantizeLinear": {"axis", "block_size", "output_dtype"},
    "QLinearConv": {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"},
    "ConvInteger": {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"},
}

#: Reductions whose axes became an input in opset 18 (ReduceSum's did in 13).
_REDUCE_18 = ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1", "ReduceL2",
              "ReduceLogSumExp")

_CONVERTERS: dict[str, Converter] = {
    "Conv": _conv,
    "Gemm": _plain("alpha", "beta", "transA", "transB"),
    "MatMul": _plain(),
    "Relu": _plain(),
    "Clip": _clip,
    "Add": _plain(), "Sub": _plain(), "Mul": _plain(), "Div": _plain(),
    "Sum": _sum,
    "BatchNormalization": _batchnorm,
    "MaxPool": _pool, "AveragePool": _pool,
    "GlobalAveragePool": _plain(),
    "Flatten": _plain("axis", defaults={"axis": 1}),
    "Reshape": _plain("allowzero"),
    "Concat": _plain("axis"),
    "Pad": _pad,
    "Softmax": _softmax,
    "LogSoftmax": _softmax,
    "Dropout": _dropout,
    "Identity": _plain(),
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Shape": _plain("start", "end"),
    "Gather": _plain("axis"),
    "GatherElements": _plain("axis"),
    "Unsqueeze": _axes_to_input(13, 1),
    "Squeeze": _axes_to_input(13, 1),
    "Slice": _axes_to_input(10, 3),
    "Cast": _cast,
    **_QDQ_CONVERTERS,
    "CastLike": _plain(),
    "Size": _plain(),
    **{op: _plain() for op in (
        "Sigmoid", "HardSwish", "Tanh", "Softplus", "Erf", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal",
        "PRelu", "Max", "Min", "Pow", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or",
        "Not", "Where", "GlobalMaxPool", "Expand", "Tile", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos",
        "Softsign", "Mish", "Mean", "Range")},
    "Selu": _plain("alpha", "gamma"),
    "Celu": _plain("alpha"),
    "ThresholdedRelu": _plain("alpha"),
    "HardSigmoid": _plain("alpha", "beta"),
    "LeakyRelu": _plain("alpha"),
    "Elu": _plain("alpha"),
    "Gelu": _plain("approximate"),
    **{op: _reduce(18) for op in _REDUCE_18},
    "ReduceSum": _reduce(13),
    "ArgMax": _plain("axis", "keepdims", "select_last_index"),
    "LRN": _plain("size", "alpha", "beta", "bias"),
    "Transpose": _plain("perm"),
    "Split": _split,
    "Resize": _resize,
    "Upsample": _resize,
    "ConvTranspose": _conv_transpose,
    "InstanceNormalization": _plain("epsilon"),
    "LayerNormalization": _layer_norm,
}

#: Attributes each op may carry (anything else is an UnsupportedError naming the attribute).
_ATTRS: dict[str, set[str]] = {
    "Conv": {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"},
    "Gemm": {"alpha", "beta", "transA", "transB"},
    "Clip": {"min", "max"},
    "BatchNormalization": {"epsilon", "momentum", "spatial", "training_mode"},
    "MaxPool": {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"},
    "AveragePool": {"auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides"},
    "Flatten": {"axis"},
    "Reshape": {"allowzero"},
    "Concat": {"axis"},
    "Pad": {"mode", "pads", "value"},
    "Softmax": {"axis"},
    "LogSoftmax": {"axis"},
    "Dropout": {"ratio", "is_test", "seed"},
    "Constant": {"value", "value_float", "value_floats", "value_int", "value_ints", "sparse_value",
                 "value_string", "value_strings"},
    "ConstantOfShape": {"value"},
    "Shape": {"start", "end"},
    "Gather": {"axis"},
    "GatherElements": {"axis"},
    "Unsqueeze": {"axes"},
    "Squeeze": {"axes"},
    "Slice": {"starts", "ends", "axes"},
    "Cast": {"to", "saturate"},
    **_QDQ_ATTRS,
    "CastLike": {"saturate"},
    "HardSigmoid": {"alpha", "beta"},
    "LeakyRelu": {"alpha"},
    "Elu": {"alpha"},
    "Selu": {"alpha", "gamma"},
    "Celu": {"alpha"},
    "ThresholdedRelu": {"alpha"},
    "Gelu": {"approximate"},
    **{op: {"axes", "keepdims", "noop_with_empty_axes"} for op in (*_REDUCE_18, "ReduceSum")},
    "ArgMax": {"axis", "keepdims", "select_last_index"},
    "LRN": {"size", "alpha", "beta", "bias"},
    "Transpose": {"perm"},
    "Split": {"axis", "split", "num_outputs"},
    "Resize": {"mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a", "exclude_outside",
               "extrapolation_value", "antialias", "axes", "keep_aspect_ratio_policy"},
    "Upsample": {"mode", "scales"},
    "ConvTranspose": {"auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads",
                      "strides"},
    "InstanceNormalization": {"epsilon"},
    "LayerNormalization": {"axis", "epsilon", "stash_type"},
}

SUPPORTED_OPS = frozenset(_CONVERTERS)


def import_onnx(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None,
                sample_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """The IR of an ONNX model, every graph input with a static shape (see the module docstring)."""
    opset = _opset(model)
    declared = declared_inputs(model)
    given = dict(input_shapes or {})
    for name in given:
        if name not in declared:
            raise ModelError(f"input_shapes names '{name}', which is not a graph input "
                             f"(inputs: {', '.join(declared) or 'none'})")
    if not declared:
        raise ModelError("the model has no graph inputs")
    shapes = {}
    for name, (dims, dtype) in declared.items():
        if dtype != "float32":
            raise UnsupportedError(f"graph input '{name}' is {dtype}; weft compiles models with float32 inputs")
        shapes[name] = _fix_shape(name, dims, given.get(name), (sample_shapes or {}).get(name))
    return _Importer(model, opset).run(shapes)
