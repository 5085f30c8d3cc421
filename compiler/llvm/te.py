"""Tensor expressions: what each output element is, before any decision about loops.

A :class:`Stage` defines one output buffer element-wise, TVM-style::

    k = reduce_axis(K, "k")
    C = compute("C", (M, N), lambda i, j: reduce_sum(A[i, k] * B[k, j], [k]),
                epilogue=lambda acc, i, j: maximum(acc + bias[j], 0.0))

The epilogue runs once per output element after its reduction completes (bias, residual, activation
fused into the producer's loop nest instead of another pass over memory). A :class:`Kernel` is stages run
in order over global buffers: one compiled function. Each stage carries its own schedule
(:mod:`weft.compiler.llvm.schedule`), which decides the loops; the definition here never changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from weft.compiler.llvm.expr import Buffer, Expr, Load, Var, as_expr, free_vars, loads, np_dtype
from weft.compiler.llvm.schedule import Axis, Schedule

__all__ = ["Axis", "Kernel", "Reduce", "Stage", "compute", "reduce_axis", "reduce_max", "reduce_sum"]

COMBINERS = ("sum", "max", "min")


def reduce_axis(extent: int, name: str) -> Axis:
    return Axis(name, extent, reduce=True)


class Reduce:
    """``combiner`` of `source` over `axes` (all reduce axes), starting from `init`."""

    def __init__(self, combiner: str, source: Expr, axes: Sequence[Axis], init: Any = None):
        if combiner not in COMBINERS:
            raise ValueError(f"unknown combiner '{combiner}' (known: {', '.join(COMBINERS)})")
        for a in axes:
            if not a.reduce:
                raise ValueError(f"axis '{a.name}' is not a reduce axis")
        self.combiner, self.source, self.axes = combiner, source, tuple(axes)
        self.init = as_expr(init if init is not None else identity(combiner, source.dtype), source.dtype)


def identity(combiner: str, dtype: str) -> int | float:
    if combiner == "sum":
        return 0
    info_max = float("inf") if dtype in ("f32", "f64") else int(_iinfo(dtype).max)
    return -info_max if combiner == "max" else info_max


def _iinfo(dtype: str) -> Any:
    import numpy as np

    return np.iinfo(np_dtype(dtype))


def reduce_sum(source: Expr, axes: Sequence[Axis], init: Any = None) -> Reduce:
    return Reduce("sum", source, axes, init)


def reduce_max(source: Expr, axes: Sequence[Axis], init: Any = None) -> Reduce:
    return Reduce("max", source, axes, init)


class Stage(Schedule):
    """One output buffer defined element by element, plus its schedule.

    ``out[axes] = epilogue(reduction)`` when the body is a :class:`Reduce`, else ``out[axes] = body``
    (`epilogue` then applies to the body's value). `acc` is the placeholder the epilogue sees. With
    `store`, element ``axes`` goes to ``out[store(axes)]`` instead (a window of a larger buffer).
    """

    def __init__(self, out: Buffer, axes: Sequence[Axis], body: Expr | Reduce, epilogue: Expr | None,
                 acc: Var | None, store: Callable[[list[Expr]], Sequence[Expr]] | None = None):
        self.out = out
        self.axes = tuple(axes)
        self.store = store
        if isinstance(body, Reduce):
            self.reduce: Reduce | None = body
            self.value = body.source
            self.reduce_axes: tuple[Axis, ...] = body.axes
        else:
            self.reduce = None
            self.value = body
            self.reduce_axes = ()
        if self.value.dtype != out.dtype and epilogue is None:
            raise TypeError(f"stage '{out.name}': the body is {self.value.dtype} but the output is {out.dtype}")
        self.epilogue = epilogue
        self.acc = acc
        if epilogue is not None and epilogue.dtype != out.dtype:
            raise TypeError(f"stage '{out.name}': the epilogue gives {epilogue.dtype}, the output is {out.dtype}")
        known = set(self.axes) | set(self.reduce_axes) | ({acc} if acc is not None else set())
        for e in (self.value, *([epilogue] if epilogue is not None else [])):
            stray = {v.name for v in free_vars(e)} - {v.name for v in known}
            if stray:
                raise ValueError(f"stage '{out.name}' uses variables {sorted(stray)} that are not its axes")
        super().__init__(self.axes, self.reduce_axes, out.name)

    @property
    def name(self) -> str:
        return self.out.name

    def __getitem__(self, index: Any) -> Load:
        return self.out[index]

    def inputs(self) -> list[Buffer]:
        """Buffers the stage reads, in first-use order (its own output excluded)."""
        seen: dict[int, Buffer] = {}
        for e in (self.value, *([self.epilogue] if self.epilogue is not None else [])):
            for ld in loads(e):
                if ld.buffer is not self.out:
                    seen.setdefault(id(ld.buffer), ld.buffer)
        return list(seen.values())

    def __repr__(self) -> str:
        return f"Stage({self.out!r})"


def compute(name: str, shape: Sequence[int], fcompute: Callable[..., Expr | Reduce], *, dtype: str | None = None,
            epilogue: Callable[..., Expr] | None = None, buffer_shape: Sequence[int] | None = None,
            store: Callable[[list[Expr]], Sequence[Expr]] | None = None) -> Stage:
    """Define buffer `name` of `shape`: ``fcompute(*axes)`` gives an element (an expression or a
    :class:`Reduce`), ``epilogue(acc, *axes)`` optionally post-processes it. With `buffer_shape` and
    `store`, the buffer is larger than the computed elements and element ``axes`` is written at
    ``store(axes)`` (the interior of a tensor with a halo)."""
    if (buffer_shape is None) != (store is None):
        raise ValueError(f"stage '{name}': buffer_shape and store go together")
    axes = [Axis(f"{name}.{'ijklmnopq'[k] if k < 9 else k}", d) for k, d in enumerate(shape)]
    body = fcompute(*axes)
    value = body.source if isinstance(body, Reduce) else body
    if not isinstance(value, Expr):
        raise TypeError(f"stage '{name}': fcompute must return an expression or a Reduce, got {type(body).__name__}")
    acc = Var(f"{name}.acc", value.dtype)
    epi = None
    if epilogue is not None:
        epi = epilogue(acc, *axes)
        epi = as_expr(epi, value.dtype)
    out = Buffer(name, buffer_shape or shape, dtype or (epi.dtype if epi is not None else value.dtype))
    return Stage(out, axes, body, epi, acc if epi is not None else None, store)


class Kernel:
    """Stages run in order as one compiled function.

    The function's parameters are the global buffers: `inputs`, then `outputs`, then every other stage
    output (scratch memory the caller provides, listed in :attr:`temps`).
    """

    def __init__(self, name: str, inputs: Sequence[Buffer], outputs: Sequence[Buffer], stages: Sequence[Stage]):
        if not name.replace("_", "").isalnum():
            raise ValueError(f"kernel names are identifiers, got '{name}'")
        self.name = name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.stages = list(stages)
        produced = {id(s.out) for s in self.stages}
        for b in self.outputs:
            if id(b) not in produced:
                raise ValueError(f"kernel '{name}': output '{b.name}' is not computed by any stage")
        self.temps = [s.out for s in self.stages if all(s.out is not b for b in self.outputs)]
        params = self.inputs + self.outputs + self.temps
        ids = [id(b) for b in params]
        if len(set(ids)) != len(ids):
            raise ValueError(f"kernel '{name}': a buffer is listed twice")
        names = [b.name for b in params]
        if len(set(names)) != len(names):
            raise ValueError(f"kernel '{name}': buffer names must be unique, got {names}")
        known = set(ids)
        for s in self.stages:
            for b in s.inputs():
                if id(b) not in known and b.scope == "global":
                    raise ValueError(f"kernel '{name}': stage '{s.name}' reads '{b.name}', which is neither an "
                                     "input nor computed by a stage")

    @property
    def params(self) -> list[Buffer]:
        return self.inputs + self.outputs + self.temps

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, {len(self.stages)} stages, params={[b.name for b in self.params]})"
