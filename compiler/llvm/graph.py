"""Graphs to host code: plan every node's kernels, compile them (cached by IR hash), allocate, run.

:func:`plan_graph` walks an IR graph in order and lets each op's handler choose kernels and layouts
(:mod:`~weft.compiler.llvm.host_float` for float ops, :mod:`~weft.compiler.llvm.host_quant` for the
integer layers of quantized graphs). A conversion kernel is inserted only where a consumer needs another
layout than its producer gave, reshapes of plain tensors are free, and identical kernels (the repeated
layers of a ResNet) compile once. The :class:`~weft.compiler.llvm.hostplan.HostPlan` owns every buffer and
calls the kernels with prepared pointer arrays: no Python inside any loop of a kernel.

An op with a numpy kernel (``FLOAT_OPS``) but no handler is not refused: it becomes a numpy step that runs
its kernel on the plain arrays of its inputs, between the compiled steps; the per-layer figures say which
ran each node (``"kernel": "llvm"`` or ``"numpy"``), and :func:`cross_compile` and the cuda device, which
have no Python to run it, refuse such a plan.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from weft.compiler.fusion import fuse_host_affine
from weft.compiler.llvm.codegen_cpu import render_module
from weft.compiler.llvm.expr import dtype_of_numpy, np_dtype
from weft.compiler.llvm.host_float import FLOAT_HANDLERS, plan_halos
from weft.compiler.llvm.host_ops import OP_HANDLERS
from weft.compiler.llvm.host_quant import QUANT_HANDLERS, QUANT_OPS
from weft.compiler.llvm.hostplan import HostPlan, Planner, Step, Tensor
from weft.compiler.llvm.jit import CompiledKernel, compile_ir, compile_object
from weft.compiler.llvm.layout import PLAIN
from weft.compiler.llvm.target import Target, host_target, resolve_target
from weft.compiler.llvm.te import Kernel
from weft.compiler.pool_fusion import unfuse_pools
from weft.compiler.tune.host import tuned_schedules
from weft.core.errors import UnsupportedError
from weft.core.float_ops import macs_of
from weft.core.ir import Graph, numpy_dtype

if TYPE_CHECKING:
    from weft.compiler.llvm.nn import ConvSchedule
    from weft.compiler.tune.log import TuningLog

__all__ = ["HostPlan", "allocate_host", "concat_in_place", "cross_compile", "plan_graph", "plan_steps",
           "refuse_numpy_steps"]


def plan_steps(graph: Graph, target: Target, tuned: Mapping[str, ConvSchedule] | None = None) -> HostPlan:
    """The layouts, tensors and kernel steps of `graph` for `target`, not yet compiled or allocated.
    `tuned`: conv workload key -> schedule (from a tuning log); other convolutions take the heuristic's."""
    graph = unfuse_pools(fuse_host_affine(graph))  # a fused max-pool runs as its own kernel here
    p = Planner(graph, target, {**FLOAT_HANDLERS, **OP_HANDLERS, **QUANT_HANDLERS}, QUANT_OPS)
    p.tuned = dict(tuned or {})
    p.halos = plan_halos(graph)
    inputs = {}
    for name in graph.inputs:
        v = graph.values[name]
        inputs[name] = p.new(name, v.shape or (), PLAIN, _ir_dtype(v.dtype, name))
    layers = []
    for node in graph.nodes:
        p.node(node)
        ins = [graph.values[x].logical_shape if x else None for x in node.inputs]
        outs = [graph.values[o].logical_shape for o in node.outputs]
        layers.append((node.name, node.op, macs_of(node, ins, outs), list(outs[0] or ())))
    outputs = {name: p.primary[name] if name in p.primary else p.get(name) for name in graph.outputs}
    return HostPlan(graph, target, p.steps, inputs, outputs, p.all, layers, 0.0, dict(p.primary), convs=p.convs,
                    algorithms=p.algorithms)


