"""Render lowered kernels to LLVM IR for a CPU: one entry point per kernel, threads through pthreads.

Every kernel has the same C signature, so one ctypes prototype calls them all::

    void NAME(void **buffers, int32_t nthreads);

``buffers`` holds the kernel's parameters in :attr:`Kernel.params` order. Each stage becomes an internal
function taking its buffers as ``noalias`` pointers (so LLVM may keep values in registers across stores)
and a ``[begin, end)`` range of its outermost loop. A stage whose outermost loop is ``parallel`` runs
through ``weft.parallel_for``: the calling thread and up to ``nthreads - 1`` pthreads take chunks of
iterations from an atomic counter until none remain, so a slow thread (a busy core) never holds the
others back; with one thread, or one iteration, no thread is created at all.
"""

from __future__ import annotations

from collections.abc import Sequence

import llvmlite.ir as ir

from weft.compiler.llvm.emit import I32, I64, Emitter, ir_type
from weft.compiler.llvm.expr import Buffer
from weft.compiler.llvm.lower import For, LoweredKernel, LoweredStage, lower
from weft.compiler.llvm.target import Target
from weft.compiler.llvm.te import Kernel

__all__ = ["MAX_THREADS", "render_cpu", "render_module"]

#: threads one parallel loop may use (the stack array of thread handles has this many slots)
MAX_THREADS = 256
PTR = ir.PointerType()


def render_module(kernels: Sequence[Kernel], target: Target, name: str = "weft") -> str:
    """LLVM IR text of a module holding `kernels` for CPU `target`."""
    module = ir.Module(name=name)
    module.triple = target.triple
    runtime = _Runtime(module, target)
    for k in kernels:
        _render_kernel(module, lower(k), runtime)
    return str(module)


def render_cpu(kernel: Kernel, target: Target) -> str:
    return render_module([kernel], target, kernel.name)


class _Runtime:
    """The parallel-for runtime: one worker and one launcher per parallel stage (direct calls, so the
    task can be inlined into its worker)."""

    def __init__(self, module: ir.Module, target: Target):
        self.module = module
        self.target = target
        # pthread_t is an unsigned long: 32 bits on ARMv7, 64 on the others
        self.tid_type = ir.IntType(32 if target.triple.startswith("arm") else 64)
        self._pthreads: tuple[ir.Function, ir.Function] | None = None

    def pthreads(self) -> tuple[ir.Function, ir.Function]:
        if self._pthreads is None:
            m = self.module
            create = ir.Function(m, ir.FunctionType(I32, [PTR, PTR, PTR, PTR]), "pthread_create")
            join = ir.Function(m, ir.FunctionType(I32, [self.tid_type, PTR]), "pthread_join")
            self._pthreads = (create, join)
        return self._pthreads

    def parallel_for(self, task: ir.Function) -> ir.Function:
        """``void pfor(void **args, i64 n, i32 nthreads)`` running ``task(args, begin, end)`` over [0, n)."""
        m = self.module
        create, join = self.pthreads()
        ctx_t = ir.LiteralStructType([PTR, I64, I64, I64])  # args, n, chunk, next

        def field(builder: ir.IRBuilder, c: ir.Value, k: int) -> ir.Value:
            return builder.gep(c, [ir.Constant(I32, 0), ir.Constant(I32, k)], source_etype=ctx_t)

        worker = ir.Function(m, ir.FunctionType(PTR, [PTR]), f"{task.name}.worker")
        worker.linkage = "internal"
        b = ir.IRBuilder(worker.append_basic_block("entry"))
        ctx = worker.args[0]
        args = b.load(field(b, ctx, 0), typ=PTR)
        n = b.load(field(b, ctx, 1), typ=I64)
        chunk = b.load(field(b, ctx, 2), typ=I64)
        loop = worker.append_basic_block("grab")
        run = worker.append_basic_block("run")
        done = worker.append_basic_block("done")
        b.branch(loop)
        b.position_at_end(loop)
        start = b.atomic_rmw("add", field(b, ctx, 3), chunk, "monotonic")
        b.cbranch(b.icmp_signed(">=", start, n), done, run)
        b.position_at_end(run)
        end = b.add(start, chunk)
        end = b.select(b.icmp_signed("<", end, n), end, n)
        b.call(task, [args, start, end])
        b.branch(loop)
        b.position_at_end(done)
        b.ret(ir.Constant(PTR, None))

        pfor = ir.Function(m, ir.FunctionType(ir.VoidType(), [PTR, I64, I32]), f"{task.name}.pfor")
        pfor.linkage = "internal"
        args, n, nthreads = pfor.args
        b = ir.IRBuilder(pfor.append_basic_block("entry"))
        ctx = _alloca(b, ctx_t)
        tids = _alloca(b, self.tid_type, MAX_THREADS)
        serial = pfor.append_basic_block("serial")
        threaded = pfor.append_basic_block("threaded")
        nt64 = b.sext(nthreads, I64)
        nt64 = b.select(b.icmp_signed("<", nt64, n), nt64, n)
        nt64 = b.select(b.icmp_signed("<", nt64, ir.Constant(I64, MAX_THREADS)), nt64, ir.Constant(I64, MAX_THREADS))
        b.cbranch(b.icmp_signed("<=", nt64, ir.Constant(I64, 1)), serial, threaded)
        b.position_at_end(serial)
        b.call(task, [args, ir.Constant(I64, 0), n])
        b.ret_void()

        b.position_at_end(threaded)
        # chunks of about n / (4 * threads) iterations: few atomics, still room to balance a busy core
        chunk = b.sdiv(n, b.mul(nt64, ir.Constant(I64, 4)))
        chunk = b.select(b.icmp_signed("<", chunk, ir.Constant(I64, 1)), ir.Constant(I64, 1), chunk)
        for k, v in enumerate((args, n, chunk, ir.Constant(I64, 0))):
            b.store(v, field(b, ctx, k))
        spawn = pfor.append_basic_block("spawn")
        spawn_body = pfor.append_basic_block("spawn.body")
        main = pfor.append_basic_block("main")
        entry = b.block
        b.branch(spawn)
        b.position_at_end(spawn)
        t = b.phi(I64)
        t.add_incoming(ir.Constant(I64, 1), entry)
        b.cbranch(b.icmp_signed("<", t, nt64), spawn_body, main)
        b.position_at_end(spawn_body)
        rc = b.call(create, [b.gep(tids, [t], source_etype=self.tid_type), ir.Constant(PTR, None), worker, ctx])
        t1 = b.add(t, ir.Constant(I64, 1))
        t.add_incoming(t1, spawn_body)
        # a thread that cannot be created is simply not waited for: the others take its chunks
        b.cbranch(b.icmp_signed("==", rc, ir.Constant(I32, 0)), spawn, main)

        b.position_at_end(main)
        created = b.phi(I64)
        created.add_incoming(t, spawn)
        created.add_incoming(t, spawn_body)
        b.call(worker, [ctx])
        joining = pfor.append_basic_block("join")
        join_body = pfor.append_basic_block("join.body")
        finish = pfor.append_basic_block("finish")
        b.branch(joining)
        b.position_at_end(joining)
        j = b.phi(I64)
        j.add_incoming(ir.Constant(I64, 1), main)
        b.cbranch(b.icmp_signed("<", j, created), join_body, finish)
        b.position_at_end(join_body)
        handle = b.load(b.gep(tids, [j], source_etype=self.tid_type), typ=self.tid_type)
        b.call(join, [handle, ir.Constant(PTR, None)])
        j.add_incoming(b.add(j, ir.Constant(I64, 1)), join_body)
        b.branch(joining)
        b.position_at_end(finish)
        b.ret_void()
        return pfor


