"""An interpreter of lowered statements, with GPU thread semantics: the oracle for GPU lowering on a machine
without a GPU.

Every stage runs as its launch would: for each block of the grid, one Python generator per thread, stepped
in lockstep from barrier to barrier (a thread that finishes while others wait at a barrier is reported:
that is a deadlock on real hardware). Loads outside a buffer raise instead of reading garbage. Arithmetic
follows the dtypes: float32 rounding per operation, integers wrapped to their width. It is slow (Python
per element) and meant for small shapes in tests.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from weft.compiler.llvm.expr import Bin, Buffer, Call, Cast, Const, Expr, Load, Select, Var, is_float, np_dtype
from weft.compiler.llvm.lower import Barrier, For, If, LoweredKernel, LoweredStage, Seq, Stmt, Store, lower
from weft.compiler.llvm.te import Kernel

__all__ = ["InterpreterError", "interpret"]


class InterpreterError(RuntimeError):
    """A lowered kernel that would misbehave: an out-of-bounds access or a barrier not every thread reaches."""


def interpret(kernel: Kernel | LoweredKernel, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run `kernel` on `arrays` (by parameter name; missing outputs and temps are allocated) and return
    every parameter's array."""
    lk = lower(kernel) if isinstance(kernel, Kernel) else kernel
    mem: dict[Buffer, np.ndarray] = {}
    for p in lk.params:
        if p.name in arrays:
            mem[p] = np.ascontiguousarray(arrays[p.name], np_dtype(p.dtype)).reshape(p.shape).copy()
        else:
            mem[p] = np.zeros(p.shape, np_dtype(p.dtype))
    for stage in lk.stages:
        _run_stage(stage, mem)
    return {p.name: mem[p] for p in lk.params}


def _dims(launch: Mapping[str, int], kind: str) -> list[tuple[int, int, int]]:
    x, y, z = (launch.get(f"{kind}.{a}", 1) for a in "xyz")
    return [(i, j, k) for k, j, i in itertools.product(range(z), range(y), range(x))]


def _run_stage(stage: LoweredStage, mem: dict[Buffer, np.ndarray]) -> None:
    for block in _dims(stage.launch, "blockIdx"):
        shared = {s: np.zeros(s.shape, np_dtype(s.dtype)) for s in stage.scratch if s.scope == "shared"}
        threads = []
        for tid in _dims(stage.launch, "threadIdx"):
            ids = {f"blockIdx.{a}": v for a, v in zip("xyz", block, strict=True)}
            ids.update({f"threadIdx.{a}": v for a, v in zip("xyz", tid, strict=True)})
            local = {s: np.zeros(s.shape, np_dtype(s.dtype)) for s in stage.scratch if s.scope == "local"}
            threads.append(_Thread(ids, {**mem, **shared, **local}).run(stage.body))
        _lockstep(stage.name, threads)


def _lockstep(name: str, threads: list[Iterator[None]]) -> None:
    alive = list(threads)
    while alive:
        waiting, done = [], 0
        for t in alive:
            try:
                next(t)
                waiting.append(t)
            except StopIteration:
                done += 1
        if waiting and done:
            raise InterpreterError(f"stage '{name}': {done} threads finished while {len(waiting)} wait at a barrier")
        alive = waiting