def plan_graph(graph: Graph, target: Target | None = None, *, cache_dir: str | Path | None = None,
               compile_threads: int | None = None, tuning_log: str | Path | TuningLog | None = None,
               threads: int | None = None) -> HostPlan:
    """Plan, compile and allocate `graph` for the host (see the module docstring).

    `tuning_log`: a ``weft tune --target cpu`` log; each convolution whose workload the log timed on this
    machine with `threads` threads (required with a log: timings depend on it) takes its fastest logged
    schedule (:func:`weft.compiler.tune.host.tuned_schedules`), the others the heuristic's tiles.
    ``plan.convs`` says which schedule each convolution got."""
    target = target or host_target()
    tuned = None
    if tuning_log is not None:
        if threads is None:
            raise ValueError("plan_graph: a tuning log needs `threads` (tuning records are per thread count)")

        tuned = tuned_schedules(tuning_log, threads, target)
    plan = plan_steps(graph, target, tuned)
    concat_in_place(plan)
    start = time.perf_counter()
    _compile(plan.steps, plan.target, cache_dir, compile_threads)
    plan.compile_seconds = time.perf_counter() - start
    allocate_host(plan)
    return plan


def concat_in_place(plan: HostPlan) -> int:
    """Let the producers of a concatenation whose parts are consecutive ranges of its output (whole channel
    blocks of one image, (1, C/b, H, W, b); or plain parts with only ones before the axis) write them
    straight into it, and drop its copy: each part becomes a view of the output at its offset (DenseNet's
    chain of concatenations ends up as views of each dense block's last one). A part qualifies when it is computed here
    (no graph input, constant or view of another tensor), has the output's layout and dtype and appears
    once; a concatenation with any part that does not keeps its copy. Returns how many copies went.

    Host plans only: the GPU and the boards' objects keep one buffer a tensor."""
    inputs = {id(t) for t in plan.inputs.values()}
    dropped: set[int] = set()
    for step in reversed(plan.steps):  # the last concatenation first: earlier ones land inside it
        if step.kind != "concat_ranges":
            continue
        *parts, y = step.args
        if len({id(t) for t in parts}) != len(parts):
            continue
        if not all(t.alias_of is None and not t.constant and t.array is None and id(t) not in inputs
                   and t.layout == y.layout and t.dtype == y.dtype for t in parts):
            continue
        offset = 0
        for t in parts:
            t.alias_of, t.offset = y, offset
            offset += int(np.prod(t.physical, dtype=np.int64))
        dropped.add(id(step))
    plan.steps = [s for s in plan.steps if id(s) not in dropped]
    return len(dropped)


def cross_compile(graph: Graph, target: str | Target, cache_dir: str | Path | None = None
                  ) -> tuple[bytes, list[dict[str, object]]]:
    """One ELF object file with every kernel of `graph` for a board's CPU ("armv7": Pynq-Z1/Z2's
    Cortex-A9, "aarch64": UltraScale+), planned for that CPU's SIMD width and registers, and the call
    sequence: per step its symbol, node and buffers (name, shape, dtype, in the kernel's ABI order).
    Buffers must start zeroed (the halos of blocked tensors are never written) and the object needs
    libpthread at link time."""
    target = resolve_target(target)
    plan = plan_steps(graph, target)
    refuse_numpy_steps(plan, f"an object file for {target.name}")
    kernels, calls = [], []
    for k, step in enumerate(plan.steps):
        assert step.kernel is not None
        symbol = f"weft_k{k}_{step.kernel.name}"
        kernels.append(Kernel(symbol, step.kernel.inputs, step.kernel.outputs, step.kernel.stages))
        calls.append({"symbol": symbol, "node": step.node,
                      "buffers": [{"name": t.name, "shape": list(b.shape), "dtype": b.dtype}
                                  for t, b in zip(step.args, step.kernel.params, strict=True)]})
    text = render_module(kernels, target, graph.name)
    return compile_object(text, target, cache_dir=cache_dir), calls


def refuse_numpy_steps(plan: HostPlan, what: str) -> None:
    """UnsupportedError naming the first node of `plan` that runs through numpy (only the host's Python
    process has numpy: `what` must be generated code throughout)."""
    for step in plan.numpy_steps():
        op = step.host.op  # type: ignore[union-attr]
        raise UnsupportedError(f"{what} needs generated code for every node; this {op} node has only a numpy "
                               "kernel (it runs on the cpu device's host fallback)", node=step.node, op=op)


