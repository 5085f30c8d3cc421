"""Expressions and statements to LLVM IR instructions: the part the CPU and GPU generators share.

An :class:`Emitter` walks lowered statements with an llvmlite builder. Loops marked ``unroll`` are
repeated with constant indices; a loop marked ``vectorize`` is emitted once, in vector mode: every
expression then evaluates to a scalar (lane-invariant) or a ``<lanes x T>`` vector, loads and stores whose
index is affine in the lane variable with stride 1 become single vector accesses, stride 0 a scalar
broadcast, and anything else a per-lane gather or scatter. Float adds and multiplies carry the
``contract`` flag so that LLVM forms fused multiply-adds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import llvmlite.ir as ir

from weft.compiler.llvm.expr import (
    Bin,
    Buffer,
    Call,
    Cast,
    Const,
    Expr,
    Load,
    Select,
    Var,
    const,
    free_vars,
    is_float,
    linear,
    np_dtype,
    substitute,
)
from weft.compiler.llvm.lower import Barrier, For, If, Seq, Stmt, Store
from weft.errors import WeftError

__all__ = ["Emitter", "ir_type"]

I64 = ir.IntType(64)
I32 = ir.IntType(32)
I1 = ir.IntType(1)
_FLOAT = ("contract",)


def ir_type(dtype: str) -> ir.Type:
    if dtype == "f32":
        return ir.FloatType()
    if dtype == "f64":
        return ir.DoubleType()
    if dtype == "bool":
        return I1
    return ir.IntType(np_dtype(dtype).itemsize * 8)


@dataclass
class Val:
    """An emitted value: scalar (lanes == 1) or a vector of `lanes` elements."""

    value: ir.Value
    lanes: int
    dtype: str


class EmitError(WeftError, ValueError):
    """Code the target cannot run, from the schedule asked for: GPU thread bindings or a shared-memory
    barrier in code for a CPU, a vectorized loop whose lanes all store to one element."""


#: the integer operations :meth:`Emitter.static` evaluates
_STATIC_OPS = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
               "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
               "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class Emitter:
    """Emits statements into `builder`'s function. `buffers` maps each buffer to its base pointer;
    `bind_thread(tag)` (GPU only) gives the value of a thread index."""

    def __init__(self, builder: ir.IRBuilder, buffers: dict[Buffer, ir.Value], *,
                 bind_thread: Callable[[str], ir.Value] | None = None, barrier: Callable[[], None] | None = None,
                 nvptx: bool = False):
        self.b = builder
        #: NVPTX has no libm: exp and log go through the hardware's base-2 approximations
        self.nvptx = nvptx
        self.buffers = buffers
        self.env: dict[Var, ir.Value] = {}
        self.vec: tuple[Var, int] | None = None
        self.bind_thread = bind_thread
        self.barrier = barrier
        self.module: ir.Module = builder.module

    # ---- statements --------------------------------------------------------------------------------
    def stmt(self, s: Stmt) -> None:
        if isinstance(s, Seq):
            for x in s.stmts:
                self.stmt(x)
        elif isinstance(s, For):
            self.loop(s)
        elif isinstance(s, Store):
            self.store(s)
        elif isinstance(s, If):
            self.branch(s)
        elif isinstance(s, Barrier):
            if self.barrier is None:
                raise EmitError("a barrier (GPU shared memory) in code for a CPU")
            self.barrier()
        else:
            raise TypeError(f"unknown statement {type(s).__name__}")

    def loop(self, s: For, begin: ir.Value | None = None, end: ir.Value | None = None) -> None:
        kind = s.kind
        if kind.startswith(("blockIdx", "threadIdx")):
            if self.bind_thread is None:
                raise EmitError(f"loop '{s.var.name}' is bound to {kind}, which only GPU code has")
            self.env[s.var] = self.b.sext(self.bind_thread(kind), I64)
            self.stmt(s.body)
            return
        if (kind == "unroll" or (kind == "vectorize" and s.extent == 1)) and begin is None:
            for i in range(s.extent):
                self.env[s.var] = ir.Constant(I64, i)
                self.stmt(s.body)
            return
        if kind == "vectorize" and begin is None:
            if self.vec is not None:
                raise RuntimeError(f"nested vectorized loops ('{self.vec[0].name}', '{s.var.name}')")
            self.vec = (s.var, s.extent)
            try:
                self.stmt(s.body)
            finally:
                self.vec = None
            return
        b = self.b
        start = begin if begin is not None else ir.Constant(I64, 0)
        stop = end if end is not None else ir.Constant(I64, s.extent)
        pre = b.block
        head = b.append_basic_block(f"{s.var.name}.head")
        body = b.append_basic_block(f"{s.var.name}.body")
        done = b.append_basic_block(f"{s.var.name}.done")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, name=s.var.name)
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", i, stop), body, done)
        b.position_at_end(body)
        self.env[s.var] = i
        self.stmt(s.body)
        nxt = b.add(i, ir.Constant(I64, 1), flags=("nsw",))
        i.add_incoming(nxt, b.block)
        b.branch(head)
        b.position_at_end(done)

    def branch(self, s: If) -> None:
        cond = self.expr(s.cond)
        if cond.lanes != 1:
            raise RuntimeError(f"condition {s.cond!r} differs between vector lanes")
        b = self.b
        then = b.append_basic_block("then")
        after = b.append_basic_block("endif")
        b.cbranch(cond.value, then, after)
        b.position_at_end(then)
        self.stmt(s.then)
        b.branch(after)
        b.position_at_end(after)

    def store(self, s: Store) -> None:
        value = self.expr(s.value)
        buf = s.buffer
        index = buf.flat_index(s.indices)
        if self.vec is None:
            self.b.store(value.value, self.address(buf, self.expr(index).value), align=self._align(buf))
            return
        var, lanes = self.vec
        lin = linear(index, var)
        if lin is not None and lin[0] == 1:
            v = self.widen(value, lanes)
            ptr = self.address(buf, self.scalar_at(lin[1], var, 0))
            self.b.store(v.value, ptr, align=self._align(buf))
            return
        if lin is not None and lin[0] == 0:
            raise EmitError(f"vectorized loop '{var.name}' stores every lane to the same element of '{buf.name}'")
        v = self.widen(value, lanes)
        for lane in range(lanes):
            ptr = self.address(buf, self.scalar_at(index, var, lane))
            self.b.store(self.b.extract_element(v.value, ir.Constant(I32, lane)), ptr, align=self._align(buf))

    # ---- expressions -------------------------------------------------------------------------------
    def scalar_at(self, e: Expr, var: Var, lane: int) -> ir.Value:
        """`e` (an index) with the vector lane variable fixed to `lane`, emitted as a scalar."""
        saved = self.vec
        self.vec = None
        try:
            return self.expr(substitute(e, {var: const(lane)})).value
        finally:
            self.vec = saved

    def address(self, buf: Buffer, index: ir.Value) -> ir.Value:
        return self.b.gep(self.buffers[buf], [index], inbounds=True, source_etype=ir_type(buf.dtype))

    def _align(self, buf: Buffer) -> int:
        return np_dtype(buf.dtype).itemsize

    def widen(self, v: Val, lanes: int) -> Val:
        if v.lanes == lanes:
            return v
        if v.lanes != 1:
            raise RuntimeError(f"cannot mix vectors of {v.lanes} and {lanes} lanes")
        vt = ir.VectorType(v.value.type, lanes)
        if isinstance(v.value, ir.Constant):
            return Val(ir.Constant(vt, [v.value.constant] * lanes), lanes, v.dtype)
        one = self.b.insert_element(ir.Constant(vt, ir.Undefined), v.value, ir.Constant(I32, 0))
        zeros = ir.Constant(ir.VectorType(I32, lanes), [0] * lanes)
        splat = self.b.shuffle_vector(one, ir.Constant(vt, ir.Undefined), zeros)
        return Val(splat, lanes, v.dtype)

    def expr(self, e: Expr) -> Val:
        if isinstance(e, Const):
            return Val(ir.Constant(ir_type(e.dtype), e.value), 1, e.dtype)
        if isinstance(e, Var):
            if self.vec is not None and e is self.vec[0]:
                lanes = self.vec[1]
                return Val(ir.Constant(ir.VectorType(I64, lanes), list(range(lanes))), lanes, "i64")
            try:
                return Val(self.env[e], 1, e.dtype)
            except KeyError:
                raise RuntimeError(f"variable '{e.name}' is used outside its loop") from None
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Bin):
            return self.binary(e)
        if isinstance(e, Select):
            known = self.static(e.cond)
            if known is not None:  # (an unrolled loop's constant picks a case: emit only that one)
                return self.expr(e.t if known else e.f)
            c, t, f = self.expr(e.cond), self.expr(e.t), self.expr(e.f)
            lanes = max(c.lanes, t.lanes, f.lanes)
            c, t, f = self.widen(c, lanes), self.widen(t, lanes), self.widen(f, lanes)
            return Val(self.b.select(c.value, t.value, f.value), lanes, e.dtype)
        if isinstance(e, Cast):
            return self.cast(e)
        if isinstance(e, Call):
            return self.call(e)
        raise TypeError(f"cannot emit {type(e).__name__}")

    def static(self, e: Expr) -> int | bool | None:
        """The value of integer or comparison expression `e` when constants and the constants an unrolled
        loop binds determine it (None otherwise): a select on it then emits one side only."""
        if isinstance(e, Const):
            return e.value if e.dtype in ("i64", "bool") else None  # type: ignore[return-value]
        if isinstance(e, Var):
            if self.vec is not None and e is self.vec[0]:
                return None
            v = self.env.get(e)
            return v.constant if isinstance(v, ir.Constant) and v.type == I64 else None
        if isinstance(e, Bin) and e.op in _STATIC_OPS and e.a.dtype == "i64" and e.b.dtype == "i64":
            a = self.static(e.a)
            b = self.static(e.b) if a is not None else None
            return None if b is None else _STATIC_OPS[e.op](a, b)
        return None

    def load(self, e: Load) -> Val:
        buf = e.buffer
        index = buf.flat_index(e.indices)
        t = ir_type(buf.dtype)
        if self.vec is None or self.vec[0] not in free_vars(index):
            ptr = self.address(buf, self.expr(index).value)
            return Val(self.b.load(ptr, typ=t, align=self._align(buf)), 1, buf.dtype)
        var, lanes = self.vec
        lin = linear(index, var)
        if lin is not None and lin[0] == 1:
            ptr = self.address(buf, self.scalar_at(lin[1], var, 0))
            return Val(self.b.load(ptr, typ=ir.VectorType(t, lanes), align=self._align(buf)), lanes, buf.dtype)
        out = ir.Constant(ir.VectorType(t, lanes), ir.Undefined)
        for lane in range(lanes):
            ptr = self.address(buf, self.scalar_at(index, var, lane))
            x = self.b.load(ptr, typ=t, align=self._align(buf))
            out = self.b.insert_element(out, x, ir.Constant(I32, lane))
        return Val(out, lanes, buf.dtype)

    def binary(self, e: Bin) -> Val:
        a, c = self.expr(e.a), self.expr(e.b)
        lanes = max(a.lanes, c.lanes)
        a, c = self.widen(a, lanes), self.widen(c, lanes)
        x, y = a.value, c.value
        b = self.b
        op = e.op
        fl = is_float(e.a.dtype)
        if op in ("<", "<=", ">", ">=", "==", "!="):
            r = b.fcmp_ordered(op, x, y) if fl else b.icmp_signed(op, x, y)
            return Val(r, lanes, "bool")
        if op == "and":
            return Val(b.and_(x, y), lanes, "bool")
        if op == "or":
            return Val(b.or_(x, y), lanes, "bool")
        if op in ("min", "max"):
            pick = "<" if op == "min" else ">"
            cond = b.fcmp_ordered(pick, x, y) if fl else b.icmp_signed(pick, x, y)
            return Val(b.select(cond, x, y), lanes, e.dtype)
        if fl:
            fn = {"+": b.fadd, "-": b.fsub, "*": b.fmul, "/": b.fdiv}[op]
            return Val(fn(x, y, flags=_FLOAT), lanes, e.dtype)
        fn = {"+": b.add, "-": b.sub, "*": b.mul, "//": b.sdiv, "%": b.srem, "<<": b.shl, ">>": b.ashr,
              "&": b.and_, "|": b.or_, "^": b.xor}[op]
        return Val(fn(x, y), lanes, e.dtype)

    def cast(self, e: Cast) -> Val:
        v = self.expr(e.x)
        src, dst = e.x.dtype, e.dtype
        t = ir_type(dst)
        if v.lanes > 1:
            t = ir.VectorType(t, v.lanes)
        b = self.b
        if src == dst:
            return v
        if dst == "bool":  # numpy: nonzero is True
            zero = self.widen(Val(ir.Constant(v.value.type if v.lanes == 1 else v.value.type.element, 0), 1, src),
                              v.lanes).value
            cmp = b.fcmp_unordered("!=", v.value, zero) if is_float(src) else b.icmp_unsigned("!=", v.value, zero)
            return Val(cmp, v.lanes, dst)
        if is_float(src) and is_float(dst):
            r = b.fpext(v.value, t) if dst == "f64" else b.fptrunc(v.value, t)
        elif is_float(src):
            r = b.fptosi(v.value, t) if dst != "u8" else b.fptoui(v.value, t)
        elif is_float(dst):
            r = b.uitofp(v.value, t) if src in ("u8", "bool") else b.sitofp(v.value, t)
        else:  # integers: widen by the source's signedness, narrow by truncation (numpy's astype)
            src_bits = 1 if src == "bool" else np_dtype(src).itemsize * 8
            dst_bits = 1 if dst == "bool" else np_dtype(dst).itemsize * 8
            if src_bits < dst_bits:
                r = b.zext(v.value, t) if src in ("bool", "u8") else b.sext(v.value, t)
            elif src_bits > dst_bits:
                r = b.trunc(v.value, t)
            else:
                r = v.value
        return Val(r, v.lanes, dst)

    def call(self, e: Call) -> Val:
        args = [self.expr(a) for a in e.args]
        lanes = max(a.lanes for a in args)
        args = [self.widen(a, lanes) for a in args]
        t = args[0].value.type
        b = self.b
        if e.fn == "tanh":  # no intrinsic: 1 - 2 / (exp(2x) + 1), exact at +-inf
            x = args[0].value
            two = self.widen(Val(ir.Constant(ir_type(e.dtype), 2.0), 1, e.dtype), lanes).value
            one = self.widen(Val(ir.Constant(ir_type(e.dtype), 1.0), 1, e.dtype), lanes).value
            ex = self._exp_log("exp", b.fmul(x, two), t)
            return Val(b.fsub(one, b.fdiv(two, b.fadd(ex, one))), lanes, e.dtype)
        if e.fn in ("exp", "log"):
            return Val(self._exp_log(e.fn, args[0].value, t), lanes, e.dtype)
        if e.fn == "pow" and self.nvptx:  # no libm: x^y = exp(y log x), for the x > 0 it is defined on
            return Val(self._exp_log("exp", b.fmul(args[1].value, self._exp_log("log", args[0].value, t)), t),
                       lanes, e.dtype)
        name = f"llvm.{e.fn}"  # sqrt, fabs, rint, pow: LLVM's intrinsics of the same names
        return Val(b.call(self.intrinsic(name, t, len(args)), [a.value for a in args]), lanes, e.dtype)

    def _exp_log(self, fn: str, x: ir.Value, t: ir.Type) -> ir.Value:
        b = self.b
        if not self.nvptx:
            return b.call(self.intrinsic(f"llvm.{fn}", t), [x])
        # exp(x) = 2^(x log2 e); log(x) = log2(x) ln 2, with PTX's ex2.approx / lg2.approx (2 ulp)
        scalar = t.element if isinstance(t, ir.VectorType) else t
        if not isinstance(scalar, ir.FloatType):
            x = b.fptrunc(x, ir.VectorType(ir.FloatType(), t.count) if isinstance(t, ir.VectorType) else ir.FloatType())
        name = "llvm.nvvm.ex2.approx.f" if fn == "exp" else "llvm.nvvm.lg2.approx.f"
        try:
            f = self.module.get_global(name)
        except KeyError:
            f = ir.Function(self.module, ir.FunctionType(ir.FloatType(), [ir.FloatType()]), name)
        k = 1.4426950408889634 if fn == "exp" else 0.6931471805599453

        def one(v: ir.Value) -> ir.Value:
            c = ir.Constant(ir.FloatType(), k)
            return b.call(f, [b.fmul(v, c)]) if fn == "exp" else b.fmul(b.call(f, [v]), c)

        if isinstance(t, ir.VectorType):
            out = ir.Constant(ir.VectorType(ir.FloatType(), t.count), ir.Undefined)
            for lane in range(t.count):
                out = b.insert_element(out, one(b.extract_element(x, ir.Constant(I32, lane))), ir.Constant(I32, lane))
        else:
            out = one(x)
        if not isinstance(scalar, ir.FloatType):
            out = b.fpext(out, t)
        return out

    def intrinsic(self, base: str, t: ir.Type, arity: int = 1) -> ir.Function:
        """The overload of a float intrinsic of `arity` arguments for scalar or vector type `t`
        (``llvm.exp.v16f32``)."""
        elem = t.element if isinstance(t, ir.VectorType) else t
        suffix = "f64" if isinstance(elem, ir.DoubleType) else "f32"
        if isinstance(t, ir.VectorType):
            suffix = f"v{t.count}{suffix}"
        name = f"{base}.{suffix}"
        try:
            return self.module.get_global(name)
        except KeyError:
            return ir.Function(self.module, ir.FunctionType(t, [t] * arity), name)
