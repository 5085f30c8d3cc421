"""The loop-level IR: every schedule primitive keeps the values, errors name the culprit, the compile cache
works in memory and on disk, threads do not change results, and cross-compiled objects are ELF files of
the boards' machines."""

from __future__ import annotations

import numpy as np
import pytest

from weft.compiler.llvm.codegen_cpu import render_cpu, render_module
from weft.compiler.llvm.expr import Buffer, Call, const, exp, maximum, select
from weft.compiler.llvm.jit import build, cache_info, clear_cache, compile_object
from weft.compiler.llvm.lower import lower
from weft.compiler.llvm.schedule import ScheduleError
from weft.compiler.llvm.target import AARCH64, ARMV7, host_target
from weft.compiler.llvm.te import Kernel, compute, reduce_axis, reduce_max, reduce_sum

M, N, K = 12, 40, 9


def _matmul(name: str = "mm"):
    a, b, bias = Buffer("a", (M, K)), Buffer("b", (K, N)), Buffer("bias", (N,))
    k = reduce_axis(K, "k")
    c = compute("c", (M, N), lambda i, j: reduce_sum(a[i, k] * b[k, j], [k]),
                epilogue=lambda acc, i, j: maximum(acc + bias[j], 0.0))
    return a, b, bias, c


def _operands(seed: int = 0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    return a, b, bias, np.maximum(a @ b + bias, 0)


def _loops(c):
    """The matmul stage's row, column and reduction loops."""
    (i, j), (k,) = c.axes, c.reduce_axes
    return i, j, k


def _plain(c):
    """No schedule: one loop per axis, the reduction innermost."""


def _split_reorder(c):
    i, j, k = _loops(c)
    jo, ji = c.split(j, 8)
    c.reorder(jo, i, k, ji)


def _tile_vector_cache(c):
    i, j, k = _loops(c)
    io, jo, ii, ji = c.tile(i, j, 4, 8)
    c.reorder(io, jo, k, ii, ji)
    c.cache_write()
    c.vectorize(ji)
    c.unroll(ii)


def _fuse_parallel(c):
    i, j, k = _loops(c)
    jo, ji = c.split(j, 20)
    c.reorder(i, jo, k, ji)
    f = c.fuse(i, jo)
    c.parallel(f)
    c.vectorize(ji)
    c.cache_write()


def _guarded_splits(c):
    i, j, k = _loops(c)
    io, ii = c.split(i, 5)  # 12 = 5 + 5 + 2: guarded
    ko, ki = c.split(k, 4)  # 9 = 4 + 4 + 1: guarded reduction
    c.reorder(io, ko, ii, ki, j)
    c.cache_write()
    c.unroll(ki)


def _cache_read_local(c):
    i, j, k = _loops(c)
    jo, ji = c.split(j, 8)
    c.reorder(i, jo, k, ji)
    b = next(buf for buf in c.inputs() if buf.name == "b")
    c.cache_read(b, "local", jo)  # b's 9x8 panel, copied once per column block
    c.vectorize(ji)


@pytest.mark.parametrize("schedule", [_plain, _split_reorder, _tile_vector_cache, _fuse_parallel, _guarded_splits,
                                      _cache_read_local], ids=lambda f: f.__name__.strip("_"))
def test_every_schedule_computes_the_definition(schedule):
    a, b, bias, c = _matmul()
    schedule(c)
    fn = build(Kernel("mm", [a, b, bias], [c.out], [c]))
    xa, xb, xbias, want = _operands()
    got = np.empty((M, N), np.float32)
    fn(xa, xb, xbias, got, nthreads=2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_schedule_describes_its_loops():
    *_, c = _matmul()
    _tile_vector_cache(c)
    assert c.describe() == ["c.i.o[3]", "c.j.o[5]", "k[9]", "c.i.i[4]:unroll", "c.j.i[8]:vectorize"]


def test_vectorized_gathers_and_broadcasts():
    """A transposed read (stride != 1 along the lanes) gathers; a lane-invariant one broadcasts."""
    x, s = Buffer("x", (16, 24)), Buffer("s", (24,))
    y = compute("y", (24, 16), lambda i, j: x[j, i] * s[i] + x[j % 4, i])
    _, j = y.axes
    y.vectorize(j)
    fn = build(Kernel("tr", [x, s], [y.out], [y]))
    rng = np.random.default_rng(3)
    xv, sv = rng.standard_normal((16, 24)).astype(np.float32), rng.standard_normal(24).astype(np.float32)
    got = np.empty((24, 16), np.float32)
    fn(xv, sv, got)
    want = xv.T * sv[:, None] + np.tile(xv[:4].T, (1, 4))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # a fused multiply-add rounds once


def test_math_functions_scalar_and_vector():
    x = Buffer("x", (4, 16))
    fns = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "fabs": np.abs}
    rng = np.random.default_rng(0)
    xv = (rng.random((4, 16)) * 3 + 0.1).astype(np.float32)
    xv[0, :3] = [-2.0, 30.0, -30.0]
    for name, ref in fns.items():
        for vector in (False, True):
            y = compute("y", (4, 16), lambda i, j, name=name: Call(name, [x[i, j]]))
            if vector:
                y.vectorize(y.axes[1])
            fn = build(Kernel(f"f_{name}", [x], [y.out], [y]))
            got = np.empty_like(xv)
            inp = np.abs(xv) if name in ("log", "sqrt") else xv
            fn(inp, got)
            np.testing.assert_allclose(got, ref(inp), rtol=2e-6, atol=1e-7, err_msg=f"{name} vector={vector}")


def test_multi_stage_kernel_and_integer_arithmetic():
    """Stages run in order through a temp buffer; int8 loads widen, shifts and selects work per lane."""
    x = Buffer("x", (8, 32), "i8")
    r = reduce_axis(32, "r")
    row = compute("row", (8,), lambda i: reduce_sum(_widen(x[i, r]), [r]), dtype="i32")
    y = compute("y", (8, 32), lambda i, j: select(_widen(x[i, j]).gt(row[i] >> 3), _widen(x[i, j]) * 3, row[i]))
    y.vectorize(y.axes[1])
    fn = build(Kernel("ints", [x], [y.out], [row, y]))
    xv = np.random.default_rng(1).integers(-128, 128, (8, 32)).astype(np.int8)
    got = np.empty((8, 32), np.int32)
    fn(xv, got)
    rows = xv.astype(np.int32).sum(axis=1)
    want = np.where(xv.astype(np.int32) > (rows >> 3)[:, None], xv.astype(np.int32) * 3, rows[:, None])
    np.testing.assert_array_equal(got, want)


def _widen(e):
    from weft.compiler.llvm.expr import cast

    return cast("i32", e)


def test_max_reduction_and_exp_softmax_pieces():
    x = Buffer("x", (5, 33))
    r = reduce_axis(33, "r")
    mx = compute("mx", (5,), lambda i: reduce_max(x[i, r], [r]))
    y = compute("y", (5, 33), lambda i, j: exp(x[i, j] - mx[i]))
    fn = build(Kernel("sm", [x], [y.out], [mx, y]))
    xv = np.random.default_rng(2).standard_normal((5, 33)).astype(np.float32) * 4
    got = np.empty_like(xv)
    fn(xv, got)
    np.testing.assert_allclose(got, np.exp(xv - xv.max(axis=1, keepdims=True)), rtol=1e-6)


def test_threads_do_not_change_results():
    a, b, bias, c = _matmul()
    _fuse_parallel(c)
    fn = build(Kernel("mm", [a, b, bias], [c.out], [c]))
    xa, xb, xbias, _ = _operands(5)
    outs = []
    for threads in (1, 2, 3, 8, 1000):  # more threads than iterations or the pool holds: capped
        got = np.empty((M, N), np.float32)
        fn(xa, xb, xbias, got, nthreads=threads)
        outs.append(got)
    for got in outs[1:]:
        np.testing.assert_array_equal(got, outs[0])


# ---- errors ---------------------------------------------------------------------------------------------


def test_schedule_errors_name_the_stage_and_loop():
    *_, c = _matmul()
    i, j, k = _loops(c)
    with pytest.raises(ScheduleError, match="stage 'c': 'nope' is not a current loop"):
        from weft.compiler.llvm.schedule import Axis

        c.split(Axis("nope", 4), 2)
    with pytest.raises(ScheduleError, match="adjacent"):
        c.fuse(i, k)
    with pytest.raises(ScheduleError, match="split factor"):
        c.split(j, 0)
    c.vectorize(j)
    with pytest.raises(ScheduleError, match="before annotating"):
        c.split(j, 4)

    *_, c2 = _matmul()
    c2.vectorize(c2.axes[1])  # j is not innermost: k is inside it
    with pytest.raises(ScheduleError, match=r"stage 'c': the vectorized loop 'c\.j' must be innermost"):
        lower(_kernel(c2))

    *_, c3 = _matmul()
    c3.parallel(c3.axes[1])
    with pytest.raises(ScheduleError, match=r"only the outermost spatial loop can be parallel, 'c\.j' is loop 1"):
        lower(_kernel(c3))

    *_, c4 = _matmul()
    c4.reorder(c4.axes[0], c4.reduce_axes[0], c4.axes[1])
    c4.vectorize(c4.reduce_axes[0])
    with pytest.raises(ScheduleError, match="cannot vectorize reduce loop 'k'"):
        lower(_kernel(c4))

    *_, c5 = _matmul()
    jo, ji = c5.split(c5.axes[1], 16)  # 40 = 16 + 16 + 8 lanes: a guard on the lanes
    c5.reorder(c5.axes[0], jo, c5.reduce_axes[0], ji)
    c5.vectorize(ji)
    with pytest.raises(ScheduleError, match="needs a guard"):
        lower(_kernel(c5))


def _kernel(stage):
    return Kernel("k", stage.inputs(), [stage.out], [stage])


def test_definition_errors():
    x = Buffer("x", (4,))
    with pytest.raises(TypeError, match="differ in type"):
        compute("y", (4,), lambda i: x[i] + const(1, "i32"))
    with pytest.raises(IndexError, match="has 1 dimensions, indexed with 2"):
        compute("y", (4,), lambda i: x[i, i])
    with pytest.raises(TypeError, match="use // for index arithmetic"):
        compute("y", (4,), lambda i: x[i / 2])
    with pytest.raises(ValueError, match="positive"):
        Buffer("z", (0, 3))
    y = compute("y", (4,), lambda i: x[i] * 2.0)
    with pytest.raises(ValueError, match="reads 'x', which is neither an input"):
        Kernel("k", [], [y.out], [y])


# ---- compile cache and targets ----------------------------------------------------------------------------


def test_compile_cache_in_memory_and_on_disk(tmp_path):
    clear_cache()
    a, b, bias, c = _matmul()
    _split_reorder(c)
    kernel = Kernel("cached", [a, b, bias], [c.out], [c])
    build(kernel, cache_dir=tmp_path)
    assert cache_info()["misses"] == 1
    build(kernel, cache_dir=tmp_path)
    assert cache_info()["hits"] == 1 and cache_info()["misses"] == 1
    objects = list(tmp_path.glob("*.o"))
    assert len(objects) == 1 and objects[0].stat().st_size > 0
    clear_cache()  # a new process: only the disk copy remains
    fn = build(kernel, cache_dir=tmp_path)
    assert cache_info()["disk_hits"] == 1 and cache_info()["misses"] == 0
    xa, xb, xbias, want = _operands()
    got = np.empty((M, N), np.float32)
    fn(xa, xb, xbias, got)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # another schedule is another IR, hence another key
    a2, b2, bias2, c2 = _matmul()
    build(Kernel("cached", [a2, b2, bias2], [c2.out], [c2]), cache_dir=tmp_path)
    assert cache_info()["misses"] == 1 and len(list(tmp_path.glob("*.o"))) == 2


def test_same_definition_renders_the_same_ir():
    """The cache key is the IR text: two identical kernels built separately share one compiled module."""
    texts = []
    for _ in range(2):
        a, b, bias, c = _matmul()
        _tile_vector_cache(c)
        texts.append(render_cpu(Kernel("mm", [a, b, bias], [c.out], [c]), host_target()))
    assert texts[0] == texts[1]


def _elf(data: bytes) -> tuple[int, int]:
    assert data[:4] == b"\x7fELF"
    return data[4], int.from_bytes(data[18:20], "little" if data[5] == 1 else "big")


@pytest.mark.parametrize("target,elf_class", [(ARMV7, 1), (AARCH64, 2)], ids=["armv7", "aarch64"])
def test_cross_compiled_objects_for_the_boards(target, elf_class):
    a, b, bias, c = _matmul()
    lanes = target.lanes(4)
    i, j, k = _loops(c)
    jo, ji = c.split(j, lanes * 2 if N % (lanes * 2) == 0 else lanes)
    c.reorder(i, jo, k, ji)
    f = c.fuse(i, jo)
    c.parallel(f)
    c.vectorize(ji)
    c.cache_write()
    text = render_module([Kernel("mm", [a, b, bias], [c.out], [c])], target)
    obj = compile_object(text, target)
    assert _elf(obj) == (elf_class, target.elf_machine)
    assert b"mm" in obj and b"pthread_create" in obj  # the entry point, and threads from the board's libc


@pytest.mark.parametrize("target", [ARMV7, AARCH64], ids=["armv7", "aarch64"])
def test_cross_compiled_graph_for_the_boards(target):
    """Every kernel of a float CNN in one object file for the board's CPU, with the call sequence."""
    import weft
    from weft.compiler import models
    from weft.compiler.llvm.graph import cross_compile

    graph = weft.compile(models.small_resnet(), target="cpu").graph
    obj, calls = cross_compile(graph, target)
    assert _elf(obj)[1] == target.elf_machine
    assert {c["node"] for c in calls} == {n.name for n in graph.nodes}
    for c in calls:
        assert c["symbol"].encode() in obj
        assert all(b["dtype"] == "f32" for b in c["buffers"])
    # NEON registers hold 4 floats: convolution outputs are blocked by 4 channels, not the host's 16
    conv = next(c for c in calls if c["symbol"].endswith("_conv"))
    assert conv["buffers"][-1]["shape"][-1] == 4


def test_parallel_kernels_from_several_python_threads():
    """The pool runs one job at a time; a caller that finds it busy runs its loop alone. Results never
    mix, however the calls interleave."""
    from concurrent.futures import ThreadPoolExecutor

    x = Buffer("x", (64, 256))
    y = compute("y", (64, 256), lambda i, j: x[i, j] * 2.0 - 0.5)  # exact: a fused multiply-add gives the same
    i, j = y.axes
    y.vectorize(j)
    y.parallel(i)
    fn = build(Kernel("stress", [x], [y.out], [y]))

    def worker(seed: int) -> bool:
        rng = np.random.default_rng(seed)
        for _ in range(100):
            xv = rng.standard_normal((64, 256)).astype(np.float32)
            out = np.empty_like(xv)
            fn(xv, out, nthreads=int(rng.integers(1, 4)))
            if not np.array_equal(out, xv * np.float32(2) - np.float32(0.5)):
                return False
        return True

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(worker, range(4)))


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 7, 17, 64, 1001])
def test_every_iteration_runs_on_any_split(rows):
    """Each participant takes its own contiguous range first and then the others' leftovers: whatever
    the extent and thread count (more threads than rows, ranges of one row, odd splits), every row is
    computed."""
    x = Buffer("x", (rows, 16))
    y = compute("y", (rows, 16), lambda i, j: x[i, j] * 2.0 - 0.5)
    i, j = y.axes
    y.vectorize(j)
    y.parallel(i)
    fn = build(Kernel(f"split{rows}", [x], [y.out], [y]))
    xv = np.random.default_rng(rows).standard_normal((rows, 16)).astype(np.float32)
    for threads in (2, 3, 5, 8):
        out = np.full_like(xv, np.nan)
        fn(xv, out, nthreads=threads)
        np.testing.assert_array_equal(out, xv * np.float32(2) - np.float32(0.5))


def test_pool_starts_afresh_in_a_forked_child():
    """A child forked after the pool started has none of its threads; its parallel kernels still run."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import os, numpy as np
        from weft.compiler.llvm.expr import Buffer
        from weft.compiler.llvm.jit import build
        from weft.compiler.llvm.te import Kernel, compute
        x = Buffer("x", (64, 256))
        y = compute("y", (64, 256), lambda i, j: x[i, j] * 2.0)
        i, j = y.axes
        y.vectorize(j)
        y.parallel(i)
        fn = build(Kernel("forked", [x], [y.out], [y]))
        a = np.random.rand(64, 256).astype(np.float32)
        out = np.empty_like(a)
        fn(a, out, nthreads=2)
        pid = os.fork()
        if pid == 0:
            child = np.empty_like(a)
            for _ in range(20):
                fn(a, child, nthreads=2)
            os._exit(0 if np.array_equal(child, a * 2) else 1)
        _, status = os.waitpid(pid, 0)
        print(np.array_equal(out, a * 2), os.waitstatus_to_exitcode(status))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "0"], out.stderr
