"""Render lowered kernels to LLVM IR for NVPTX, and LLVM's PTX for them.

Each stage of a kernel becomes one ``ptx_kernel`` function (stages need a grid-wide barrier between them,
which only separate launches give), named ``NAME_sK``, taking the kernel's buffers as global pointers in
:attr:`Kernel.params` order. Loops bound to ``blockIdx.*`` / ``threadIdx.*`` read the special registers;
shared buffers are module globals in the shared address space; local ones are stack arrays that LLVM keeps
in registers when their indices are constants.
"""

from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from weft.compiler.llvm.emit import I32, Emitter, ir_type
from weft.compiler.llvm.expr import Buffer, np_dtype
from weft.compiler.llvm.lower import LoweredStage, lower
from weft.compiler.llvm.target import NVPTX, Target
from weft.compiler.llvm.te import Kernel

__all__ = ["Launch", "render_nvptx"]

GLOBAL, SHARED = 1, 3
_SREG = {f"{kind}.{axis}": f"llvm.nvvm.read.ptx.sreg.{reg}.{axis}"
         for kind, reg in (("threadIdx", "tid"), ("blockIdx", "ctaid")) for axis in "xyz"}


@dataclass(frozen=True)
class Launch:
    """How to launch one stage: function name, grid and block dimensions, shared memory bytes."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


def render_nvptx(kernels: list[Kernel], target: Target = NVPTX, name: str = "weft") -> tuple[str, list[list[Launch]]]:
    """LLVM IR text of a module with every stage of `kernels`, and each kernel's launches in order."""
    module = ir.Module(name=name)
    module.triple = target.triple
    launches = []
    for k in kernels:
        lk = lower(k)
        launches.append([_render_stage(module, f"{lk.name}_s{n}", stage, lk.params)
                         for n, stage in enumerate(lk.stages)])
    return str(module), launches


def _dims(launch: dict[str, int], kind: str) -> tuple[int, int, int]:
    return tuple(launch.get(f"{kind}.{axis}", 1) for axis in "xyz")  # type: ignore[return-value]


def _render_stage(module: ir.Module, name: str, stage: LoweredStage, params: list[Buffer]) -> Launch:
    gptr = ir.PointerType(addrspace=GLOBAL)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [gptr] * len(params)), name)
    fn.calling_convention = "ptx_kernel"
    fn.attributes.add("nounwind")
    for arg, p in zip(fn.args, params, strict=True):
        arg.name = p.name
        arg.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    buffers: dict[Buffer, ir.Value] = dict(zip(params, fn.args, strict=True))
    shared = 0
    for s in stage.scratch:
        array = ir.ArrayType(ir_type(s.dtype), s.size)
        if s.scope == "shared":
            gv = ir.GlobalVariable(module, array, f"{name}.{s.name}", addrspace=SHARED)
            gv.linkage = "internal"
            gv.align = 16
            gv.initializer = ir.Constant(array, ir.Undefined)
            gv.type = ir.PointerType(addrspace=SHARED)  # opaque: element accesses of any type
            buffers[s] = gv
            shared += s.size * np_dtype(s.dtype).itemsize
        else:
            slot = b.alloca(array, name=s.name)
            slot.type = ir.PointerType()
            buffers[s] = slot

    def thread(tag: str) -> ir.Value:
        intrinsic = _SREG[tag]
        try:
            f = module.get_global(intrinsic)
        except KeyError:
            f = ir.Function(module, ir.FunctionType(I32, []), intrinsic)
        return b.call(f, [])

    def barrier() -> None:
        try:
            f = module.get_global("llvm.nvvm.barrier0")
        except KeyError:
            f = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "llvm.nvvm.barrier0")
            f.attributes.add("convergent")
        b.call(f, [])

    Emitter(b, buffers, bind_thread=thread, barrier=barrier, nvptx=True).stmt(stage.body)
    b.ret_void()
    return Launch(name, _dims(stage.launch, "blockIdx"), _dims(stage.launch, "threadIdx"), shared)
