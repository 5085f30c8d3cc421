"""The graph walker every device runs: nodes in order, one value environment, one per-layer record format.

Host layers go to one host dispatcher (:func:`weft.core.host.run_host_node` unless the caller wraps it);
accelerator layers go to an :class:`AcceleratorRunner` when the device has one (the reference interpreter
has none: its accelerator layers run their integer kernels on the host). The walker knows where each live
value is, in host memory or in the runner's device memory, moves it only when the other side needs it, and
frees it after its last use (unless intermediates are kept).

A layer's record is name, op, target, macs, shape, then the runner's fields for a run with a runner
(:meth:`AcceleratorRunner.run_layer` for accelerator layers, :meth:`AcceleratorRunner.host_fields` for
host layers), then seconds. The run's cycles are the sum of the accelerator layers' (None when one of them
is unknown, or without a runner).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from weft.core.float_ops import macs_of
from weft.core.host import HostRunner, run_host_node
from weft.core.ir import ACCEL_OPS, Graph, Node, Value, numpy_dtype
from weft.core.qkernels import Widths
from weft.errors import WeftError

__all__ = ["AcceleratorRunner", "FeedError", "RunResult", "allowing_nonfinite", "check_feeds",
           "target_of", "walk_graph", "widths_of"]

# Set by InferenceSession(allow_nonfinite=True) around a run, so every device's own check_feeds call
# (walker, cpu, cuda) lets NaN/Inf through without each device growing an option.
_ALLOW_NONFINITE: contextvars.ContextVar[bool] = contextvars.ContextVar("weft_allow_nonfinite", default=False)


@contextlib.contextmanager
def allowing_nonfinite(allow: bool = True) -> Iterator[None]:
    """Within this block, check_feeds lets NaN and Inf inputs through when `allow` is true."""
    token = _ALLOW_NONFINITE.set(allow)
    try:
        yield
    finally:
        _ALLOW_NONFINITE.reset(token)


class FeedError(WeftError):
    """Inputs that do not match the graph: a missing or unknown name, a wrong shape or dtype."""


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    #: Every value computed (graph inputs and node outputs), when ``keep_intermediates`` was asked.
    values: dict[str, np.ndarray] = field(default_factory=dict)
    #: Per node: name, op, target, macs, shape (logical), the runner's fields, seconds.
    layers: list[dict[str, Any]] = field(default_factory=list)
    #: Accelerator cycles of the run (None without a runner or when a layer's are unknown).
    cycles: int | None = None


class AcceleratorRunner(Protocol):
    """Runs a device's accelerator layers on its own memory; the walker decides when values move."""

    def running(self) -> AbstractContextManager[None]:
        """Held for one run: the device memory starts afresh (constants only)."""
        ...

    def layer_info(self, node: Node) -> dict[str, Any]:
        """The device's program for accelerator layer `node`; its ``inputs`` are the values the program
        reads from device memory. Raises when there is none."""
        ...

    def write_value(self, name: str, array: np.ndarray) -> None:
        """Put value `name`, made on the host, into its device buffer."""
        ...

    def read_value(self, name: str) -> np.ndarray:
        """Value `name` read back from its device buffer."""
        ...

    def run_layer(self, node: Node, layer: dict[str, Any]) -> dict[str, Any]:
        """Run the layer's program (its inputs are in device memory, its output stays there); the record's
        fields: at least ``cycles`` (None when unknown)."""
        ...

    def host_fields(self) -> dict[str, Any]:
        """The record's runner fields for a layer that ran on the host (no accelerator work)."""
        ...


def widths_of(graph: Graph) -> Widths:
    """The data widths of the config a quantized graph was compiled for (8/8/32/8 for float graphs)."""
    config = graph.meta.get("config")
    if not config:
        return Widths(8, 8, 32, 8)
    return Widths(int(config["inp_width"]), int(config["wgt_width"]), int(config["acc_width"]),
                  int(config["out_width"]))


def check_feeds(graph: Graph, feeds: Mapping[str, Any], *, allow_nonfinite: bool | None = None
                ) -> dict[str, np.ndarray]:
    """The feeds as arrays of the graph inputs' dtypes; FeedError names the input that is wrong.

    NaN and Inf are refused (quantization would silently turn them into zeros or saturated values) unless
    `allow_nonfinite`, or, when that is None, the enclosing :func:`allowing_nonfinite` block, allows them."""
    if allow_nonfinite is None:
        allow_nonfinite = _ALLOW_NONFINITE.get()
    unknown = sorted(set(feeds) - set(graph.inputs))
    if unknown:
        raise FeedError(f"'{unknown[0]}' is not an input of the model (inputs: {', '.join(graph.inputs)})")
    out: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        if name not in feeds:
            raise FeedError(f"input '{name}' is missing (inputs: {', '.join(graph.inputs)})")
        value = graph.values[name]
        array = np.asarray(feeds[name])
        want = numpy_dtype(value.dtype)
        if array.dtype != want:
            if not (np.issubdtype(array.dtype, np.floating) and np.issubdtype(want, np.floating)):
                raise FeedError(f"input '{name}' must be {value.dtype}, got {array.dtype}")
            array = array.astype(want)
        if tuple(array.shape) != value.shape:
            raise FeedError(f"input '{name}' must have shape {list(value.shape)}, got {list(array.shape)}")  # type: ignore[arg-type]
        if not allow_nonfinite and np.issubdtype(array.dtype, np.floating):
            bad = int(array.size - np.count_nonzero(np.isfinite(array)))
            if bad:
                raise FeedError(f"input '{name}' has {bad} non-finite value{'s' if bad > 1 else ''} (NaN or Inf); "
                                "pass allow_nonfinite=True to InferenceSession to run it anyway")
        out[name] = array
    return out


