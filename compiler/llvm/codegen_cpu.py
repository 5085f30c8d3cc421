"""Render lowered kernels to LLVM IR for a CPU: one entry point per kernel, threads through pthreads.

Every kernel has the same C signature, so one ctypes prototype calls them all::

    void NAME(void **buffers, int32_t nthreads);

``buffers`` holds the kernel's parameters in :attr:`Kernel.params` order. Each stage becomes an internal
function taking its buffers as ``noalias`` pointers (so LLVM may keep values in registers across stores)
and a ``[begin, end)`` range of its outermost loop. A stage whose outermost loop is ``parallel`` runs
through ``weft_parallel_for`` (:data:`RUNTIME_IR`): the calling thread and up to ``nthreads - 1`` detached
pthreads take chunks of iterations from an atomic counter until none remain, and the caller returns as
soon as every chunk is done, so a thread that a busy core starts late never holds it back; with one
thread, or one iteration, no thread is created at all.
"""

from __future__ import annotations

from collections.abc import Sequence

import llvmlite.ir as ir

from weft.compiler.llvm.emit import I32, I64, Emitter, ir_type
from weft.compiler.llvm.expr import Buffer
from weft.compiler.llvm.lower import For, LoweredKernel, LoweredStage, lower
from weft.compiler.llvm.target import Target
from weft.compiler.llvm.te import Kernel

__all__ = ["MAX_THREADS", "RUNTIME_IR", "RUNTIME_SYMBOL", "render_cpu", "render_module", "runtime_ir"]

#: threads one parallel loop may use (the stack array of thread handles has this many slots)
MAX_THREADS = 256
PTR = ir.PointerType()


def render_module(kernels: Sequence[Kernel], target: Target, name: str = "weft") -> str:
    """LLVM IR text of a module holding `kernels` for CPU `target`."""
    module = ir.Module(name=name)
    module.triple = target.triple
    for k in kernels:
        _render_kernel(module, lower(k))
    return str(module)


def render_cpu(kernel: Kernel, target: Target) -> str:
    return render_module([kernel], target, kernel.name)


