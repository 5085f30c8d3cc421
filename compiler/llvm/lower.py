"""Lowering: a scheduled kernel becomes loop statements that a code generator walks once.

Statements are deliberately few: :class:`For` (with its kind from the schedule), :class:`Seq`,
:class:`Store`, :class:`If` and :class:`Barrier`. Local and shared buffers (register tiles, cached
regions) are listed on the :class:`LoweredStage`, not scoped in the tree: the CPU generator makes them
stack arrays of the function that runs the stage, the GPU generator shared-memory globals.

A reduction with its first reduce loop at position p lowers as (TVM's rule)::

    for <loops before p>:
        for <spatial loops after p>: acc[...] = init
        for <loops from p on>:       acc[...] = combine(acc[...], value)
        for <spatial loops after p>: out[...] = epilogue(acc[...])

where ``acc`` is the output itself, or a local buffer with ``cache_write``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from weft.compiler.llvm.expr import (
    Buffer,
    Expr,
    Load,
    const,
    free_vars,
    linear,
    loads,
    maximum,
    minimum,
    rebuild,
    simplify,
    substitute,
)
from weft.compiler.llvm.schedule import THREAD_TAGS, Axis, CacheRead, ScheduleError
from weft.compiler.llvm.te import Kernel, Stage

__all__ = ["Barrier", "For", "If", "LoweredKernel", "LoweredStage", "Seq", "Stmt", "Store", "lower"]


class Stmt:
    __slots__ = ()


@dataclass(eq=False)
class For(Stmt):
    var: Axis
    kind: str
    body: Stmt

    @property
    def extent(self) -> int:
        return self.var.extent


@dataclass(eq=False)
class Seq(Stmt):
    stmts: list[Stmt]


@dataclass(eq=False)
class Store(Stmt):
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr


@dataclass(eq=False)
class If(Stmt):
    cond: Expr
    then: Stmt


@dataclass(eq=False)
class Barrier(Stmt):
    """GPU: every thread of the block waits here (around shared-memory copies)."""


@dataclass(eq=False)
class LoweredStage:
    name: str
    body: Stmt
    #: local/shared buffers the body uses, allocated once per function (or block)
    scratch: list[Buffer] = field(default_factory=list)
    #: GPU launch: thread tag -> extent, for the loops bound to the grid and the block
    launch: dict[str, int] = field(default_factory=dict)


@dataclass(eq=False)
class LoweredKernel:
    name: str
    params: list[Buffer]
    stages: list[LoweredStage]


def lower(kernel: Kernel) -> LoweredKernel:
    """Turn every scheduled stage of `kernel` into statements (schedule errors name the stage)."""
    return LoweredKernel(kernel.name, kernel.params, [lower_stage(s) for s in kernel.stages])


def _nest(loops: Sequence[Axis], stage: Stage, body: Stmt) -> Stmt:
    for a in reversed(loops):
        body = For(a, stage.kind(a), body)
    return body


def _guarded(conds: Sequence[Expr], body: Stmt) -> Stmt:
    if not conds:
        return body
    cond = conds[0]
    for c in conds[1:]:
        cond = cond.logical_and(c)
    return If(cond, body)


def _combine(combiner: str, acc: Expr, value: Expr) -> Expr:
    if combiner == "sum":
        return acc + value
    if combiner == "max":
        return maximum(acc, value)
    return minimum(acc, value)


def _check(stage: Stage) -> None:
    leaves = stage.leaves
    for k, a in enumerate(leaves):
        kind = stage.kind(a)
        if kind == "parallel" and (k != 0 or a.reduce):
            raise ScheduleError(f"stage '{stage.name}': only the outermost spatial loop can be parallel, "
                                f"'{a.name}' is loop {k}" + (" (a reduce loop)" if a.reduce else ""))
        if kind == "vectorize" and a.reduce:
            raise ScheduleError(f"stage '{stage.name}': cannot vectorize reduce loop '{a.name}'")
        if kind in THREAD_TAGS and a.reduce and kind != "threadIdx.x":
            raise ScheduleError(f"stage '{stage.name}': a reduce loop can only be bound to threadIdx.x (a cross-thread "
                                f"reduction), not '{a.name}' to {kind}")
    bound = [k for k, a in enumerate(leaves) if stage.kind(a) in THREAD_TAGS]
    if bound and bound != list(range(len(bound))):
        raise ScheduleError(f"stage '{stage.name}': loops bound to GPU threads must be the outermost ones")
    tags = [stage.kind(leaves[k]) for k in bound]
    if len(set(tags)) != len(tags):
        raise ScheduleError(f"stage '{stage.name}': a thread tag is bound twice ({tags})")
    vec = [a for a in leaves if stage.kind(a) == "vectorize"]
    if len(vec) > 1:
        raise ScheduleError(f"stage '{stage.name}': only one loop can be vectorized")
    if vec:
        spatial_tail = [a for a in leaves if not a.reduce]
        if leaves[-1] is not vec[0] or (stage.reduce is not None and spatial_tail[-1] is not vec[0]):
            raise ScheduleError(f"stage '{stage.name}': the vectorized loop '{vec[0].name}' must be innermost")
        for g, _ in stage.guards:
            if vec[0] in free_vars(g):
                raise ScheduleError(f"stage '{stage.name}': vectorized loop '{vec[0].name}' needs a guard; pick a "
                                    "split factor that divides the extent")


def lower_stage(stage: Stage) -> LoweredStage:
    _check(stage)
    roots = stage.root_value
    leaves = stage.leaves
    out_idx = tuple(roots[a] for a in stage.axes)
    if stage.store is not None:
        out_idx = tuple(stage.store(list(out_idx)))
    value = substitute(stage.value, roots)
    scratch: list[Buffer] = []
    launch = {stage.kind(a): a.extent for a in leaves if stage.kind(a) in THREAD_TAGS}
    spatial_guards = [g for g, red in stage.guards if not red]
    all_guards = [g for g, _ in stage.guards]
    caches = [_cache_read(stage, c, value) for c in stage.cache_reads]
    value = _rewrite_loads(value, {id(c.load): c for c in caches})
    scratch += [c.cache for c in caches]

    def epi(x: Expr) -> Expr:
        if stage.epilogue is None:
            return x
        return substitute(stage.epilogue, {**roots, stage.acc: x})  # type: ignore[dict-item]

    if stage.reduce is None:
        body = _with_caches(stage, leaves, caches, _guarded(all_guards, Store(stage.out, out_idx, epi(value))))
        return LoweredStage(stage.name, body, scratch, launch)
    cross = [a for a in leaves if a.reduce and stage.kind(a) == "threadIdx.x"]
    if cross:
        return _lower_cross_thread(stage, cross[0], value, out_idx, epi, launch)

    p = next(k for k, a in enumerate(leaves) if a.reduce)
    outer, inner = leaves[:p], leaves[p:]
    inner_spatial = [a for a in inner if not a.reduce]
    if stage.cached:
        acc_buf = Buffer(f"{stage.name}.acc", [a.extent for a in inner_spatial] or [1], stage.value.dtype, "local")
        acc_idx: tuple[Expr, ...] = tuple(inner_spatial) or (const(0),)
        scratch.append(acc_buf)
    else:
        if stage.value.dtype != stage.out.dtype:
            raise ScheduleError(f"stage '{stage.name}' accumulates {stage.value.dtype} into a {stage.out.dtype} "
                                "output: use cache_write")
        acc_buf, acc_idx = stage.out, out_idx
    init = substitute(stage.reduce.init, roots)
    acc_load = Load(acc_buf, acc_idx)
    main = Store(acc_buf, acc_idx, _combine(stage.reduce.combiner, acc_load, value))
    inner_caches = [c for c in caches if any(c.spec.at is a for a in inner)]
    # guards over the outer loops alone wrap the whole reduction once, unless threads must all reach barriers
    outer_vars = set(outer)
    hoisted = [] if caches else [g for g, red in stage.guards if not red and free_vars(g) <= outer_vars]
    spatial_guards = [g for g in spatial_guards if all(g is not h for h in hoisted)]
    all_guards = [g for g in all_guards if all(g is not h for h in hoisted)]
    parts: list[Stmt] = [
        _nest(inner_spatial, stage, _guarded(spatial_guards, Store(acc_buf, acc_idx, init))),
        _with_caches(stage, inner, inner_caches, _guarded(all_guards, main)),
    ]
    if stage.cached or stage.epilogue is not None:
        parts.append(_nest(inner_spatial, stage, _guarded(spatial_guards, Store(stage.out, out_idx, epi(acc_load)))))
    body = _with_caches(stage, outer, [c for c in caches if c not in inner_caches], _guarded(hoisted, Seq(parts)))
    return LoweredStage(stage.name, body, scratch, launch)


def _lower_cross_thread(stage: Stage, tx: Axis, value: Expr, out_idx: tuple[Expr, ...], epi: Callable[[Expr], Expr],
                        launch: dict[str, int]) -> LoweredStage:
    """A reduction whose loop `tx` is bound to threadIdx.x: each thread reduces its share serially, then
    the block combines the partial results in shared memory in log2(threads) halving steps::

        acc = init; for <serial reduce loops>: acc = combine(acc, value)   # every thread
        red[tx] = acc; barrier
        for s in T/2, T/4, ..., 1: if tx < s: red[tx] = combine(red[tx], red[tx + s]); barrier
        if tx == 0: out[...] = epilogue(red[0])
    """
    leaves = stage.leaves
    bound = [a for a in leaves if stage.kind(a) in THREAD_TAGS]
    serial = [a for a in leaves if stage.kind(a) not in THREAD_TAGS]
    others = [a for a in bound if a is not tx and stage.kind(a).startswith("threadIdx")]
    if others or any(not a.reduce for a in serial) or stage.cache_reads:
        raise ScheduleError(f"stage '{stage.name}': a cross-thread reduction needs every spatial loop bound to "
                            "blockIdx, and no other threadIdx loop or cache_read")
    threads = tx.extent
    if threads & (threads - 1):
        raise ScheduleError(f"stage '{stage.name}': a cross-thread reduction needs a power-of-two thread count, "
                            f"'{tx.name}' has {threads}")
    assert stage.reduce is not None
    dtype = stage.value.dtype
    acc = Buffer(f"{stage.name}.acc", (1,), dtype, "local")
    red = Buffer(f"{stage.name}.red", (threads,), dtype, "shared")
    zero = (const(0),)
    combine = stage.reduce.combiner
    spatial_guards = [g for g, r in stage.guards if not r]
    partial = _guarded([g for g, _ in stage.guards], Store(acc, zero, _combine(combine, Load(acc, zero), value)))
    body: list[Stmt] = [
        Store(acc, zero, substitute(stage.reduce.init, stage.root_value)),
        _nest(serial, stage, partial),
        Store(red, (tx,), Load(acc, zero)),
        Barrier(),
    ]
    step = threads // 2
    while step:
        merged = _combine(combine, Load(red, (tx,)), Load(red, (tx + step,)))
        body += [If(tx.lt(step), Store(red, (tx,), merged)), Barrier()]
        step //= 2
    body.append(_guarded([tx.eq(0), *spatial_guards], Store(stage.out, out_idx, epi(Load(red, zero)))))
    return LoweredStage(stage.name, _nest(bound, stage, Seq(body)), [acc, red], launch)


# ---- cache_read ----------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Cache:
    spec: CacheRead
    cache: Buffer
    #: per buffer dimension: the index base (over loops outside `at`) and the varying part's low end
    bases: list[Expr]
    load: Load
    offsets: list[Expr]



def _rewrite_loads(e: Expr, caches: dict[int, _Cache]) -> Expr:
    """`e` with each cached load reading its cache instead (one pass: loads keep their identity until
    replaced)."""
    if not caches:
        return e

    def go(x: Expr) -> Expr:
        c = caches.get(id(x))
        if c is not None:
            return Load(c.cache, c.offsets)
        return rebuild(x, go)

    return go(e)


def _cache_read(stage: Stage, spec: CacheRead, value: Expr) -> _Cache:
    found = [ld for ld in _loads(value) if ld.buffer is spec.buffer]
    if len(found) != 1:
        raise ScheduleError(f"stage '{stage.name}': cache_read of '{spec.buffer.name}' needs exactly one read of it, "
                            f"found {len(found)}")
    load = found[0]
    k = stage.leaves.index(spec.at)
    varying = [a for a in stage.leaves[k + 1:]] + [a for a in stage.leaves[:k] if stage.kind(a).startswith("thread")]
    shape, bases, offsets = [], [], []
    for d, idx in enumerate(load.indices):
        rest, lo, hi, part = idx, 0, 0, None
        for v in varying:
            lin = linear(rest, v)
            if lin is None:
                raise ScheduleError(f"stage '{stage.name}': cannot cache '{spec.buffer.name}': index {d} ({idx!r}) is "
                                    f"not affine in loop '{v.name}'")
            c, rest = lin
            if c:
                span = c * (v.extent - 1)
                lo, hi = lo + min(0, span), hi + max(0, span)
                term = v * c
                part = term if part is None else part + term
        shape.append(hi - lo + 1)
        bases.append(simplify(rest + lo))
        offsets.append(simplify((part if part is not None else const(0)) - lo))
    cache = Buffer(f"{stage.name}.{spec.buffer.name}.{spec.scope}", shape, spec.buffer.dtype, spec.scope)
    return _Cache(spec, cache, bases, load, offsets)


def _loads(e: Expr) -> list[Load]:
    return loads(e)


def _copy(stage: Stage, c: _Cache) -> Stmt:
    """The statements filling cache `c`: cooperative over the block's threads on GPUs, a loop nest on CPUs."""
    shape = c.cache.shape
    total = c.cache.size
    threads = [a for a in stage.leaves if stage.kind(a).startswith("threadIdx")]
    idx_vars = [Axis(f"{c.cache.name}.c{d}", n) for d, n in enumerate(shape)]

    def element(pos: Sequence[Expr]) -> Stmt:
        src = [simplify(b + p) for b, p in zip(c.bases, pos, strict=True)]
        inside = [s.ge(0).logical_and(s.lt(n)) for s, n in zip(src, c.spec.buffer.shape, strict=True)]
        return _guarded(inside, Store(c.cache, tuple(pos), Load(c.spec.buffer, src)))

    if not threads:
        body = element(idx_vars)
        for a in reversed(idx_vars):
            body = For(a, "serial", body)
        return body
    # flat thread id over the block, and each thread copying every nthreads-th element
    tid: Expr = const(0)
    nthreads = 1
    for a in sorted(threads, key=lambda a: stage.kind(a), reverse=True):  # z, y, x: x fastest
        tid = tid * a.extent + a
        nthreads *= a.extent
    rounds = Axis(f"{c.cache.name}.r", -(-total // nthreads))
    flat = simplify(rounds * nthreads + tid)
    pos, rem = [], flat
    for d in range(len(shape)):
        inner = 1
        for n in shape[d + 1:]:
            inner *= n
        pos.append(simplify(rem // inner if d == 0 else (rem // inner) % shape[d]))
    return For(rounds, "serial", _guarded([flat.lt(total)], element(pos)))


def _with_caches(stage: Stage, loops: Sequence[Axis], caches: Sequence[_Cache], body: Stmt) -> Stmt:
    """Nest `body` in `loops`, filling each cache at the top of the body of its `at` loop."""
    for k in range(len(loops) - 1, -1, -1):
        a = loops[k]
        mine = [c for c in caches if c.spec.at is a]
        if mine:
            sync = any(c.cache.scope == "shared" for c in mine)
            fills: list[Stmt] = [_copy(stage, c) for c in mine]
            body = Seq([*fills, *([Barrier()] if sync else []), body, *([Barrier()] if sync else [])])
        body = For(a, stage.kind(a), body)
    placed = {id(a) for a in loops}
    for c in caches:
        if id(c.spec.at) not in placed:
            raise ScheduleError(f"stage '{stage.name}': cache_read of '{c.spec.buffer.name}' at '{c.spec.at.name}', "
                                "which is not one of its loops")
    return body