def target_of(node: Node) -> str:
    """Where the partition put `node` ("accel" or "host"); an unpartitioned graph's accelerator ops are
    "accel"."""
    return str(node.attrs.get("target", "accel" if node.op in ACCEL_OPS else "host"))


class _Values:
    """Where each live value is: ``host`` holds arrays, ``device`` the names whose device buffer holds the
    current contents (a value can be in both)."""

    def __init__(self, host: dict[str, Any], runner: AcceleratorRunner | None):
        self.host, self.runner = host, runner
        self.device: set[str] = set()

    def get(self, name: str) -> Any:
        if name not in self.host and name in self.device:
            assert self.runner is not None
            self.host[name] = self.runner.read_value(name)
        return self.host[name]

    def stage(self, name: str) -> None:
        """Make the device buffer of `name` hold its value."""
        if name not in self.device:
            assert self.runner is not None
            self.runner.write_value(name, self.host[name])
            self.device.add(name)

    def made_on_device(self, name: str) -> None:
        self.device.add(name)
        self.host.pop(name, None)

    def made_on_host(self, name: str, array: np.ndarray) -> None:
        self.host[name] = array
        self.device.discard(name)

    def free(self, name: str) -> None:
        self.host.pop(name, None)
        self.device.discard(name)

    def all(self) -> dict[str, np.ndarray]:
        return {name: self.get(name) for name in [*self.host, *sorted(self.device - set(self.host))]}


def _last_uses(graph: Graph) -> dict[str, int]:
    last: dict[str, int] = {}
    for k, node in enumerate(graph.nodes):
        for x in node.inputs:
            if x:
                last[x] = k
    return last


def _record(node: Node, ins: list[Value | None], outs: list[Value]) -> dict[str, Any]:
    """A layer's record before it runs: name, op, target, macs (of the logical shapes), output shape."""
    record = {"name": node.name, "op": node.op, "target": target_of(node),
              "macs": macs_of(node, [v.logical_shape if v else None for v in ins], [v.logical_shape for v in outs]),
              "shape": list(outs[0].logical_shape or ())}
    if node.attrs.get("pooled"):  # the max-pool fused into this convolution (weft.compiler.pool_fusion)
        record["pooled"] = str(node.attrs["pooled"])
    return record


def walk_graph(graph: Graph, feeds: Mapping[str, Any], *, runner: AcceleratorRunner | None = None,
               keep_intermediates: bool = False, host: HostRunner | None = None) -> RunResult:
    """Run `graph` on `feeds`: accelerator layers on `runner` (on the host without one), host layers on
    `host` (default :func:`~weft.core.host.run_host_node`). With `keep_intermediates` no value is freed
    and the result holds every value by name (as the device holds it: packed integer tensors)."""
    run_host = host or run_host_node
    env = _Values({**graph.constants, **check_feeds(graph, feeds)}, runner)
    widths = widths_of(graph)
    last = {} if keep_intermediates else _last_uses(graph)
    keep = set(graph.outputs) | set(graph.constants)
    layers: list[dict[str, Any]] = []
    cycles: int | None = None if runner is None else 0
    with runner.running() if runner is not None else contextlib.nullcontext():
        for k, node in enumerate(graph.nodes):
            ins = [graph.values.get(x) if x else None for x in node.inputs]
            outs = [graph.values[o] for o in node.outputs]
            record = _record(node, ins, outs)
            start = time.perf_counter()
            if runner is not None and record["target"] == "accel":
                layer = runner.layer_info(node)
                for x in layer["inputs"]:
                    env.stage(x)
                record.update(runner.run_layer(node, layer))
                env.made_on_device(node.outputs[0])
                cycles = None if cycles is None or record["cycles"] is None else cycles + int(record["cycles"])
            else:
                args = [env.get(x) if x else None for x in node.inputs]
                for name, array in zip(node.outputs, run_host(node, args, ins, outs, widths), strict=False):
                    env.made_on_host(name, array)
                if runner is not None:
                    record.update(runner.host_fields())
            record["seconds"] = time.perf_counter() - start
            layers.append(record)
            for x in node.inputs:
                if x and last.get(x) == k and x not in keep:
                    env.free(x)
        outputs = {name: env.get(name) for name in graph.outputs}
        values = env.all() if keep_intermediates else {}
    return RunResult(outputs, values, layers, cycles)