#: The parallel-for runtime as LLVM assembly. Its shared state lives on the heap with a reference count and
#: its workers are detached: the caller waits for every *chunk* to be done, never for a thread to start or
#: exit. On a machine whose cores are busy with other work a new thread may start milliseconds late; it
#: then finds no chunk left, drops its reference and exits. Such a late thread runs only this code, never
#: a kernel's, so the runtime lives in a module that is never freed (the host JIT) or is linked into the
#: object file (the boards), while kernels' code may be freed as soon as their call returns.
RUNTIME_IR = """
%ctx = type { ptr, ptr, i64, i64, i64, i64, i64 } ; task, args, n, chunk, next, done, refs

declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_detach(TID)
declare i32 @sched_yield()
declare ptr @malloc(SIZE)
declare void @free(ptr)

define internal void @weft.work(ptr %c) nounwind {
entry:
  %task = load ptr, ptr %c
  %ap = getelementptr %ctx, ptr %c, i32 0, i32 1
  %args = load ptr, ptr %ap
  %np = getelementptr %ctx, ptr %c, i32 0, i32 2
  %n = load i64, ptr %np
  %cp = getelementptr %ctx, ptr %c, i32 0, i32 3
  %chunk = load i64, ptr %cp
  %nextp = getelementptr %ctx, ptr %c, i32 0, i32 4
  %donep = getelementptr %ctx, ptr %c, i32 0, i32 5
  br label %grab
grab:
  %start = atomicrmw add ptr %nextp, i64 %chunk monotonic
  %over = icmp sge i64 %start, %n
  br i1 %over, label %exit, label %run
run:
  %e0 = add i64 %start, %chunk
  %lt = icmp slt i64 %e0, %n
  %end = select i1 %lt, i64 %e0, i64 %n
  call void %task(ptr %args, i64 %start, i64 %end)
  %count = sub i64 %end, %start
  %old = atomicrmw add ptr %donep, i64 %count release ; publishes the chunk's stores
  br label %grab
exit:
  ret void
}

define internal void @weft.release(ptr %c) nounwind {
entry:
  %rp = getelementptr %ctx, ptr %c, i32 0, i32 6
  %before = atomicrmw sub ptr %rp, i64 1 acq_rel
  %last = icmp eq i64 %before, 1
  br i1 %last, label %drop, label %out
drop:
  call void @free(ptr %c)
  br label %out
out:
  ret void
}

define internal ptr @weft.worker(ptr %c) nounwind {
entry:
  call void @weft.work(ptr %c)
  call void @weft.release(ptr %c)
  ret ptr null
}

define void @weft_parallel_for(ptr %task, ptr %args, i64 %n, i32 %nthreads) nounwind {
entry:
  %tid = alloca TID
  %nt0 = sext i32 %nthreads to i64
  %c1 = icmp slt i64 %nt0, %n
  %nt1 = select i1 %c1, i64 %nt0, i64 %n
  %c2 = icmp slt i64 %nt1, MAX
  %nt = select i1 %c2, i64 %nt1, i64 MAX
  %alone = icmp sle i64 %nt, 1
  br i1 %alone, label %serial, label %threaded
serial:
  call void %task(ptr %args, i64 0, i64 %n)
  ret void
threaded:
  %c = call ptr @malloc(SIZE 64)
  %nomem = icmp eq ptr %c, null
  br i1 %nomem, label %serial, label %setup
setup:
  ; chunks of about n / (16 threads) iterations: few atomics, little work stranded on a preempted thread
  %den = mul i64 %nt, 16
  %q = sdiv i64 %n, %den
  %tiny = icmp slt i64 %q, 1
  %chunk = select i1 %tiny, i64 1, i64 %q
  store ptr %task, ptr %c
  %f1 = getelementptr %ctx, ptr %c, i32 0, i32 1
  store ptr %args, ptr %f1
  %f2 = getelementptr %ctx, ptr %c, i32 0, i32 2
  store i64 %n, ptr %f2
  %f3 = getelementptr %ctx, ptr %c, i32 0, i32 3
  store i64 %chunk, ptr %f3
  %f4 = getelementptr %ctx, ptr %c, i32 0, i32 4
  store i64 0, ptr %f4
  %f5 = getelementptr %ctx, ptr %c, i32 0, i32 5
  store i64 0, ptr %f5
  %f6 = getelementptr %ctx, ptr %c, i32 0, i32 6
  store i64 %nt, ptr %f6
  br label %spawn
spawn:
  %t = phi i64 [ 1, %setup ], [ %t1, %spawned ]
  %more = icmp slt i64 %t, %nt
  br i1 %more, label %create, label %main
create:
  %rc = call i32 @pthread_create(ptr %tid, ptr null, ptr @weft.worker, ptr %c)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %spawned, label %failed
spawned:
  %handle = load TID, ptr %tid
  %dc = call i32 @pthread_detach(TID %handle)
  %t1 = add i64 %t, 1
  br label %spawn
failed:
  ; the references of threads never created are dropped at once; the others take their chunks
  %missing = sub i64 %nt, %t
  %fr = atomicrmw sub ptr %f6, i64 %missing acq_rel
  br label %main
main:
  call void @weft.work(ptr %c)
  br label %wait
wait:
  %finished = load atomic i64, ptr %f5 acquire, align 8
  %all = icmp sge i64 %finished, %n
  br i1 %all, label %finish, label %pause
pause:
  %yc = call i32 @sched_yield()
  br label %wait
finish:
  call void @weft.release(ptr %c)
  ret void
}
"""
RUNTIME_SYMBOL = "weft_parallel_for"


def runtime_ir(target: Target) -> str:
    """The parallel-for runtime for `target` (pthread_t and size_t are 32 bits on ARMv7)."""
    narrow = target.triple.startswith("arm")
    text = RUNTIME_IR.replace("TID", "i32" if narrow else "i64").replace("SIZE", "i32" if narrow else "i64")
    return f'target triple = "{target.triple}"\n' + text.replace("MAX", str(MAX_THREADS))


def _alloca(b: ir.IRBuilder, typ: ir.Type, count: int | None = None, name: str = "", align: int | None = None
            ) -> ir.Value:
    slot = b.alloca(typ, size=None if count is None else ir.Constant(I32, count), name=name)
    if align:
        slot.align = align
    slot.type = PTR  # llvmlite types allocas as typed pointers; stores of other types need an opaque one
    return slot


def _parallel_for(module: ir.Module) -> ir.Function:
    try:
        return module.get_global(RUNTIME_SYMBOL)
    except KeyError:
        return ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I32]), RUNTIME_SYMBOL)


def _render_kernel(module: ir.Module, lk: LoweredKernel) -> None:
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
            b.call(_parallel_for(module), [task, args, ir.Constant(I64, extent), nthreads])
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
