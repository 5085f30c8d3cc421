"""The host plan: tensors, kernel steps, and the planner state the op handlers build them with.

A :class:`Tensor` is a graph value as the host holds it (logical shape, layout, array); a :class:`Step` is
one kernel call on tensors. :class:`Planner` hands op handlers (:mod:`~weft.compiler.llvm.host_float`,
:mod:`~weft.compiler.llvm.host_quant`) the tensors of their inputs in the layouts they ask for, inserting
a conversion kernel once per value and layout. :class:`HostPlan` runs the result.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from weft.compiler.llvm import elementwise as ew
from weft.compiler.llvm.elementwise import Operand
from weft.compiler.llvm.expr import Buffer, dtype_of_numpy
from weft.compiler.llvm.jit import CompiledKernel
from weft.compiler.llvm.layout import PLAIN, Layout
from weft.compiler.llvm.target import Target
from weft.compiler.llvm.te import Kernel
from weft.core.errors import UnsupportedError
from weft.core.float_ops import FLOAT_OPS
from weft.core.ir import Graph, Node, numpy_dtype

__all__ = ["HostPlan", "Planner", "Step", "Tensor", "array_dtype", "ident", "plain_copy", "plain_view"]


@dataclass(eq=False)
class Tensor:
    """A value as the host holds it: logical shape, layout, and the array behind it."""

    name: str
    shape: tuple[int, ...]
    layout: Layout
    dtype: str = "f32"
    array: np.ndarray | None = None
    #: a tensor sharing the bytes of another (reshapes, same-bytes layout changes, a part of a concatenation
    #: written in place), starting `offset` elements into it
    alias_of: Tensor | None = None
    offset: int = 0
    constant: bool = False
    #: the stored shape when it is not the layout's: the accelerator's packed integer activations
    storage: tuple[int, ...] | None = None

    @property
    def physical(self) -> tuple[int, ...]:
        return self.storage if self.storage is not None else self.layout.physical(self.shape)

    def root(self) -> Tensor:
        return self.alias_of.root() if self.alias_of is not None else self

    def root_offset(self) -> int:
        """Elements from the start of the root's array to this tensor's first."""
        return self.offset + (self.alias_of.root_offset() if self.alias_of is not None else 0)

    def flat(self, size: int | None = None) -> np.ndarray:
        """This tensor's elements (`size` of them, default its physical size) in its root's array, 1-D."""
        start = self.root_offset()
        count = int(np.prod(self.physical, dtype=np.int64)) if size is None else size
        return self.root().array.reshape(-1)[start:start + count]  # type: ignore[union-attr]

    def operand(self, name: str | None = None) -> Operand:
        shape = self.shape or (1,)
        return Operand(Buffer(name or ident(self.name), self.layout.physical(shape), self.dtype), shape, self.layout)


@dataclass(eq=False)
class Step:
    """One call: a compiled kernel on `args`, or (``kernel`` None) a numpy step that runs the graph node
    `host` through its ``FLOAT_OPS`` kernel on the plain arrays of `args` (inputs, then outputs)."""

    node: str
    kernel: Kernel | None
    args: list[Tensor]
    compiled: CompiledKernel | None = None
    pointers: Any = None
    host: Node | None = None
    #: a numpy step's inputs and outputs, None where the node leaves one out
    host_inputs: list[Tensor | None] = field(default_factory=list)
    host_outputs: list[Tensor | None] = field(default_factory=list)
    #: "concat_ranges": a concatenation whose parts are consecutive ranges of its output, a copy that
    #: :func:`~weft.compiler.llvm.graph.concat_in_place` may remove
    kind: str = ""

    @property
    def runner(self) -> str:
        """What runs this step: "llvm" (generated code) or "numpy" (the host fallback)."""
        return "numpy" if self.host is not None else "llvm"

    def run(self, threads: int) -> None:
        if self.host is None:
            self.compiled.raw(self.pointers, threads)  # type: ignore[union-attr]
            return
        arrays = [None if t is None else plain_view(t) for t in self.host_inputs]
        outs = FLOAT_OPS[self.host.op].run(self.host, arrays)
        for t, array in zip(self.host_outputs, outs, strict=False):
            if t is not None:
                np.copyto(plain_view(t), np.asarray(array).reshape(t.shape), casting="unsafe")


@dataclass(eq=False)
class HostPlan:
    """A graph ready to run on the host CPU (see the module docstring)."""

    graph: Graph
    target: Target
    steps: list[Step]
    inputs: dict[str, Tensor]
    outputs: dict[str, Tensor]
    tensors: list[Tensor]
    #: node name -> (op, MACs, logical output shape), for the per-layer figures
    layers: list[tuple[str, str, int, list[int]]] = field(default_factory=list)
    compile_seconds: float = 0.0
    #: value name -> the tensor that holds it
    values_by_name: dict[str, Tensor] = field(default_factory=dict)
    #: the plan's buffers are reused by every run: one run at a time
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: conv node -> (ConvWorkload, ConvSchedule, whether a tuning log chose it): the direct kernel's
    #: schedule, which tuning starts from (:attr:`algorithms` says what runs)
    convs: dict[str, tuple[Any, Any, bool]] = field(default_factory=dict)
    #: conv node -> the algorithm and register tile its kernel runs ("winograd F(4x4)", "pointwise 6x2",
    #: "direct 4x3", "depthwise", "grouped", "dense"), in each layer's figures as ``algorithm``
    algorithms: dict[str, str] = field(default_factory=dict)
    #: what every run repeats, made by the first (the steps and buffers are fixed by then): per layer its
    #: name and figures but the seconds, and per output its array in the logical layout (None: packed)
    _rows: list[tuple[str, dict[str, Any]]] | None = field(default=None, repr=False)
    _output_views: dict[str, np.ndarray | None] | None = field(default=None, repr=False)
    #: the steps as every run calls them: runs of generated kernels in one native call, numpy steps alone
    _segments: list[Step | _Sequence] | None = field(default=None, repr=False)
    #: per graph input the kernel arguments that read it, (pointer array, index, byte offset); absent where
    #: its tensor must hold it (see :func:`_feed_slots`)
    _feed_slots: dict[str, list[tuple[Any, int, int]]] | None = field(default=None, repr=False)
    #: inputs of the last run read from the caller's arrays, copied in only if :meth:`values` asks
    _read_in_place: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def kernels(self) -> int:
        return len(self.steps)

    def values(self) -> dict[str, np.ndarray]:
        """Every computed value (graph inputs included) of the last run, in its logical layout."""
        for name, feed in self._read_in_place.items():  # the kernels read these where they lay: copy them in
            t = self.inputs[name]
            np.copyto(t.flat().reshape(t.physical), feed.reshape(t.physical))
        self._read_in_place = {}
        return {name: plain_copy(t) for name, t in self.values_by_name.items() if not t.constant}

    def run(self, feeds: Mapping[str, np.ndarray], threads: int = 1, timings: bool = False
            ) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
        """Outputs by name, and per node its name, op, MACs, shape and seconds (when `timings`)."""
        with self.lock:
            return self._run(feeds, threads, timings)

    def _run(self, feeds: Mapping[str, np.ndarray], threads: int, timings: bool
             ) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
        if self._feed_slots is None:
            self._feed_slots = _feed_slots(self)
        self._read_in_place = {}
        for name, t in self.inputs.items():
            feed = np.asarray(feeds[name])
            slots = self._feed_slots.get(name)
            # a C-contiguous feed of the input's dtype is read where it lies (no copy); else copied in
            direct = slots is not None and feed.flags.c_contiguous and feed.dtype == t.array.dtype \
                and feed.size == t.array.size
            base = feed.ctypes.data if direct else t.flat().ctypes.data
            if direct:
                self._read_in_place[name] = feed
            else:
                np.copyto(t.flat().reshape(t.physical), feed.reshape(t.physical), casting="same_kind")
            for pointers, k, offset in slots or ():
                pointers[k] = base + offset
        seconds: dict[str, float] = {}
        if self._segments is None:
            self._segments = _segments(self.steps)
        clock = time.perf_counter
        for segment in self._segments:
            if isinstance(segment, _Sequence):
                segment.run(threads, seconds if timings else None)
            elif timings:
                start = clock()
                segment.run(threads)
                seconds[segment.node] = seconds.get(segment.node, 0.0) + clock() - start
            else:
                segment.run(threads)
        # (what follows runs once a model has flushed the caches: the less Python, the less time; 0.3 ms a
        # run before the per-layer rows and output views were made once, measured on MobileNetV2)
        if self._output_views is None:
            self._output_views = {name: plain_view(t) if t.layout == PLAIN and t.storage is None else None
                                  for name, t in self.outputs.items()}
        outputs = {name: plain_copy(self.outputs[name]) if view is None else view.copy()
                   for name, view in self._output_views.items()}
        if self._rows is None:
            runners = self.runners()
            self._rows = [(n, {"name": n, "op": op, "target": "host", "kernel": runners.get(n, "none"), "macs": macs,
                               "shape": shape, "seconds": 0.0,
                               **({"algorithm": self.algorithms[n]} if self.algorithms.get(n) else {})})
                          for n, op, macs, shape in self.layers]
        get = seconds.get
        layers = [{**row, "seconds": get(n, 0.0)} for n, row in self._rows]
        return outputs, layers

    def runners(self) -> dict[str, str]:
        """Node -> what ran it: "numpy" when any of its steps is a numpy step, else "llvm" (nodes with no
        step at all, reshapes and folded constants, are absent)."""
        out: dict[str, str] = {}
        for step in self.steps:
            if out.get(step.node) != "numpy":
                out[step.node] = step.runner
        return out

    def numpy_steps(self) -> list[Step]:
        return [s for s in self.steps if s.host is not None]


class _Sequence:
    """Consecutive generated kernels called from one native loop (:func:`~weft.compiler.llvm.jit.sequence_runner`):
    no Python between them, and the clock read natively before the first and after each."""

    def __init__(self, runner: Any, steps: Sequence[Step]):
        self.runner, self.nodes = runner, [s.node for s in steps]
        n = len(steps)
        self.kernels = (ctypes.c_void_p * n)(*[s.compiled.address for s in steps])  # type: ignore[union-attr]
        self.buffers = (ctypes.c_void_p * n)(*[ctypes.addressof(s.pointers) for s in steps])
        self.stamps = (ctypes.c_int64 * (n + 1))()
        self._refs = [s.pointers for s in steps]  # the pointer arrays the buffers array points into
        # per-layer sums without a Python loop over kernels: each kernel's index among the distinct nodes
        self.distinct = list(dict.fromkeys(self.nodes))
        where = {node: k for k, node in enumerate(self.distinct)}
        self.node_index = np.array([where[node] for node in self.nodes], np.intp)
        self._stamps = np.frombuffer(self.stamps, np.int64)

    def run(self, threads: int, seconds: dict[str, float] | None) -> None:
        n = len(self.nodes)
        if seconds is None:
            self.runner(self.kernels, self.buffers, n, threads, None)
            return
        self.runner(self.kernels, self.buffers, n, threads, self.stamps)
        spans = np.bincount(self.node_index, np.diff(self._stamps), len(self.distinct)) * 1e-9
        if not seconds:  # (the usual case: one run of kernels holds every layer)
            seconds.update(zip(self.distinct, spans.tolist(), strict=True))
            return
        for node, span in zip(self.distinct, spans.tolist(), strict=True):
            seconds[node] = seconds.get(node, 0.0) + span


def _feed_slots(plan: HostPlan) -> dict[str, list[tuple[Any, int, int]]]:
    """Per graph input, where the kernels' pointer arrays hold its address (see :attr:`HostPlan._feed_slots`).
    An input is left out (always copied in) where anything but a kernel reads its buffer (a numpy step, the
    output copy of a view of it), where a kernel writes it (the caller's array is only ever read), or where
    it is not an array of its own."""
    roots = {id(t): name for name, t in plan.inputs.items() if t.alias_of is None and t.storage is None}
    kernels = [step for step in plan.steps if step.kernel is not None]
    elsewhere = [t for step in plan.steps if step.kernel is None for t in [*step.args, *step.host_inputs] if t]
    elsewhere += list(plan.outputs.values())
    elsewhere += [t for step in kernels for t in step.args[len(step.kernel.inputs):]]  # type: ignore[union-attr]
    for t in elsewhere:
        roots.pop(id(t.root()), None)
    slots: dict[str, list[tuple[Any, int, int]]] = {name: [] for name in roots.values()}
    for step in kernels:
        for k, t in enumerate(step.args):
            name = roots.get(id(t.root()))
            if name is not None:
                slots[name].append((step.pointers, k, t.root_offset() * t.root().array.itemsize))  # type: ignore[union-attr]
    return slots


def _segments(steps: Sequence[Step]) -> list[Step | _Sequence]:
    """`steps` with each run of two or more generated kernels in one :class:`_Sequence` (where this host has
    the native runner; elsewhere every step alone)."""
    from weft.compiler.llvm.jit import sequence_runner

    runner = sequence_runner()
    if runner is None:
        return list(steps)
    out: list[Step | _Sequence] = []
    run: list[Step] = []
    for step in [*steps, None]:
        if step is not None and step.host is None:
            run.append(step)
            continue
        if len(run) > 1:
            out.append(_Sequence(runner, run))
        else:
            out += run
        run = []
        if step is not None:
            out.append(step)
    return out


def plain_copy(t: Tensor) -> np.ndarray:
    """A copy of `t` in its logical layout (packed integer tensors stay packed, as the reference keeps them)."""
    data = t.flat().reshape(t.physical)
    if t.storage is not None:
        return np.array(data, copy=True)
    plain = t.layout.from_numpy(data) if t.layout.blocked else data
    return np.array(plain, copy=True).reshape(t.shape)


def plain_view(t: Tensor) -> np.ndarray:
    """The array of a plain-layout tensor in its logical shape, sharing its bytes."""
    if t.layout != PLAIN or t.storage is not None:
        raise AssertionError(f"tensor '{t.name}' is not plain ({t.layout})")
    return t.flat(int(np.prod(t.shape, dtype=np.int64))).reshape(t.shape)


def ident(name: str) -> str:
    out = "".join(ch if ch.isalnum() else "_" for ch in name)
    return out if out and not out[0].isdigit() else f"t_{out}"


class Planner:
    """What op handlers build a plan with: tensors of graph values in the layouts they need, and steps."""

    def __init__(self, graph: Graph, target: Target, handlers: dict[str, Callable[[Planner, Node], None]],
                 int_ops: frozenset[str] = frozenset()):
        self.g = graph
        self.handlers = handlers
        #: ops whose handlers take integer tensors (the rest compute float32)
        self.int_ops = int_ops
        #: value name -> the zero border its producer writes around it (see host_float.plan_halos)
        self.halos: dict[str, int] = {}
        self.target = target
        self.lanes = target.lanes(4)
        #: (value name, layout) -> tensor
        self.tensors: dict[tuple[str, Layout], Tensor] = {}
        self.primary: dict[str, Tensor] = {}
        self.steps: list[Step] = []
        self.all: list[Tensor] = []
        #: conv workload key -> the schedule a tuning log picked (the rest take the heuristic's)
        self.tuned: Mapping[str, Any] = {}
        #: conv node -> (workload, schedule, tuned), as the handlers chose them
        self.convs: dict[str, tuple[Any, Any, bool]] = {}
        #: conv node -> the algorithm and register tile of its kernel ("winograd F(4x4)", "direct 4x3"...)
        self.algorithms: dict[str, str] = {}

    # ---- tensors -----------------------------------------------------------------------------------
    def new(self, name: str, shape: Sequence[int], layout: Layout, dtype: str = "f32", primary: bool = True) -> Tensor:
        t = Tensor(name, tuple(int(d) for d in shape), layout, dtype)
        self.all.append(t)
        self.tensors[(name, layout)] = t
        if primary:
            self.primary[name] = t
        return t

    def alias(self, name: str, of: Tensor, shape: Sequence[int], layout: Layout = PLAIN) -> Tensor:
        t = Tensor(name, tuple(int(d) for d in shape), layout, of.dtype, alias_of=of)
        self.all.append(t)
        self.tensors[(name, layout)] = t
        self.primary[name] = t
        return t

    def get(self, name: str, layout: Layout | None = None, node: Node | None = None) -> Tensor:
        """Value `name` as a tensor, in `layout` when given (converting once if needed)."""
        if name not in self.primary:
            if self.g.is_constant(name):
                array = np.ascontiguousarray(self.g.constants[name])
                t = Tensor(name, tuple(array.shape), PLAIN, array_dtype(array, node), array, constant=True)
                self.all.append(t)
                self.tensors[(name, PLAIN)] = t
                self.primary[name] = t
            else:
                raise UnsupportedError(f"value '{name}' is not computed on the host", node=node and node.name,
                                       op=node and node.op)
        t = self.primary[name]
        if layout is None or t.layout == layout:
            return t
        if (name, layout) in self.tensors:
            return self.tensors[(name, layout)]
        if layout == PLAIN and t.layout.same_bytes_as_plain(t.shape):
            return self.alias_same(name, t, layout)
        if t.constant:
            array = layout.to_numpy(t.array)  # type: ignore[arg-type]
            c = Tensor(name, t.shape, layout, t.dtype, array, constant=True)
            self.all.append(c)
            self.tensors[(name, layout)] = c
            return c
        out = Tensor(f"{name}@{layout}", t.shape, layout, t.dtype)
        self.all.append(out)
        self.tensors[(name, layout)] = out
        kernel = ew.layout_kernel("convert", t.operand("x"), layout, self.target)
        self.step(node.name if node else name, kernel, [t, out])
        return out

    def alias_same(self, name: str, t: Tensor, layout: Layout) -> Tensor:
        a = Tensor(f"{name}@{layout}", t.shape, layout, t.dtype, alias_of=t)
        self.all.append(a)
        self.tensors[(name, layout)] = a
        return a

    def step(self, node: str, kernel: Kernel, args: list[Tensor]) -> None:
        if len(args) != len(kernel.params) - len(kernel.temps):
            raise AssertionError(f"kernel '{kernel.name}' takes {len(kernel.params)} buffers, got {len(args)}")
        temps = []
        for b in kernel.temps:
            t = Tensor(f"{node}.{b.name}", b.shape, PLAIN, b.dtype)
            self.all.append(t)
            temps.append(t)
        self.steps.append(Step(node, kernel, [*args, *temps]))

    # ---- nodes -------------------------------------------------------------------------------------
    def node(self, node: Node) -> None:
        for name in node.outputs:
            if name and 0 in (self.g.values[name].shape or ()):
                raise UnsupportedError(f"output '{name}' is empty (shape {list(self.g.values[name].shape)})",
                                       node=node.name, op=node.op)
        handler = self.handlers.get(node.op)
        if handler is None:
            if node.op not in FLOAT_OPS:
                raise UnsupportedError("neither generated code nor numpy has a kernel for this op", node=node.name,
                                       op=node.op)
            if all(self.g.is_constant(x) for x in node.inputs if x):
                return self.fold(node)
            return self.numpy_step(node)
        for x in node.inputs:
            if x and not self.g.is_constant(x):
                v = self.g.values[x]
                if v.dtype != "float32" and node.op not in self.int_ops and node.op not in (
                        "Shape", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast"):
                    if node.op in FLOAT_OPS:  # numpy computes in any dtype
                        return self.numpy_step(node)
                    raise UnsupportedError(f"input '{x}' is {v.dtype}; host kernels compute float32",
                                           node=node.name, op=node.op)
        if node.op in self.int_ops or node.op not in FLOAT_OPS:
            return handler(self, node)
        # a case the handler does not cover (an attribute value, a runtime-valued weight...) is no refusal:
        # forget what it planned and run the node through numpy
        saved = (len(self.steps), len(self.all), dict(self.tensors), dict(self.primary), dict(self.convs),
                 dict(self.algorithms))
        try:
            handler(self, node)
        except UnsupportedError:
            steps, count, self.tensors, self.primary, self.convs, self.algorithms = saved
            del self.steps[steps:], self.all[count:]
            self.numpy_step(node)

    def numpy_step(self, node: Node) -> None:
        """The host fallback: `node` runs through its numpy kernel on plain arrays, inside the plan."""
        inputs = [self.get(x, PLAIN, node) if x else None for x in node.inputs]
        if any(t is not None and t.storage is not None for t in inputs):
            raise UnsupportedError("numpy kernels read plain tensors, not the accelerator's packed ones",
                                   node=node.name, op=node.op)
        outputs: list[Tensor | None] = []
        for name in node.outputs:
            if not name:
                outputs.append(None)
                continue
            v = self.g.values[name]
            if v.shape is None:
                raise UnsupportedError(f"output '{name}' has no static shape", node=node.name, op=node.op)
            try:
                dtype = dtype_of_numpy(numpy_dtype(v.dtype))
            except ValueError:
                raise UnsupportedError(f"output '{name}' is {v.dtype}, which host tensors do not hold",
                                       node=node.name, op=node.op) from None
            outputs.append(self.new(name, v.shape, PLAIN, dtype))
        args = [t for t in [*inputs, *outputs] if t is not None]
        self.steps.append(Step(node.name, None, args, host=node, host_inputs=inputs, host_outputs=outputs))

    def fold(self, node: Node) -> None:
        """A node of constants only: evaluated once, here (it depends on no feed)."""
        outs = FLOAT_OPS[node.op].run(node, [self.g.constants[x] if x else None for x in node.inputs])
        for name, array in zip(node.outputs, outs, strict=False):
            array = np.ascontiguousarray(array)
            t = Tensor(name, tuple(array.shape), PLAIN, array_dtype(array, node), array, constant=True)
            self.all.append(t)
            self.tensors[(name, PLAIN)] = t
            self.primary[name] = t

    def fold_static(self, node: Node) -> None:
        """Shape: known statically from the input's shape."""
        shape = tuple(self.g.values[node.inputs[0]].shape or ())
        array = np.ascontiguousarray(FLOAT_OPS[node.op].run(node, [np.zeros(shape, np.float32)])[0])
        t = Tensor(node.outputs[0], tuple(array.shape), PLAIN, "i64", array, constant=True)
        self.all.append(t)
        self.tensors[(node.outputs[0], PLAIN)] = t
        self.primary[node.outputs[0]] = t

    def out_shape(self, node: Node, k: int = 0) -> tuple[int, ...]:
        return tuple(self.g.values[node.outputs[k]].shape or ())


def array_dtype(array: np.ndarray, node: Node | None) -> str:
    try:
        return dtype_of_numpy(array.dtype)
    except ValueError:
        raise UnsupportedError(f"arrays of {array.dtype} are not supported on the host",
                               node=node and node.name, op=node and node.op) from None


