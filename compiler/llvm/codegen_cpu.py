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

__all__ = [
    "FORKED_SYMBOL", "MAX_THREADS", "RUNTIME_IR", "RUNTIME_SYMBOL", "SEQUENCE_IR", "SEQUENCE_SYMBOL", "render_cpu",
    "render_module", "runtime_ir",
]

#: the most threads one parallel loop uses (the pool never grows beyond this many minus one workers)
MAX_THREADS = 64
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


#: The parallel-for runtime as LLVM assembly: a pool of worker threads, created on first use and kept.
#:
#: A job (task, args, n iterations) is published in one static descriptor with a sequence number that is
#: odd while the descriptor is being written: a worker that sees a new even number joins (counted in
#: ``active``, rechecking the number after counting itself, so a writer and a joiner never miss each
#: other), takes chunks of iterations, and leaves. The iterations are split into one contiguous range per
#: participant (the caller is 0, the k-th worker to join k): each takes chunks of its own range first, in
#: order, then of the others' from their atomic counters, so the same rows of consecutive kernels stay with
#: the same core and its cache (a producer's rows are its consumer's; handing chunks out in turn from one
#: counter made MobileNetV2's kernels 15% slower on two threads of an AVX-512 Xeon), while a thread that is
#: late or preempted strands nothing. The caller returns
#: when every chunk is *done*: it never waits for a worker to wake up or start, which on a machine whose
#: cores are busy with other work can take milliseconds; the next job waits only for stragglers still
#: inside the previous one (which never run a kernel's code, so kernels may be freed once their call
#: returns). Idle workers spin briefly (back-to-back kernels find them awake), then sleep on a condition
#: variable. A second caller while a job runs (another Python thread, or a task calling a parallel
#: kernel) runs its loop serially instead of waiting.
RUNTIME_IR = """
@weft.lock = internal global i32 0
@weft.seq = internal global i64 0
@weft.job = internal global { ptr, ptr, i64, i64, i64, i64, i64 } zeroinitializer ; task args n chunk parts done slots
; per participant (the caller 0, workers 1..parts-1), its cache line: the next iteration of its range to take
@weft.ranges = internal global [MAX x [8 x i64]] zeroinitializer, align 64
@weft.active = internal global i64 0
@weft.workers = internal global i64 0
@weft.mutex = internal global [64 x i8] zeroinitializer, align 16 ; PTHREAD_MUTEX_INITIALIZER is all zeros
@weft.cond = internal global [64 x i8] zeroinitializer, align 16  ; and so is PTHREAD_COND_INITIALIZER

declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_detach(TID)
declare i32 @pthread_mutex_lock(ptr)
declare i32 @pthread_mutex_unlock(ptr)
declare i32 @pthread_cond_wait(ptr, ptr)
declare i32 @pthread_cond_broadcast(ptr)
declare i32 @sched_yield()
PAUSE_DECL

; a forked child has none of its parent's workers: it starts from an empty pool (the host JIT calls this
; from Python's after-fork hook)
define void @weft_pool_forked() nounwind {
entry:
  store i64 0, ptr @weft.workers
  store i64 0, ptr @weft.active
  store i32 0, ptr @weft.lock
  store [64 x i8] zeroinitializer, ptr @weft.mutex
  store [64 x i8] zeroinitializer, ptr @weft.cond
  ret void
}

define internal void @weft.work(i64 %self) nounwind {
entry:
  %task = load ptr, ptr @weft.job
  %ap = getelementptr { ptr, ptr, i64, i64, i64, i64, i64 }, ptr @weft.job, i32 0, i32 1
  %args = load ptr, ptr %ap
  %np = getelementptr { ptr, ptr, i64, i64, i64, i64, i64 }, ptr @weft.job, i32 0, i32 2
  %n = load i64, ptr %np
  %cp = getelementptr { ptr, ptr, i64, i64, i64, i64, i64 }, ptr @weft.job, i32 0, i32 3
  %chunk = load i64, ptr %cp
  %pp = getelementptr { ptr, ptr, i64, i64, i64, i64, i64 }, ptr @weft.job, i32 0, i32 4
  %parts = load i64, ptr %pp
  %donep = getelementptr { ptr, ptr, i64, i64, i64, i64, i64 }, ptr @weft.job, i32 0, i32 5
  br label %range
range:
  ; its own range first, then the others' leftovers (self+1, self+2, ... wrapping around)
  %k = phi i64 [ 0, %entry ], [ %k1, %nextrange ]
  %q0 = add i64 %self, %k
  %wrap = icmp sge i64 %q0, %parts
  %q1 = sub i64 %q0, %parts
  %q = select i1 %wrap, i64 %q1, i64 %q0
  %qn = add i64 %q, 1
  %hi0 = mul i64 %qn, %n
  %hi = sdiv i64 %hi0, %parts
  %nextp = getelementptr [MAX x [8 x i64]], ptr @weft.ranges, i64 0, i64 %q, i64 0
  br label %grab
grab:
  %start = atomicrmw add ptr %nextp, i64 %chunk monotonic
  %over = icmp sge i64 %start, %hi
  br i1 %over, label %nextrange, label %run
run:
  %e0 = add i64 %start, %chunk
  %lt = icmp slt i64 %e0, %hi
  %end = select i1 %lt, i64 %e0, i64 %hi
  call void %task(ptr %args, i64 %start, i64 %end)
  %count = sub i64 %end, %start
  %old = atomicrmw add ptr %donep, i64 %count release ; publishes the chunk's stores to the caller
  br label %grab
nextrange:
  %k1 = add i64 %k, 1
  %more = icmp slt i64 %k1, %parts
  br i1 %more, label %range, label %exit
exit:
  ret void
}

; a job has been posted since `seen` when the sequence number moved and is even (odd: one is being posted)
define internal i1 @weft.posted(i64 %s, i64 %seen) nounwind alwaysinline {
entry:
  %fresh = icmp ne i64 %s, %seen
  %low = and i64 %s, 1
  %even = icmp eq i64 %low, 0
  %ready = and i1 %fresh, %even
  ret i1 %ready
}

define internal ptr @weft.worker(ptr %unused) nounwind {
entry:
  br label %idle
idle:
  %seen = phi i64 [ 0, %entry ], [ %s, %leave ], [ %s, %joined ]
  br label %spin
spin:
  %spins = phi i32 [ 0, %idle ], [ %spins1, %again ], [ 0, %woken ]
  %s = load atomic i64, ptr @weft.seq acquire, align 8
  %ready = call i1 @weft.posted(i64 %s, i64 %seen)
  br i1 %ready, label %join, label %wait
wait:
  %patient = icmp ult i32 %spins, SPINS
  br i1 %patient, label %again, label %sleep
again:
  PAUSE_CALL
  %spins1 = add i32 %spins, 1
  br label %spin
sleep:
  %l1 = call i32 @pthread_mutex_lock(ptr @weft.mutex)
  %s2 = load atomic i64, ptr @weft.seq acquire, align 8
  %posted = call i1 @weft.posted(i64 %s2, i64 %seen)
  br i1 %posted, label %woke, label %block
block:
  %w = call i32 @pthread_cond_wait(ptr @weft.cond, ptr @weft.mutex)
  br label %woke
woke:
  %u1 = call i32 @pthread_mutex_unlock(ptr @weft.mutex)
  br label %woken
woken:
  br label %spin
join:
  %a1 = atomicrmw add ptr @weft.active, i64 1 seq_cst
  %s3 = load atomic i64, ptr @weft.seq seq_cst, align 8
  %moved = icmp ne i64 %s3, %s
  br i1 %moved, label %leave, label %slot
slot:
  %slotp = getelementptr { ptr, ptr, i64, i64, i64, i64, i64 }, ptr @weft.job, i32 0, i32 6
  %free = atomicrmw sub ptr %slotp, i64 1 seq_cst
  %room = icmp sgt i64 %free, 0
  br i1 %room, label %help, label %leave
help:
  call void @weft.work(i64 %free) ; the slots count down: each worker its own participant number
  %a2 = atomicrmw sub ptr @weft.active, i64 1 release
  br label %joined
joined:
  br label %idle
leave:
  %a3 = atomicrmw sub ptr @weft.active, i64 1 release
  br label %idle
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
  br i1 %alone, label %serial, label %claim
serial:
  call void %task(ptr %args, i64 0, i64 %n)
  ret void
claim:
  %got = cmpxchg ptr @weft.lock, i32 0, i32 1 acquire monotonic
  %mine = extractvalue { i32, i1 } %got, 1
  br i1 %mine, label %grow, label %serial
grow:
  %want = sub i64 %nt, 1
  br label %spawn
spawn:
  %have = load i64, ptr @weft.workers
  %short = icmp slt i64 %have, %want
  br i1 %short, label %create, label %publish
create:
  %rc = call i32 @pthread_create(ptr %tid, ptr null, ptr @weft.worker, ptr null)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %created, label %publish ; without a new thread the job runs on fewer
created:
  %handle = load TID, ptr %tid
  %dc = call i32 @pthread_detach(TID %handle)
  %have1 = add i64 %have, 1
  store i64 %have1, ptr @weft.workers
  br label %spawn
publish:
  %s0 = load i64, ptr @weft.seq
  %s1 = add i64 %s0, 1
  store atomic i64 %s1, ptr @weft.seq seq_cst, align 8 ; odd: the descriptor is being rewritten
  br label %drain
drain:
  %busy = load atomic i64, ptr @weft.active seq_cst, align 8
  %left = icmp eq i64 %busy, 0
  br i1 %left, label %write, label %drain.wait
drain.wait:
  %yd = call i32 @sched_yield()
  br label %drain
write:
  %den = mul i64 %nt, 4
  %q = sdiv i64 %n, %den
  %tiny = icmp slt i64 %q, 1
  %chunk = select i1 %tiny, i64 1, i64 %q ; four chunks per range: a preempted thread strands little of its range
  store ptr %task, ptr @weft.job
  %f1 = getelementptr { ptr, ptr, i64, i64, i64, i64, i64 }, ptr @weft.job, i32 0, i32 1
  store ptr %args, ptr %f1
  %f2 = getelementptr { ptr, ptr, i64, i64, i64, i64, i64 }, ptr @weft.job, i32 0, i32 2
  store i64 %n, ptr %f2
  %f3 = getelementptr { ptr, ptr, i64, i64, i64, i64, i64 }, ptr @weft.job, i32 0, i32 3
  store i64 %chunk, ptr %f3
  %f4 = getelementptr { ptr, ptr, i64, i64, i64, i64, i64 }, ptr @weft.job, i32 0, i32 4
  store i64 %nt, ptr %f4
  br label %split
split:
  ; participant p's range is [p n / nt, (p+1) n / nt): the same rows of every kernel to the same thread
  %p = phi i64 [ 0, %write ], [ %p1, %split ]
  %lo0 = mul i64 %p, %n
  %lo = sdiv i64 %lo0, %nt
  %rp = getelementptr [MAX x [8 x i64]], ptr @weft.ranges, i64 0, i64 %p, i64 0
  store i64 %lo, ptr %rp
  %p1 = add i64 %p, 1
  %pm = icmp slt i64 %p1, %nt
  br i1 %pm, label %split, label %post
post:
  %f5 = getelementptr { ptr, ptr, i64, i64, i64, i64, i64 }, ptr @weft.job, i32 0, i32 5
  store i64 0, ptr %f5
  %f6 = getelementptr { ptr, ptr, i64, i64, i64, i64, i64 }, ptr @weft.job, i32 0, i32 6
  store i64 %want, ptr %f6
  %s2 = add i64 %s0, 2
  store atomic i64 %s2, ptr @weft.seq seq_cst, align 8 ; even again: the job is out
  %l1 = call i32 @pthread_mutex_lock(ptr @weft.mutex)
  %b1 = call i32 @pthread_cond_broadcast(ptr @weft.cond)
  %u1 = call i32 @pthread_mutex_unlock(ptr @weft.mutex)
  call void @weft.work(i64 0)
  br label %finish
finish:
  %waited = phi i32 [ 0, %post ], [ %waited1, %finish.next ]
  %finished = load atomic i64, ptr %f5 acquire, align 8
  %all = icmp sge i64 %finished, %n
  br i1 %all, label %done, label %finish.wait
finish.wait:
  ; a worker still on its last chunk: spin a little, then give the core away in case that worker
  ; was preempted onto it
  %long = icmp ugt i32 %waited, 2000
  br i1 %long, label %finish.yield, label %finish.pause
finish.pause:
  PAUSE_CALL
  br label %finish.next
finish.yield:
  %yf = call i32 @sched_yield()
  br label %finish.next
finish.next:
  %waited1 = add i32 %waited, 1
  br label %finish
done:
  store atomic i32 0, ptr @weft.lock release, align 4
  ret void
}
"""
#: Runs a plan's consecutive kernels from one call, so that Python is not entered between them (about 2 us a
#: kernel through ctypes: 4% of MobileNetV2 on two threads). ``stamps`` (null: none) receives
#: CLOCK_MONOTONIC nanoseconds before the first kernel and after each, for the per-layer figures. The host
#: JIT links it (64-bit Linux: a timespec of two i64, CLOCK_MONOTONIC = 1); board objects never carry it.
SEQUENCE_SYMBOL = "weft_run_sequence"
SEQUENCE_IR = """
declare i32 @clock_gettime(i32, ptr)

define internal i64 @weft.now() nounwind {
entry:
  %ts = alloca { i64, i64 }
  %rc = call i32 @clock_gettime(i32 1, ptr %ts)
  %sp = getelementptr { i64, i64 }, ptr %ts, i32 0, i32 0
  %np = getelementptr { i64, i64 }, ptr %ts, i32 0, i32 1
  %sec = load i64, ptr %sp
  %nsec = load i64, ptr %np
  %ns = mul i64 %sec, 1000000000
  %t = add i64 %ns, %nsec
  ret i64 %t
}

define void @weft_run_sequence(ptr %kernels, ptr %buffers, i64 %n, i32 %nthreads, ptr %stamps) nounwind {
entry:
  %timed = icmp ne ptr %stamps, null
  br i1 %timed, label %first, label %loop
first:
  %t0 = call i64 @weft.now()
  store i64 %t0, ptr %stamps
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ 0, %first ], [ %i1, %next ]
  %more = icmp slt i64 %i, %n
  br i1 %more, label %call, label %done
call:
  %kp = getelementptr ptr, ptr %kernels, i64 %i
  %kernel = load ptr, ptr %kp
  %bp = getelementptr ptr, ptr %buffers, i64 %i
  %args = load ptr, ptr %bp
  call void %kernel(ptr %args, i32 %nthreads)
  br i1 %timed, label %stamp, label %next
stamp:
  %t = call i64 @weft.now()
  %i2 = add i64 %i, 1
  %sp = getelementptr i64, ptr %stamps, i64 %i2
  store i64 %t, ptr %sp
  br label %next
next:
  %i1 = add i64 %i, 1
  br label %loop
done:
  ret void
}
"""
_PAUSE = {  # a spin-wait hint, by architecture
    "x86_64": ("declare void @llvm.x86.sse2.pause()", "call void @llvm.x86.sse2.pause()"),
    "aarch64": ("declare void @llvm.aarch64.hint(i32)", "call void @llvm.aarch64.hint(i32 1)"),
    "arm": ("declare void @llvm.arm.hint(i32)", "call void @llvm.arm.hint(i32 1)"),
}
#: pauses an idle worker spins through before it sleeps: about the gap between two kernels of a model (a few
#: microseconds), not much more, since on a busy machine a spinning worker may delay the caller that shares
#: its core
SPINS = 3000
RUNTIME_SYMBOL = "weft_parallel_for"
FORKED_SYMBOL = "weft_pool_forked"


def runtime_ir(target: Target) -> str:
    """The parallel-for runtime for `target` (pthread_t is 32 bits on ARMv7)."""
    arch = target.triple.split("-")[0]
    family = "arm" if arch.startswith(("arm", "thumb")) else arch
    decl, call = _PAUSE.get(family, ("", ""))
    text = (RUNTIME_IR.replace("TID", "i32" if family == "arm" else "i64").replace("MAX", str(MAX_THREADS))
            .replace("SPINS", str(SPINS)).replace("PAUSE_DECL", decl).replace("PAUSE_CALL", call))
    return f'target triple = "{target.triple}"\n' + text


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
