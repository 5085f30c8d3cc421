"""Render lowered kernels to LLVM IR for a CPU: one entry point per kernel, threads through pthreads.

Every kernel has the same C signature, so one ctypes prototype calls them all::

    void NAME(void **buffers, int32_t nthreads);

``buffers`` holds the kernel's parameters in :attr:`Kernel.params` order. Each stage becomes an internal
function taking its buffers as ``noalias`` pointers (so LLVM may keep values in registers across stores)
and a ``[begin, end)`` range of its outermost loop. A stage whose outermost loop is ``parallel`` runs
through a parallel-for: the calling thread and up to ``nthreads - 1`` detached pthreads take chunks of
iterations from an atomic counter until none remain, and the caller returns as soon as every chunk is
done, so a thread that a busy core starts late never holds it back; with one thread, or one iteration, no
thread is created at all.
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
    """The parallel-for runtime, one worker and one launcher per parallel stage (direct calls, so the
    task can be inlined into its worker).

    The shared state lives on the heap with a reference count, and workers are detached: the caller waits
    for every *chunk* to be done, never for a thread to start or exit. On a machine whose cores are busy
    with other work a new thread may start milliseconds late; it then finds no chunk left and frees
    its reference, while the caller has long returned.
    """

    def __init__(self, module: ir.Module, target: Target):
        self.module = module
        self.target = target
        # pthread_t is an unsigned long: 32 bits on ARMv7, 64 on the others
        self.tid_type = ir.IntType(32 if target.triple.startswith("arm") else 64)
        self.size_type = ir.IntType(32 if target.triple.startswith("arm") else 64)
        self._libc: dict[str, ir.Function] | None = None

    def libc(self) -> dict[str, ir.Function]:
        if self._libc is None:
            m = self.module
            sig = {
                "pthread_create": ir.FunctionType(I32, [PTR, PTR, PTR, PTR]),
                "pthread_detach": ir.FunctionType(I32, [self.tid_type]),
                "sched_yield": ir.FunctionType(I32, []),
                "malloc": ir.FunctionType(PTR, [self.size_type]),
                "free": ir.FunctionType(ir.VoidType(), [PTR]),
            }
            self._libc = {name: ir.Function(m, t, name) for name, t in sig.items()}
        return self._libc

    def parallel_for(self, task: ir.Function) -> ir.Function:
        """``void pfor(void **args, i64 n, i32 nthreads)`` running ``task(args, begin, end)`` over [0, n)."""
        m = self.module
        libc = self.libc()
        ctx_t = ir.LiteralStructType([PTR, I64, I64, I64, I64, I64])  # args, n, chunk, next, done, refs
        ARGS, N, CHUNK, NEXT, DONE, REFS = range(6)

        def field(builder: ir.IRBuilder, c: ir.Value, k: int) -> ir.Value:
            return builder.gep(c, [ir.Constant(I32, 0), ir.Constant(I32, k)], source_etype=ctx_t)

        one = ir.Constant(I64, 1)

        # work(ctx): take chunks until none is left, counting each one done
        work = ir.Function(m, ir.FunctionType(ir.VoidType(), [PTR]), f"{task.name}.work")
        work.linkage = "internal"
        b = ir.IRBuilder(work.append_basic_block("entry"))
        ctx = work.args[0]
        args = b.load(field(b, ctx, ARGS), typ=PTR)
        n = b.load(field(b, ctx, N), typ=I64)
        chunk = b.load(field(b, ctx, CHUNK), typ=I64)
        grab = work.append_basic_block("grab")
        run = work.append_basic_block("run")
        done = work.append_basic_block("done")
        b.branch(grab)
        b.position_at_end(grab)
        start = b.atomic_rmw("add", field(b, ctx, NEXT), chunk, "monotonic")
        b.cbranch(b.icmp_signed(">=", start, n), done, run)
        b.position_at_end(run)
        end = b.add(start, chunk)
        end = b.select(b.icmp_signed("<", end, n), end, n)
        b.call(task, [args, start, end])
        b.atomic_rmw("add", field(b, ctx, DONE), b.sub(end, start), "release")  # publishes the chunk's stores
        b.branch(grab)
        b.position_at_end(done)
        b.ret_void()

        # release(ctx): drop one reference, freeing the state with the last
        release = ir.Function(m, ir.FunctionType(ir.VoidType(), [PTR]), f"{task.name}.release")
        release.linkage = "internal"
        b = ir.IRBuilder(release.append_basic_block("entry"))
        last = release.append_basic_block("last")
        out = release.append_basic_block("out")
        before = b.atomic_rmw("sub", field(b, release.args[0], REFS), one, "acq_rel")
        b.cbranch(b.icmp_signed("==", before, one), last, out)
        b.position_at_end(last)
        b.call(libc["free"], [release.args[0]])
        b.branch(out)
        b.position_at_end(out)
        b.ret_void()

        worker = ir.Function(m, ir.FunctionType(PTR, [PTR]), f"{task.name}.worker")
        worker.linkage = "internal"
        b = ir.IRBuilder(worker.append_basic_block("entry"))
        b.call(work, [worker.args[0]])
        b.call(release, [worker.args[0]])
        b.ret(ir.Constant(PTR, None))

        pfor = ir.Function(m, ir.FunctionType(ir.VoidType(), [PTR, I64, I32]), f"{task.name}.pfor")
        pfor.linkage = "internal"
        args, n, nthreads = pfor.args
        b = ir.IRBuilder(pfor.append_basic_block("entry"))
        tid = _alloca(b, self.tid_type)
        serial = pfor.append_basic_block("serial")
        threaded = pfor.append_basic_block("threaded")
        nt = b.sext(nthreads, I64)
        nt = b.select(b.icmp_signed("<", nt, n), nt, n)
        nt = b.select(b.icmp_signed("<", nt, ir.Constant(I64, MAX_THREADS)), nt, ir.Constant(I64, MAX_THREADS))
        b.cbranch(b.icmp_signed("<=", nt, one), serial, threaded)
        b.position_at_end(serial)
        b.call(task, [args, ir.Constant(I64, 0), n])
        b.ret_void()

        b.position_at_end(threaded)
        size = ir.Constant(self.size_type, 64)  # six 8-byte fields, rounded up to a cache line
        ctx = b.call(libc["malloc"], [size])
        no_memory = pfor.append_basic_block("no_memory")
        setup = pfor.append_basic_block("setup")
        b.cbranch(b.icmp_unsigned("==", ctx, ir.Constant(PTR, None)), no_memory, setup)
        b.position_at_end(no_memory)
        b.call(task, [args, ir.Constant(I64, 0), n])
        b.ret_void()
        b.position_at_end(setup)
        # chunks of about n / (16 * threads) iterations: few atomics, little work stranded on a thread
        # that the OS preempts
        chunk = b.sdiv(n, b.mul(nt, ir.Constant(I64, 16)))
        chunk = b.select(b.icmp_signed("<", chunk, one), one, chunk)
        for k, v in ((ARGS, args), (N, n), (CHUNK, chunk), (NEXT, ir.Constant(I64, 0)), (DONE, ir.Constant(I64, 0)),
                     (REFS, nt)):
            b.store(v, field(b, ctx, k))
        spawn = pfor.append_basic_block("spawn")
        spawn_body = pfor.append_basic_block("spawn.body")
        spawned = pfor.append_basic_block("spawned")
        failed = pfor.append_basic_block("failed")
        main = pfor.append_basic_block("main")
        entry = b.block
        b.branch(spawn)
        b.position_at_end(spawn)
        t = b.phi(I64)
        t.add_incoming(one, entry)
        b.cbranch(b.icmp_signed("<", t, nt), spawn_body, main)
        b.position_at_end(spawn_body)
        rc = b.call(libc["pthread_create"], [tid, ir.Constant(PTR, None), worker, ctx])
        b.cbranch(b.icmp_signed("==", rc, ir.Constant(I32, 0)), spawned, failed)
        b.position_at_end(spawned)
        b.call(libc["pthread_detach"], [b.load(tid, typ=self.tid_type)])
        t.add_incoming(b.add(t, one), spawned)
        b.branch(spawn)
        b.position_at_end(failed)  # the references of threads never created are dropped at once
        b.atomic_rmw("sub", field(b, ctx, REFS), b.sub(nt, t), "acq_rel")
        b.branch(main)

        b.position_at_end(main)
        b.call(work, [ctx])
        wait = pfor.append_basic_block("wait")
        pause = pfor.append_basic_block("pause")
        finish = pfor.append_basic_block("finish")
        b.branch(wait)
        b.position_at_end(wait)
        finished = b.load_atomic(field(b, ctx, DONE), "acquire", 8, typ=I64)
        b.cbranch(b.icmp_signed(">=", finished, n), finish, pause)
        b.position_at_end(pause)
        b.call(libc["sched_yield"], [])
        b.branch(wait)
        b.position_at_end(finish)
        b.call(release, [ctx])
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