def _alloca(b: ir.IRBuilder, typ: ir.Type, count: int | None = None, name: str = "", align: int | None = None
            ) -> ir.Value:
    slot = b.alloca(typ, size=None if count is None else ir.Constant(I32, count), name=name)
    if align:
        slot.align = align
    slot.type = PTR  # llvmlite types allocas as typed pointers; stores of other types need an opaque one
    return slot


def _render_kernel(module: ir.Module, lk: LoweredKernel, runtime: _Runtime) -> None:
    params = lk.params
    entry = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I32]), lk.name)
    entry.attributes.add("nounwind")
    args, nthreads = entry.args
    args.name, nthreads.name = "buffers", "nthreads"
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    ptrs = [b.load(b.gep(args, [ir.Constant(I32, k)], source_etype=PTR), typ=PTR, name=p.name)
            for k, p in enumerate(params)]
    for n, stage in enumerate(lk.stages):
        fn = _render_stage(module, f"{lk.name}.s{n}", stage, params)
        top = stage.body
        extent = top.extent if isinstance(top, For) else 1
        if isinstance(top, For) and top.kind == "parallel":
            task = _render_task(module, f"{lk.name}.s{n}.task", fn, len(params))
            b.call(runtime.parallel_for(task), [args, ir.Constant(I64, extent), nthreads])
        else:
            b.call(fn, [*ptrs, ir.Constant(I64, 0), ir.Constant(I64, extent)])
    b.ret_void()


def _render_task(module: ir.Module, name: str, stage_fn: ir.Function, nparams: int) -> ir.Function:
    """``void task(void **buffers, i64 begin, i64 end)``: what a thread of parallel_for calls."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]), name)
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    args, begin, end = fn.args
    ptrs = [b.load(b.gep(args, [ir.Constant(I32, k)], source_etype=PTR), typ=PTR) for k in range(nparams)]
    b.call(stage_fn, [*ptrs, begin, end])
    b.ret_void()
    return fn


def _render_stage(module: ir.Module, name: str, stage: LoweredStage, params: list[Buffer]) -> ir.Function:
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR] * len(params) + [I64, I64]), name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    for arg, p in zip(fn.args, params, strict=False):
        arg.name = p.name
        arg.add_attribute("noalias")
    begin, end = fn.args[-2], fn.args[-1]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    buffers: dict[Buffer, ir.Value] = dict(zip(params, fn.args, strict=False))
    for s in stage.scratch:
        if s.scope != "local":
            raise ValueError(f"stage '{stage.name}': {s.scope} buffer '{s.name}' in CPU code")
        buffers[s] = _alloca(b, ir.ArrayType(ir_type(s.dtype), s.size), name=s.name, align=64)
    em = Emitter(b, buffers)
    top = stage.body
    if isinstance(top, For) and top.kind == "parallel":
        em.loop(top, begin, end)
    else:
        em.stmt(top)
    b.ret_void()
    return fn
