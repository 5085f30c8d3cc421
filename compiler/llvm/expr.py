"""Scalar expressions of the loop-level IR: constants, variables, arithmetic, loads from buffers.

An expression is a small immutable tree with a dtype. Index arithmetic is ``i64``; data is whatever the
buffer holds (``f32`` for float models, ``i8``/``i16``/``i32`` for quantized layers). Nodes compare by
identity (two ``Var("i")`` are different loop variables); :func:`substitute`, :func:`linear` and
:func:`simplify` are the only symbolic reasoning the scheduler and the code generators need.

Operators are overloaded for readability (``A[i, k] * B[k, j] + 1``); comparisons are methods
(``x.lt(y)``) so that ``==`` keeps meaning identity and expressions stay usable as dict keys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "DTYPES", "Bin", "Buffer", "Call", "Cast", "Const", "Expr", "Load", "Select", "Var", "as_expr", "cast",
    "const", "exp", "free_vars", "linear", "maximum", "minimum", "np_dtype", "row_major_strides", "select", "simplify",
    "substitute",
]

#: dtype name -> numpy dtype. ``bool`` is the type of comparisons.
DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype(np.float32), "f64": np.dtype(np.float64), "i8": np.dtype(np.int8), "u8": np.dtype(np.uint8),
    "i16": np.dtype(np.int16), "i32": np.dtype(np.int32), "i64": np.dtype(np.int64), "bool": np.dtype(np.bool_),
}
_BY_NUMPY = {v: k for k, v in DTYPES.items()}


def np_dtype(dtype: str) -> np.dtype:
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown loop-IR dtype '{dtype}' (known: {', '.join(DTYPES)})") from None


def dtype_of_numpy(dt: Any) -> str:
    try:
        return _BY_NUMPY[np.dtype(dt)]
    except KeyError:
        raise ValueError(f"numpy dtype {np.dtype(dt)} has no loop-IR dtype") from None


def is_float(dtype: str) -> bool:
    return dtype in ("f32", "f64")


_ARITH = ("+", "-", "*", "/", "//", "%", "min", "max", "<<", ">>", "&", "|", "^")
_COMPARE = ("<", "<=", ">", ">=", "==", "!=")
_LOGIC = ("and", "or")


class Expr:
    """Base of all expressions; ``dtype`` is a key of :data:`DTYPES`."""

    __slots__ = ("dtype",)
    dtype: str

    # arithmetic: the other operand takes this one's dtype when it is a Python number
    def __add__(self, o: Any) -> Expr: return _bin("+", self, o)
    def __radd__(self, o: Any) -> Expr: return _bin("+", o, self)
    def __sub__(self, o: Any) -> Expr: return _bin("-", self, o)
    def __rsub__(self, o: Any) -> Expr: return _bin("-", o, self)
    def __mul__(self, o: Any) -> Expr: return _bin("*", self, o)
    def __rmul__(self, o: Any) -> Expr: return _bin("*", o, self)
    def __truediv__(self, o: Any) -> Expr: return _bin("/", self, o)
    def __rtruediv__(self, o: Any) -> Expr: return _bin("/", o, self)
    def __floordiv__(self, o: Any) -> Expr: return _bin("//", self, o)
    def __mod__(self, o: Any) -> Expr: return _bin("%", self, o)
    def __lshift__(self, o: Any) -> Expr: return _bin("<<", self, o)
    def __rshift__(self, o: Any) -> Expr: return _bin(">>", self, o)
    def __and__(self, o: Any) -> Expr: return _bin("&", self, o)
    def __neg__(self) -> Expr: return _bin("-", const(0, self.dtype), self)

    def lt(self, o: Any) -> Expr: return _bin("<", self, o)
    def gt(self, o: Any) -> Expr: return _bin(">", self, o)
    def ge(self, o: Any) -> Expr: return _bin(">=", self, o)
    def eq(self, o: Any) -> Expr: return _bin("==", self, o)
    def logical_and(self, o: Any) -> Expr: return _bin("and", self, o)


class Const(Expr):
    __slots__ = ("value",)

    def __init__(self, value: int | float | bool, dtype: str):
        np_dtype(dtype)
        self.dtype = dtype
        self.value = bool(value) if dtype == "bool" else float(value) if is_float(dtype) else int(value)

    def __repr__(self) -> str:
        return f"{self.value}" if self.dtype in ("i64", "f32") else f"{self.value}:{self.dtype}"


class Var(Expr):
    """A variable: a loop index (``i64``) or a placeholder bound during lowering."""

    __slots__ = ("name",)

    def __init__(self, name: str, dtype: str = "i64"):
        np_dtype(dtype)
        self.name = name
        self.dtype = dtype

    def __repr__(self) -> str:
        return self.name


class Bin(Expr):
    """``a op b``. Integer ``//`` and ``%`` are index arithmetic on non-negative operands (``/`` is for
    floats); ``>>`` is arithmetic; comparisons and logic give ``bool``."""

    __slots__ = ("a", "b", "op")

    def __init__(self, op: str, a: Expr, b: Expr):
        if op not in _ARITH + _COMPARE + _LOGIC:
            raise ValueError(f"unknown operator '{op}'")
        if a.dtype != b.dtype:
            raise TypeError(f"operands of '{op}' differ in type: {a.dtype} and {b.dtype} ({a!r}, {b!r})")
        if op in ("//", "%", "<<", ">>", "&", "|", "^") and is_float(a.dtype):
            raise TypeError(f"'{op}' needs integer operands, got {a.dtype}")
        if op == "/" and not is_float(a.dtype):
            raise TypeError(f"'/' needs float operands, got {a.dtype} (use // for index arithmetic)")
        if op in _LOGIC and a.dtype != "bool":
            raise TypeError(f"'{op}' needs bool operands, got {a.dtype}")
        self.op, self.a, self.b = op, a, b
        self.dtype = "bool" if op in _COMPARE else a.dtype

    def __repr__(self) -> str:
        if self.op in ("min", "max"):
            return f"{self.op}({self.a!r}, {self.b!r})"
        return f"({self.a!r} {self.op} {self.b!r})"


class Call(Expr):
    """A math function of float arguments: ``exp``, ``log``, ``sqrt``, ``tanh``, ``fabs``, ``rint``
    (round half to even, numpy's ``rint``), and ``pow`` of two arguments."""

    __slots__ = ("args", "fn")
    FUNCTIONS = ("exp", "log", "sqrt", "tanh", "fabs", "rint", "pow")

    def __init__(self, fn: str, args: Sequence[Expr]):
        if fn not in self.FUNCTIONS:
            raise ValueError(f"unknown function '{fn}' (known: {', '.join(self.FUNCTIONS)})")
        if not args or not all(is_float(a.dtype) for a in args):
            raise TypeError(f"{fn} needs float arguments")
        if len(args) != (2 if fn == "pow" else 1) or len({a.dtype for a in args}) > 1:
            raise TypeError(f"{fn} takes {2 if fn == 'pow' else 1} argument(s) of one float type")
        self.fn, self.args = fn, tuple(args)
        self.dtype = args[0].dtype

    def __repr__(self) -> str:
        return f"{self.fn}({', '.join(map(repr, self.args))})"


class Select(Expr):
    __slots__ = ("cond", "f", "t")

    def __init__(self, cond: Expr, t: Expr, f: Expr):
        if cond.dtype != "bool":
            raise TypeError(f"a select condition must be bool, got {cond.dtype}")
        if t.dtype != f.dtype:
            raise TypeError(f"select branches differ in type: {t.dtype} and {f.dtype}")
        self.cond, self.t, self.f = cond, t, f
        self.dtype = t.dtype

    def __repr__(self) -> str:
        return f"select({self.cond!r}, {self.t!r}, {self.f!r})"


class Cast(Expr):
    """Conversion: float->int truncates toward zero, int->int wraps or sign-extends (numpy's astype)."""

    __slots__ = ("x",)

    def __init__(self, dtype: str, x: Expr):
        np_dtype(dtype)
        self.dtype, self.x = dtype, x

    def __repr__(self) -> str:
        return f"{self.dtype}({self.x!r})"


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Elements between neighbours along each dimension of a row-major (C order) array of `shape`."""
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))


class Buffer:
    """A dense row-major array the generated code reads and writes.

    ``scope`` is "global" (a kernel parameter: memory the caller owns), "local" (a small array the code
    generator may keep in registers) or "shared" (GPU shared memory).
    """

    __slots__ = ("dtype", "name", "scope", "shape")

    def __init__(self, name: str, shape: Sequence[int], dtype: str = "f32", scope: str = "global"):
        np_dtype(dtype)
        if scope not in ("global", "local", "shared"):
            raise ValueError(f"buffer '{name}': unknown scope '{scope}'")
        self.name = name
        self.shape = tuple(int(d) for d in shape)
        if any(d < 1 for d in self.shape):
            raise ValueError(f"buffer '{name}': every dimension must be positive, got {list(self.shape)}")
        self.dtype = dtype
        self.scope = scope

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def strides(self) -> tuple[int, ...]:
        return row_major_strides(self.shape)

    def __getitem__(self, index: Any) -> Load:
        index = index if isinstance(index, tuple) else (index,)
        return Load(self, [as_expr(i, "i64") for i in index])

    def flat_index(self, indices: Sequence[Expr]) -> Expr:
        """The row-major element offset of `indices`."""
        total: Expr | None = None
        for idx, stride in zip(indices, self.strides, strict=True):
            term = idx if stride == 1 else idx * stride
            total = term if total is None else total + term
        return simplify(total if total is not None else const(0, "i64"))

    def __repr__(self) -> str:
        return f"{self.name}{list(self.shape)}:{self.dtype}" + ("" if self.scope == "global" else f"@{self.scope}")


class Load(Expr):
    __slots__ = ("buffer", "indices")

    def __init__(self, buffer: Buffer, indices: Sequence[Expr]):
        if len(indices) != len(buffer.shape):
            raise IndexError(f"buffer {buffer!r} has {len(buffer.shape)} dimensions, indexed with {len(indices)}")
        for i in indices:
            if i.dtype != "i64":
                raise TypeError(f"index {i!r} of buffer '{buffer.name}' must be i64, got {i.dtype}")
        self.buffer, self.indices = buffer, tuple(indices)
        self.dtype = buffer.dtype

    def __repr__(self) -> str:
        return f"{self.buffer.name}[{', '.join(map(repr, self.indices))}]"


# ---- construction helpers ----------------------------------------------------------------------------


def const(value: int | float | bool, dtype: str = "i64") -> Const:
    return Const(value, dtype)


def as_expr(x: Any, dtype: str) -> Expr:
    """`x` as an expression: expressions pass through, Python/numpy numbers become constants of `dtype`."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, (bool, np.bool_)):
        return Const(bool(x), "bool")
    if isinstance(x, (int, float, np.integer, np.floating)):
        return Const(x, dtype)
    raise TypeError(f"cannot use {type(x).__name__} {x!r} in an expression")


def _bin(op: str, a: Any, b: Any) -> Expr:
    if not isinstance(a, Expr):
        a = as_expr(a, b.dtype)
    if not isinstance(b, Expr):
        b = as_expr(b, a.dtype)
    return Bin(op, a, b)


def select(cond: Expr, t: Any, f: Any) -> Expr:
    dtype = t.dtype if isinstance(t, Expr) else f.dtype
    return Select(cond, as_expr(t, dtype), as_expr(f, dtype))


def maximum(a: Any, b: Any) -> Expr:
    return _bin("max", a, b)


def minimum(a: Any, b: Any) -> Expr:
    return _bin("min", a, b)


def exp(x: Expr) -> Expr:
    return Call("exp", [x])


def cast(dtype: str, x: Expr) -> Expr:
    return x if x.dtype == dtype else Cast(dtype, x)


# ---- analysis ----------------------------------------------------------------------------------------


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Bin):
        return (e.a, e.b)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Select):
        return (e.cond, e.t, e.f)
    if isinstance(e, Cast):
        return (e.x,)
    if isinstance(e, Load):
        return e.indices
    return ()


