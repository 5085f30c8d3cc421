"""PTX from the loop IR, its validation with ``ptxas``, and execution through the CUDA driver API.

``ptx(kernels)`` renders and compiles (cached by the IR's hash, like every other target) to PTX text;
``ptxas(text)`` assembles it for a GPU architecture with NVIDIA's assembler when the CUDA toolkit is
installed and returns its resource report. Execution goes through ``libcuda`` with ctypes (no CUDA
Python package): :func:`cuda_available` says whether a driver and a device answer, and why not;
:class:`GpuKernel` runs one kernel on numpy arrays; :func:`plan_cuda` runs whole float graphs (the "cuda"
device), scheduling every kernel with :func:`~weft.compiler.llvm.gpu.schedule_gpu`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from weft.compiler.llvm.codegen_nvptx import Launch, render_nvptx
from weft.compiler.llvm.expr import np_dtype
from weft.compiler.llvm.gpu import schedule_gpu
from weft.compiler.llvm.graph import allocate_host, plan_steps, refuse_numpy_steps
from weft.compiler.llvm.hostplan import plain_copy
from weft.compiler.llvm.jit import cache_key, optimize, target_machine
from weft.compiler.llvm.target import NVPTX, Target
from weft.compiler.llvm.te import Kernel
from weft.errors import WeftError

__all__ = [
    "CudaError", "GpuKernel", "PtxasError", "cuda_available", "find_ptxas", "plan_cuda", "ptx", "ptxas",
]

_PTX_CACHE: dict[str, str] = {}
_lock = threading.Lock()


class CudaError(WeftError):
    """No usable CUDA driver or device, or a driver call that failed (named, with CUDA's error name)."""


class PtxasError(WeftError):
    """``ptxas`` rejected generated PTX (its message is included)."""


def ptx(kernels: Sequence[Kernel], target: Target = NVPTX) -> tuple[str, list[list[Launch]]]:
    """PTX text of `kernels` and their launches (each stage one ``.entry``)."""
    text, launches = render_nvptx(list(kernels), target)
    key = cache_key(text, target, kind="ptx")
    with _lock:
        hit = _PTX_CACHE.get(key)
    if hit is None:
        module = optimize(text, target)
        hit = target_machine(target).emit_assembly(module)
        with _lock:
            _PTX_CACHE[key] = hit
    return hit, launches


def find_ptxas() -> str | None:
    """The ``ptxas`` on PATH (or in /usr/local/cuda/bin), if any."""
    found = shutil.which("ptxas")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/ptxas")
    return str(default) if default.is_file() else None


def ptxas(text: str, arch: str = "sm_80") -> dict[str, dict[str, int]]:
    """Assemble PTX `text` for `arch`; per entry point, the registers and shared bytes ptxas reports."""
    exe = find_ptxas()
    if exe is None:
        raise PtxasError("ptxas is not installed (it comes with the CUDA toolkit)")
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(text)
        proc = subprocess.run([exe, f"-arch={arch}", "-v", str(src), "-o", str(out)], capture_output=True, text=True,
                              check=False)
        if proc.returncode != 0 or not out.is_file():
            raise PtxasError(f"ptxas rejected the PTX: {proc.stderr.strip() or proc.stdout.strip()}")
    report: dict[str, dict[str, int]] = {}
    current = None
    for line in proc.stderr.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = report.setdefault(m.group(1), {"registers": 0, "shared_bytes": 0})
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current is not None:
            current["registers"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            current["shared_bytes"] = int(s.group(1)) if s else 0
    return report


# ---- the driver API -----------------------------------------------------------------------------------------


class _Driver:
    """The few libcuda entry points weft needs, checked call by call."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("cuda") or "libcuda.so.1"
        try:
            self.lib = ctypes.CDLL(name)
        except OSError as err:
            raise CudaError(f"no CUDA driver library ({name}: {err})") from None
        self.check("cuInit", 0)

    def check(self, fn: str, *args: Any) -> None:
        rc = getattr(self.lib, fn)(*args)
        if rc != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(text))
            raise CudaError(f"{fn} failed: {text.value.decode() if text.value else rc}")


_DRIVER: _Driver | None = None
_CONTEXTS: dict[int, ctypes.c_void_p] = {}


def _driver() -> _Driver:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = _Driver()
    return _DRIVER


def cuda_available() -> tuple[bool, str]:
    """(True, device name) when a CUDA driver and a GPU answer, else (False, why not)."""
    try:
        drv = _driver()
        count = ctypes.c_int()
        drv.check("cuDeviceGetCount", ctypes.byref(count))
        if count.value < 1:
            return False, "the CUDA driver found no GPU"
        dev = ctypes.c_int()
        drv.check("cuDeviceGet", ctypes.byref(dev), 0)
        name = ctypes.create_string_buffer(256)
        drv.check("cuDeviceGetName", name, 256, dev)
        return True, name.value.decode()
    except CudaError as err:
        return False, str(err)


def _context(index: int) -> ctypes.c_void_p:
    drv = _driver()
    if index not in _CONTEXTS:
        dev = ctypes.c_int()
        drv.check("cuDeviceGet", ctypes.byref(dev), index)
        ctx = ctypes.c_void_p()
        drv.check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        _CONTEXTS[index] = ctx
    drv.check("cuCtxSetCurrent", _CONTEXTS[index])
    return _CONTEXTS[index]


class DeviceArray:
    """GPU memory of `nbytes`, zeroed (the halos of blocked tensors must start at zero), freed with the
    object."""

    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        self.ptr = ctypes.c_uint64()
        _driver().check("cuMemAlloc_v2", ctypes.byref(self.ptr), ctypes.c_size_t(self.nbytes))
        _driver().check("cuMemsetD8_v2", self.ptr, ctypes.c_ubyte(0), ctypes.c_size_t(self.nbytes))

    def upload(self, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array)
        _driver().check("cuMemcpyHtoD_v2", self.ptr, data.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(data.nbytes))

    def download(self, out: np.ndarray) -> np.ndarray:
        _driver().check("cuMemcpyDtoH_v2", out.ctypes.data_as(ctypes.c_void_p), self.ptr, ctypes.c_size_t(out.nbytes))
        return out

    def __del__(self) -> None:
        if _DRIVER is not None and self.ptr.value:
            _DRIVER.lib.cuMemFree_v2(self.ptr)


class _Module:
    def __init__(self, text: str):
        self.handle = ctypes.c_void_p()
        data = ctypes.create_string_buffer(text.encode())
        _driver().check("cuModuleLoadData", ctypes.byref(self.handle), data)
        self.functions: dict[str, ctypes.c_void_p] = {}

    def function(self, name: str) -> ctypes.c_void_p:
        if name not in self.functions:
            f = ctypes.c_void_p()
            _driver().check("cuModuleGetFunction", ctypes.byref(f), self.handle, name.encode())
            self.functions[name] = f
        return self.functions[name]


def _launch(module: _Module, launch: Launch, pointers: Sequence[ctypes.c_uint64]) -> None:
    params = (ctypes.c_void_p * len(pointers))(*[ctypes.addressof(p) for p in pointers])
    _driver().check("cuLaunchKernel", module.function(launch.name), *launch.grid, *launch.block, 0, None, params, None)


class GpuKernel:
    """A kernel compiled to PTX and loaded on GPU `device_index`, callable on numpy arrays like
    :class:`~weft.compiler.llvm.jit.CompiledKernel` (outputs are copied back into the arrays given)."""

    def __init__(self, kernel: Kernel, device_index: int = 0):
        _context(device_index)
        self.kernel = kernel
        text, launches = ptx([kernel])
        self.launches = launches[0]
        self.module = _Module(text)

    def __call__(self, *arrays: np.ndarray) -> None:
        params = self.kernel.params
        n_io = len(self.kernel.inputs) + len(self.kernel.outputs)
        if len(arrays) != n_io:
            raise ValueError(f"kernel '{self.kernel.name}' takes {n_io} arrays, got {len(arrays)}")
        memory = []
        for k, p in enumerate(params):
            mem = DeviceArray(p.size * np_dtype(p.dtype).itemsize)
            if k < len(self.kernel.inputs):
                mem.upload(np.asarray(arrays[k], np_dtype(p.dtype)))
            memory.append(mem)
        for launch in self.launches:
            _launch(self.module, launch, [m.ptr for m in memory])
        _driver().check("cuCtxSynchronize")
        for k in range(len(self.kernel.inputs), n_io):
            out = arrays[k]
            if not out.flags.c_contiguous or out.dtype != np_dtype(params[k].dtype):
                raise ValueError(f"output '{params[k].name}' must be a C-contiguous {params[k].dtype} array")
            memory[k].download(out)


# ---- whole graphs -------------------------------------------------------------------------------------------


@dataclass(eq=False)
class CudaPlan:
    """A float graph on the GPU: every tensor in device memory, kernels launched in order."""

    plan: Any  # the host plan whose steps and tensors this mirrors
    modules: list[_Module]
    launches: list[tuple[str, _Module, list[Launch], list[ctypes.c_uint64]]]
    memory: dict[int, DeviceArray] = field(default_factory=dict)
    device_index: int = 0

    def run(self, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
        _context(self.device_index)  # the context is per calling thread
        for name, t in self.plan.inputs.items():
            self.memory[id(t.root())].upload(np.asarray(feeds[name], np_dtype(t.dtype)))
        seconds: dict[str, float] = {}
        for node, module, launches, pointers in self.launches:
            start = time.perf_counter()
            for launch in launches:
                _launch(module, launch, pointers)
            _driver().check("cuCtxSynchronize")
            seconds[node] = seconds.get(node, 0.0) + time.perf_counter() - start
        outputs = {}
        for name, t in self.plan.outputs.items():
            root = t.root()
            self.memory[id(root)].download(root.array)
            outputs[name] = plain_copy(t)
        layers = [{"name": n, "op": op, "target": "gpu", "macs": macs, "shape": shape, "seconds": seconds.get(n, 0.0)}
                  for n, op, macs, shape in self.plan.layers]
        return outputs, layers


def plan_cuda(graph: Any, device_index: int = 0) -> CudaPlan:
    """Plan `graph` like the host does, schedule every stage for the GPU, compile to PTX, load it and
    place every tensor (constants uploaded once) in device memory."""
    ok, why = cuda_available()
    if not ok:
        raise CudaError(why)
    _context(device_index)
    plan = gpu_steps(graph)

    allocate_host(plan)
    memory: dict[int, DeviceArray] = {}
    for t in plan.tensors:
        root = t.root()
        if id(root) not in memory:
            memory[id(root)] = DeviceArray(root.array.nbytes)
            if root.constant:
                memory[id(root)].upload(root.array)
    modules: dict[str, _Module] = {}
    launches = []
    for step in plan.steps:
        text, (stage_launches,) = ptx([step.kernel])
        if text not in modules:
            modules[text] = _Module(text)
        pointers = [memory[id(t.root())].ptr for t in step.args]
        launches.append((step.node, modules[text], stage_launches, pointers))
    return CudaPlan(plan, list(modules.values()), launches, memory, device_index)


def gpu_steps(graph: Any) -> Any:
    """The host planner's steps for `graph` (layouts and kernels) with every stage scheduled for the GPU;
    no device is needed, so PTX for a whole model can be generated and checked anywhere."""
    plan = plan_steps(graph, NVPTX)
    refuse_numpy_steps(plan, "the cuda device")
    for step in plan.steps:
        for stage in step.kernel.stages:
            schedule_gpu(stage)
    return plan