def allocate_host(plan: HostPlan) -> None:
    """Give every tensor of `plan` its (64-byte aligned) array, and every step its pointer array."""
    _allocate(plan.tensors, plan.steps)


def _ir_dtype(dtype: str, name: str) -> str:
    try:
        return dtype_of_numpy(numpy_dtype(dtype))
    except ValueError:
        raise UnsupportedError(f"input '{name}' has dtype {dtype}, which host kernels do not take") from None


def _compile(steps: Sequence[Step], target: Target, cache_dir: str | Path | None, threads: int | None) -> None:
    steps = [s for s in steps if s.kernel is not None]
    texts = [render_module([s.kernel], target, s.kernel.name) for s in steps]  # type: ignore[list-item,union-attr]
    unique = list(dict.fromkeys(texts))
    workers = max(1, min(threads or os.cpu_count() or 1, len(unique)))
    with ThreadPoolExecutor(workers) as pool:  # LLVM runs outside the GIL
        modules = dict(zip(unique, pool.map(lambda t: compile_ir(t, target, cache_dir=cache_dir), unique),
                           strict=True))
    for s, text in zip(steps, texts, strict=True):
        s.compiled = CompiledKernel(s.kernel, modules[text])


def _allocate(tensors: Sequence[Tensor], steps: Sequence[Step]) -> None:
    # every buffer, constants copied in, from one arena of huge pages: a network streams its weights from
    # DRAM on every run, and 4 KiB pages cost a TLB miss every 64 cache lines (a 4 MB layer of weights
    # read from DRAM: 1.0 -> 0.86 ms on an AVX-512 Xeon)
    roots = [t for t in tensors if t.alias_of is None]
    places, total = [], 0
    for t in roots:
        dtype = t.array.dtype if t.array is not None else np_dtype(t.dtype)
        nbytes = t.array.nbytes if t.array is not None else int(np.prod(t.physical, dtype=np.int64)) * dtype.itemsize
        places.append((t, total, nbytes, dtype))
        total += -(-nbytes // 64) * 64
    arena = _arena(total)
    for t, offset, nbytes, dtype in places:
        view = arena[offset: offset + nbytes].view(dtype)
        if t.array is not None:
            view = view.reshape(t.array.shape)
            view[...] = t.array
        t.array = view
    for s in steps:
        if s.kernel is None:  # a numpy step reads its tensors' arrays directly
            continue
        ptrs = []
        for t, b in zip(s.args, s.kernel.params, strict=True):
            root = t.root()
            arr = root.array
            start = t.root_offset()
            if arr is None or arr.size - start < b.size * np_dtype(b.dtype).itemsize // arr.itemsize:
                raise AssertionError(f"step of '{s.node}': buffer '{b.name}' needs {b.size} elements, tensor "
                                     f"'{t.name}' has {0 if arr is None else arr.size - start}")
            ptrs.append(arr.ctypes.data + start * arr.itemsize)
        s.pointers = (ctypes.c_void_p * len(ptrs))(*ptrs)


#: the huge page size the arena is aligned to (x86-64 and AArch64 with 4 KiB base pages)
HUGE_PAGE = 2 << 20


def _arena(nbytes: int) -> np.ndarray:
    """`nbytes` zeroed bytes starting on a :data:`HUGE_PAGE` boundary, in anonymous memory that the kernel is
    asked to back with transparent huge pages (where it has them: otherwise ordinary pages, same bytes)."""
    size = max(nbytes, 1) + HUGE_PAGE
    try:
        region = mmap.mmap(-1, size)
    except (OSError, ValueError):  # no anonymous mmap here: an ordinary aligned allocation
        raw = np.zeros(size, np.uint8)
    else:
        advice = getattr(mmap, "MADV_HUGEPAGE", None)
        if advice is not None:
            try:
                region.madvise(advice)
            except OSError:  # a kernel without transparent huge pages
                pass
        raw = np.frombuffer(region, np.uint8)  # (the array keeps the mapping alive)
    offset = (-raw.ctypes.data) % HUGE_PAGE
    return raw[offset: offset + nbytes]
