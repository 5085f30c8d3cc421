"""Compile LLVM IR (cached by its hash) and call the result: JIT for the host, object files for boards.

Code generation is three steps (render, compile, run) and only the middle one is slow, so it is keyed by
``sha256(LLVM version, target, optimization level, IR text)``: an in-memory cache per process, and, when
a ``cache_dir`` is passed explicitly, object files on disk that a later process loads without running
LLVM's optimizer or code generator. Nothing is ever cached in a default location.

Each compiled module gets its own MCJIT engine (an engine owns its target machine), so two modules may
define the same symbol names without clashing. The parallel-for runtime is JIT-compiled once per process
into an engine that is never freed, and kernels call it by name.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm
import numpy as np

from weft.compiler.llvm.codegen_cpu import (
    FORKED_SYMBOL,
    RUNTIME_SYMBOL,
    SEQUENCE_IR,
    SEQUENCE_SYMBOL,
    render_module,
    runtime_ir,
)
from weft.compiler.llvm.expr import Buffer, np_dtype
from weft.compiler.llvm.target import Target, host_target, resolve_target
from weft.compiler.llvm.te import Kernel
from weft.core.files import write_atomic

__all__ = [
    "CompiledKernel", "CompiledModule", "build", "cache_info", "clear_cache", "compile_ir", "compile_object",
    "init_llvm", "optimize", "sequence_runner", "target_machine",
]

OPT_LEVEL = 3
_lock = threading.RLock()
_initialized = False
_MEMORY: dict[str, CompiledModule] = {}
_OBJECTS: dict[str, bytes] = {}
_STATS = {"hits": 0, "disk_hits": 0, "rejected": 0, "misses": 0}
#: the C signature every kernel shares: void kernel(void **buffers, int32_t nthreads)
KERNEL_PROTO = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32)


def init_llvm() -> None:
    """Register every target LLVM was built with (host JIT, ARM, AArch64, NVPTX); idempotent."""
    global _initialized
    with _lock:
        if not _initialized:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialized = True


def target_machine(target: Target, opt: int = OPT_LEVEL, jit: bool = False) -> Any:
    """The llvmlite target machine of `target`: position-independent code for objects, or the JIT's
    relocation and code model when `jit`."""
    init_llvm()
    t = llvm.Target.from_triple(target.triple)
    reloc = "default" if jit else "pic"
    return t.create_target_machine(cpu=target.cpu, features=target.features, opt=opt, reloc=reloc,
                                   codemodel="jitdefault" if jit else "default")


def optimize(ir_text: str, target: Target, opt: int = OPT_LEVEL, link: Sequence[str] = ()) -> Any:
    """Parse `ir_text` (linking in the modules of `link`), verify and optimize it for `target`; returns
    the llvmlite module."""
    init_llvm()
    module = llvm.parse_assembly(ir_text)
    for other in link:
        module.link_in(llvm.parse_assembly(other))
    module.triple = target.triple
    tm = target_machine(target, opt)
    module.data_layout = str(tm.target_data)
    module.verify()
    pto = llvm.create_pipeline_tuning_options(opt)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(module, pb)
    return module


def cache_key(ir_text: str, target: Target, opt: int = OPT_LEVEL, kind: str = "jit") -> str:
    h = hashlib.sha256()
    for part in (kind, str(llvm.llvm_version_info), target.key, str(opt), ir_text):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def compile_object(ir_text: str, target: str | Target, opt: int = OPT_LEVEL, cache_dir: str | Path | None = None
                   ) -> bytes:
    """An ELF object file of `ir_text` for `target` (cross-compilation: armv7, aarch64, or the host)."""
    target = resolve_target(target)
    key = cache_key(ir_text, target, opt, "object")
    with _lock:
        if key in _OBJECTS:
            _STATS["hits"] += 1
            return _OBJECTS[key]
    def emit() -> bytes:
        # a board has no JIT to lend it the runtime: the object carries its own parallel-for
        link = [runtime_ir(target)] if RUNTIME_SYMBOL in ir_text and target.kind == "cpu" else []
        return target_machine(target, opt).emit_object(optimize(ir_text, target, opt, link))

    data = _cached(cache_dir, key, emit)
    with _lock:
        _OBJECTS[key] = data
    return data


#: target key -> the runtime's after-fork entry point (its engine is detached: it lives as long as the process)
_RUNTIME_ENGINES: dict[str, Any] = {}


def _ensure_runtime(target: Target) -> None:
    """JIT the parallel-for runtime once per process and target and publish its symbol to later modules.
    Its engine is never freed: a worker thread that starts late may still be running its code."""
    with _lock:
        if target.key in _RUNTIME_ENGINES:
            return
        module = optimize(runtime_ir(target), target)
        engine = llvm.create_mcjit_compiler(module, target_machine(target, OPT_LEVEL, jit=True))
        engine.finalize_object()
        llvm.add_symbol(RUNTIME_SYMBOL, engine.get_function_address(RUNTIME_SYMBOL))
        forked = ctypes.CFUNCTYPE(None)(engine.get_function_address(FORKED_SYMBOL))
        # never disposed, not even when the interpreter exits while a worker still spins in this code
        engine.detach()
        _RUNTIME_ENGINES[target.key] = forked
        os.register_at_fork(after_in_child=forked)  # the child's pool has no threads: start it afresh


#: void weft_run_sequence(void **kernels, void ***buffers, int64_t n, int32_t nthreads, int64_t *stamps)
SEQUENCE_PROTO = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32,
                                  ctypes.c_void_p)
_SEQUENCE: list[Any] = []


def sequence_runner() -> Any:
    """The host's kernel-sequence runner (:data:`~weft.compiler.llvm.codegen_cpu.SEQUENCE_IR`), JIT-compiled
    once per process; None where its clock is not known to link (a host other than 64-bit Linux)."""
    with _lock:
        if not _SEQUENCE:
            target = host_target()
            linux64 = os.uname().sysname == "Linux" and target.triple.split("-")[0] in ("x86_64", "aarch64")
            fn = None
            if linux64:
                module = optimize(f'target triple = "{target.triple}"\n' + SEQUENCE_IR, target)
                engine = llvm.create_mcjit_compiler(module, target_machine(target, OPT_LEVEL, jit=True))
                engine.finalize_object()
                fn = SEQUENCE_PROTO(engine.get_function_address(SEQUENCE_SYMBOL))
                engine.detach()  # lives as long as the process, like the parallel-for runtime
            _SEQUENCE.append(fn)
        return _SEQUENCE[0]


#: A cache file: this magic, sha256(key, object), then the object. The key hashes the IR text, target, opt
#: level and LLVM version, so the digest ties the bytes to what they were compiled from.
_MAGIC = b"weft-llvm-object-1\n"


def _digest(key: str, data: bytes) -> bytes:
    return hashlib.sha256(key.encode() + b"\0" + data).digest()


def _cached(cache_dir: str | Path | None, key: str, emit: Callable[[], bytes]) -> bytes:
    """The object of `key`: from `cache_dir` if its file verifies, else `emit()`ed and stored there.

    A file that does not verify (truncated, edited, written by another weft) is never loaded: the object
    is compiled again and the file replaced. The digest guards against damage, not against someone who
    can write the cache folder and recompute it: keep that folder as private as the code it holds."""
    path = Path(cache_dir) / f"{key}.o" if cache_dir is not None else None
    if path is not None and path.is_file():
        blob = path.read_bytes()
        head, digest, data = blob[:len(_MAGIC)], blob[len(_MAGIC):len(_MAGIC) + 32], blob[len(_MAGIC) + 32:]
        if head == _MAGIC and hmac.compare_digest(digest, _digest(key, data)):
            _STATS["disk_hits"] += 1
            return data
        _STATS["rejected"] += 1
    _STATS["misses"] += 1
    data = emit()
    if path is not None:
        _write(path, _MAGIC + _digest(key, data) + data)
    return data


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)  # a temporary file renamed over the old: a reader never sees half a file


@dataclass(eq=False)
class CompiledModule:
    """A JIT-compiled module: symbol addresses, and the engine that keeps the code alive."""

    key: str
    engine: Any
    addresses: dict[str, int] = field(default_factory=dict)

    def address(self, name: str) -> int:
        if name not in self.addresses:
            addr = self.engine.get_function_address(name)
            if not addr:
                raise KeyError(f"compiled module has no function '{name}'")
            self.addresses[name] = addr
        return self.addresses[name]


def compile_ir(ir_text: str, target: Target | None = None, opt: int = OPT_LEVEL,
               cache_dir: str | Path | None = None) -> CompiledModule:
    """JIT-compile `ir_text` for the host (cached by the hash of the IR, see the module docstring)."""
    target = target or host_target()
    _ensure_runtime(target)
    key = cache_key(ir_text, target, opt)
    with _lock:
        hit = _MEMORY.get(key)
        if hit is not None:
            _STATS["hits"] += 1
            return hit
    data = _cached(cache_dir, key,
                   lambda: target_machine(target, opt, jit=True).emit_object(optimize(ir_text, target, opt)))
    with _lock:
        if key in _MEMORY:  # another thread compiled it meanwhile
            return _MEMORY[key]
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), target_machine(target, opt, jit=True))
        engine.add_object_file(llvm.ObjectFileRef.from_data(data))
        engine.finalize_object()
        compiled = CompiledModule(key, engine)
        _MEMORY[key] = compiled
        return compiled


def cache_info() -> dict[str, int]:
    """Compile-cache counters of this process: hits, disk_hits, rejected (cache files that did not verify),
    misses, and modules held."""
    return {**_STATS, "modules": len(_MEMORY), "objects": len(_OBJECTS)}


def clear_cache() -> None:
    """Forget every compiled module of this process (code still referenced stays alive)."""
    with _lock:
        _MEMORY.clear()
        _OBJECTS.clear()
        for k in _STATS:
            _STATS[k] = 0


class CompiledKernel:
    """A kernel compiled for the host, callable on numpy arrays::

        fn = build(kernel)
        fn(a, b, out, nthreads=2)     # arrays in Kernel.params order (temps allocated when omitted)
    """

    def __init__(self, kernel: Kernel, module: CompiledModule):
        self.name = kernel.name
        self.params: list[Buffer] = kernel.params
        self.n_inputs = len(kernel.inputs) + len(kernel.outputs)
        self.module = module
        self.address = module.address(kernel.name)
        self._fn = KERNEL_PROTO(self.address)

    def check(self, k: int, array: np.ndarray) -> None:
        p = self.params[k]
        if array.shape != p.shape or array.dtype != np_dtype(p.dtype):
            raise ValueError(f"kernel '{self.name}': buffer '{p.name}' must be {p.dtype}{list(p.shape)}, got "
                             f"{array.dtype}{list(array.shape)}")
        if not array.flags.c_contiguous:
            raise ValueError(f"kernel '{self.name}': buffer '{p.name}' must be C-contiguous")

    def __call__(self, *arrays: np.ndarray, nthreads: int = 1) -> None:
        arrays_l = list(arrays)
        if len(arrays_l) == self.n_inputs:
            arrays_l += [np.empty(p.shape, np_dtype(p.dtype)) for p in self.params[self.n_inputs:]]
        if len(arrays_l) != len(self.params):
            raise ValueError(f"kernel '{self.name}' takes {len(self.params)} buffers "
                             f"({', '.join(p.name for p in self.params)}), got {len(arrays)}")
        for k, a in enumerate(arrays_l):
            self.check(k, a)
        ptrs = (ctypes.c_void_p * len(arrays_l))(*[a.ctypes.data for a in arrays_l])
        self._fn(ctypes.cast(ptrs, ctypes.c_void_p), int(nthreads))

    def raw(self, pointers: ctypes.Array, nthreads: int) -> None:
        """Call with a prepared ``(c_void_p * n)`` array of buffer addresses (no checks: the fast path)."""
        self._fn(ctypes.cast(pointers, ctypes.c_void_p), nthreads)


def build(kernels: Kernel | Sequence[Kernel], target: Target | None = None,
          cache_dir: str | Path | None = None) -> Any:
    """Render, compile (cached) and load `kernels` for the host: one :class:`CompiledKernel`, or a list."""
    single = isinstance(kernels, Kernel)
    ks = [kernels] if single else list(kernels)  # type: ignore[list-item]
    target = target or host_target()
    text = render_module(ks, target, ks[0].name if single else "weft")
    module = compile_ir(text, target, cache_dir=cache_dir)
    out = [CompiledKernel(k, module) for k in ks]
    return out[0] if single else out