class _Thread:
    def __init__(self, ids: dict[str, int], mem: dict[Buffer, np.ndarray]):
        self.ids = ids
        self.mem = mem
        self.env: dict[Var, Any] = {}

    def run(self, s: Stmt) -> Iterator[None]:
        if isinstance(s, Seq):
            for x in s.stmts:
                yield from self.run(x)
        elif isinstance(s, For):
            if s.kind in self.ids:
                self.env[s.var] = self.ids[s.kind]
                yield from self.run(s.body)
            else:
                for i in range(s.extent):
                    self.env[s.var] = i
                    yield from self.run(s.body)
        elif isinstance(s, Store):
            self.mem[s.buffer][self._index(s.buffer, s.indices)] = self.eval(s.value)
        elif isinstance(s, If):
            if self.eval(s.cond):
                yield from self.run(s.then)
        elif isinstance(s, Barrier):
            yield
        else:
            raise InterpreterError(f"unknown statement {type(s).__name__}")

    def _index(self, buf: Buffer, indices: tuple[Expr, ...]) -> tuple[int, ...]:
        idx = tuple(int(self.eval(i)) for i in indices)
        if any(not 0 <= i < d for i, d in zip(idx, buf.shape, strict=True)):
            raise InterpreterError(f"access {list(idx)} outside buffer {buf!r}")
        return idx

    def eval(self, e: Expr) -> Any:
        if isinstance(e, Const):
            return _value(e.value, e.dtype)
        if isinstance(e, Var):
            return self.env[e]
        if isinstance(e, Load):
            return _value(self.mem[e.buffer][self._index(e.buffer, e.indices)], e.dtype)
        if isinstance(e, Bin):
            return _binary(e.op, self.eval(e.a), self.eval(e.b), e.a.dtype)
        if isinstance(e, Select):
            return self.eval(e.t) if self.eval(e.cond) else self.eval(e.f)
        if isinstance(e, Cast):
            return _cast(self.eval(e.x), e.x.dtype, e.dtype)
        if isinstance(e, Call):
            xs = [self.eval(a) for a in e.args]
            fn = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "fabs": np.abs, "rint": np.rint,
                  "pow": np.power}
            return _value(fn[e.fn](*xs), e.dtype)
        raise InterpreterError(f"cannot evaluate {type(e).__name__}")


def _value(v: Any, dtype: str) -> Any:
    if dtype == "bool":
        return bool(v)
    if is_float(dtype):
        return np_dtype(dtype).type(v)
    return _wrap(int(v), dtype)


def _wrap(v: int, dtype: str) -> int:
    bits = np_dtype(dtype).itemsize * 8
    if dtype == "u8":
        return v & 0xFF
    half = 1 << (bits - 1)
    return ((v + half) % (1 << bits)) - half


def _binary(op: str, a: Any, b: Any, dtype: str) -> Any:
    if op in ("<", "<=", ">", ">=", "==", "!="):
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[op]
    if op == "and":
        return a and b
    if op == "or":
        return a or b
    if op == "min":
        return a if a < b else b
    if op == "max":
        return a if a > b else b
    if is_float(dtype):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if op == "/":
                r = a / b if b != 0 else _div0(a, b)
            else:
                r = {"+": np.add, "-": np.subtract, "*": np.multiply}[op](a, b)
        return np_dtype(dtype).type(r)
    if op == "//":
        return _wrap(math.trunc(a / b) if (a < 0) != (b < 0) else a // b, dtype)  # LLVM sdiv truncates
    if op == "%":
        return _wrap(a - b * (math.trunc(a / b) if (a < 0) != (b < 0) else a // b), dtype)
    ops = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "<<": lambda: a << b, ">>": lambda: a >> b,
           "&": lambda: a & b, "|": lambda: a | b, "^": lambda: a ^ b}
    return _wrap(ops[op](), dtype)


def _div0(a: Any, b: Any) -> Any:
    return np.float32(np.inf if a > 0 else -np.inf if a < 0 else np.nan)


def _cast(v: Any, src: str, dst: str) -> Any:
    if dst == src:
        return v
    if dst == "bool":
        return bool(v != 0)
    if is_float(dst):
        return np_dtype(dst).type(v)
    if is_float(src):
        return _wrap(math.trunc(float(v)), dst)
    return _wrap(int(v), dst)


def interpret_plan(plan: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run every step of a host plan (:mod:`~weft.compiler.llvm.graph`) through the interpreter, with the
    schedules its kernels carry now (GPU ones after :func:`~weft.compiler.llvm.cuda.gpu_steps`), and
    return the graph outputs. Allocates the plan's arrays if needed."""
    from weft.compiler.llvm.graph import allocate_host  # optional dependency: llvmlite
    from weft.compiler.llvm.hostplan import plain_copy  # optional dependency: llvmlite (the JIT)

    if any(t.root().array is None for t in plan.tensors):
        allocate_host(plan)
    for name, t in plan.inputs.items():
        np.copyto(t.flat().reshape(t.physical), np.asarray(feeds[name]).reshape(t.physical), casting="same_kind")
    for step in plan.steps:
        if step.kernel is None:
            step.run(1)
            continue
        params = step.kernel.params
        views = {p.name: t.flat(p.size).reshape(p.shape) for p, t in zip(params, step.args, strict=True)}
        results = interpret(step.kernel, views)
        for p in params[len(step.kernel.inputs):]:
            views[p.name][...] = results[p.name]
    return {name: plain_copy(t) for name, t in plan.outputs.items()}
