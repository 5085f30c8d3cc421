"""Code generation targets: the host CPU, the boards' ARM cores, and NVIDIA GPUs through NVPTX.

A :class:`Target` is frozen data: the LLVM triple, CPU and features, plus the two numbers the schedule
templates derive their tiles from (SIMD width in bytes and the number of vector registers). The host
target is read from LLVM's view of this machine (native CPU name and features), never assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from weft.errors import UsageError

__all__ = ["AARCH64", "ARMV7", "NVPTX", "TARGETS", "Target", "host_target", "resolve_target"]


@dataclass(frozen=True)
class Target:
    name: str
    triple: str
    cpu: str
    features: str
    #: SIMD register width in bytes (64 for AVX-512, 32 for AVX2, 16 for NEON/SSE)
    vector_bytes: int
    #: architectural vector registers (32 zmm on AVX-512, 16 on AVX2 and ARMv7 NEON q-regs, 32 on AArch64)
    vector_registers: int
    kind: str = "cpu"
    #: ELF e_machine of object files for this target (40: ARM, 62: x86-64, 183: AArch64)
    elf_machine: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("cpu", "gpu"):
            raise ValueError(f"target '{self.name}': kind must be 'cpu' or 'gpu', got '{self.kind}'")
        if self.vector_bytes not in (4, 8, 16, 32, 64):
            raise ValueError(f"target '{self.name}': vector_bytes must be a power of two up to 64")

    def lanes(self, itemsize: int = 4) -> int:
        """Elements of `itemsize` bytes per SIMD register."""
        return max(1, self.vector_bytes // itemsize)

    @property
    def key(self) -> str:
        """What compiled code depends on: part of every compile-cache key."""
        return f"{self.triple}|{self.cpu}|{self.features}"


ARMV7 = Target("armv7", "armv7a-unknown-linux-gnueabihf", "cortex-a9", "+neon,+vfp3,+thumb2,+dsp", 16, 16,
               elf_machine=40)
AARCH64 = Target("aarch64", "aarch64-unknown-linux-gnu", "cortex-a53", "+neon,+fp-armv8", 16, 32,
                 elf_machine=183)
#: sm_80 / PTX 7.8: what CUDA 11.8+ and every ptxas since accepts; runs on Ampere, Hopper and later.
NVPTX = Target("nvptx", "nvptx64-nvidia-cuda", "sm_80", "+ptx78", 16, 0, kind="gpu")


@cache
def host_target() -> Target:
    """This machine's CPU as LLVM sees it (``-march=native``)."""
    import llvmlite.binding as llvm

    from weft.compiler.llvm.jit import init_llvm  # optional dependency: llvmlite

    init_llvm()
    features = llvm.get_host_cpu_features()
    flat = features.flatten()
    if features.get("avx512f"):
        width, regs = 64, 32
    elif features.get("avx2") or features.get("avx"):
        width, regs = 32, 16
    elif features.get("neon") or features.get("sse2"):
        width, regs = 16, 32 if features.get("neon") else 16
    else:
        width, regs = 8, 8
    machine = {"x86_64": 62, "aarch64": 183, "arm": 40}.get(llvm.get_process_triple().split("-")[0])
    return Target("host", llvm.get_process_triple(), llvm.get_host_cpu_name(), flat, width, regs, elf_machine=machine)


TARGETS = {"armv7": ARMV7, "aarch64": AARCH64, "nvptx": NVPTX}


def resolve_target(target: str | Target) -> Target:
    """A target by name ("host", "armv7", "aarch64", "nvptx") or as given."""
    if isinstance(target, Target):
        return target
    if target == "host":
        return host_target()
    try:
        return TARGETS[target]
    except KeyError:
        raise UsageError(f"unknown target '{target}' (known: host, {', '.join(TARGETS)})") from None