def walk(e: Expr) -> Iterable[Expr]:
    """Every node of `e`, pre-order, left to right."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def free_vars(e: Expr) -> set[Var]:
    return {n for n in walk(e) if isinstance(n, Var)}


def loads(e: Expr) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load)]


def rebuild(e: Expr, fn: Callable[[Expr], Expr]) -> Expr:
    """`e` with `fn` applied to each child (bottom-up rewriting helper)."""
    if isinstance(e, Bin):
        return Bin(e.op, fn(e.a), fn(e.b))
    if isinstance(e, Call):
        return Call(e.fn, [fn(a) for a in e.args])
    if isinstance(e, Select):
        return Select(fn(e.cond), fn(e.t), fn(e.f))
    if isinstance(e, Cast):
        return Cast(e.dtype, fn(e.x))
    if isinstance(e, Load):
        return Load(e.buffer, [fn(i) for i in e.indices])
    return e


def substitute(e: Expr, mapping: Mapping[Var, Expr]) -> Expr:
    """`e` with every variable in `mapping` replaced (one pass, no recursion into the replacements)."""
    if not mapping:
        return e

    def go(x: Expr) -> Expr:
        if isinstance(x, Var):
            return mapping.get(x, x)
        return rebuild(x, go)

    return simplify(go(e))


def linear(e: Expr, var: Var) -> tuple[int, Expr] | None:
    """``(c, rest)`` with ``e == c * var + rest`` and `var` absent from `rest`; None when `e` is not
    affine in `var` with a constant coefficient (the vectorizer then gathers lane by lane)."""
    if var not in free_vars(e):
        return 0, e
    if e is var:
        return 1, const(0, e.dtype)
    if isinstance(e, Bin) and e.op in ("+", "-"):
        la, lb = linear(e.a, var), linear(e.b, var)
        if la is None or lb is None:
            return None
        sign = 1 if e.op == "+" else -1
        return la[0] + sign * lb[0], simplify(Bin(e.op, la[1], lb[1]))
    if isinstance(e, Bin) and e.op == "*":
        for x, k in ((e.a, e.b), (e.b, e.a)):
            if isinstance(k, Const):
                lx = linear(x, var)
                if lx is None:
                    return None
                return lx[0] * int(k.value), simplify(Bin("*", lx[1], k))
    return None


def simplify(e: Expr) -> Expr:
    """Constant folding and the identities x+0, x*1, x*0, x//1, x%1 on integer index arithmetic."""
    if isinstance(e, Bin):
        a, b = simplify(e.a), simplify(e.b)
        if isinstance(a, Const) and isinstance(b, Const) and e.dtype == "i64":
            return Const(_fold(e.op, a.value, b.value), "i64")  # type: ignore[arg-type]
        if e.dtype == "i64":
            if e.op == "+":
                if _is(a, 0):
                    return b
                if _is(b, 0):
                    return a
            if e.op == "-" and _is(b, 0):
                return a
            if e.op == "*":
                if _is(a, 1):
                    return b
                if _is(b, 1):
                    return a
                if _is(a, 0) or _is(b, 0):
                    return Const(0, "i64")
            if e.op == "//" and _is(b, 1):
                return a
            if e.op == "%" and _is(b, 1):
                return Const(0, "i64")
        return e if (a is e.a and b is e.b) else Bin(e.op, a, b)
    return e


def _is(e: Expr, v: int) -> bool:
    return isinstance(e, Const) and e.value == v


def _fold(op: str, a: int, b: int) -> int | bool:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "//":
        return a // b
    if op == "%":
        return a % b
    if op == "min":
        return min(a, b)
    if op == "max":
        return max(a, b)
    if op == "<<":
        return a << b
    if op == ">>":
        return a >> b
    if op == "&":
        return a & b
    if op == "|":
        return a | b
    if op == "^":
        return a ^ b
    raise ValueError(f"cannot fold '{op}' on i64")
