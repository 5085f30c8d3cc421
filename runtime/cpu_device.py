"""The "cpu" and "cuda" devices: artifacts run through code that weft generates with LLVM.

"cpu" JIT-compiles every node of the artifact's graph for this machine (:mod:`weft.compiler.llvm.graph`)
and runs the kernels on ``threads`` threads. "cuda" lowers the same graph to PTX and runs it through the
CUDA driver API on an NVIDIA GPU. Importing this module (which ``import weft.runtime`` does, to register
both names) loads neither llvmlite nor CUDA: a board runtime without them still imports, and only
creating one of these devices needs them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.core.walker import check_feeds
from weft.runtime.devices import Device, DeviceError, register_device

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig
    from weft.core.artifact import Artifact

__all__ = ["CpuDevice", "CudaDevice", "default_threads"]


def default_threads() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _GeneratedCode(Device):
    """What the "cpu" and "cuda" devices share: a plan of the graph that weft's LLVM back end makes when an
    artifact loads, with llvmlite imported only then."""

    plan: Any = None

    def load(self, artifact: Artifact) -> None:
        super().load(artifact)
        try:
            self.plan = self._plan(artifact)
        except ImportError as err:  # the back end imports llvmlite, optional on a board
            raise DeviceError(f"device '{self.name}' needs llvmlite ({err}); install weft[compiler]") from None

    def _plan(self, artifact: Artifact) -> Any:
        """The back end's plan of the artifact's graph (imported here: llvmlite is optional on a board)."""
        raise NotImplementedError

    def _checked_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.plan is None or self.artifact is None:
            raise DeviceError("load an artifact before running")
        return check_feeds(self.artifact.graph, feeds)


class CpuDevice(_GeneratedCode):
    """Generated host code: float graphs (``target="cpu"``) and the integer layers of quantized ones.

    `threads`: threads per kernel (default: every core this process may use); `cache_dir`: a folder for
    compiled object files shared between processes (none by default: compiling is cached in memory only);
    `tuning_log`: a ``weft tune --target cpu`` log whose fastest schedules, timed on this machine with
    as many threads, the convolutions of float graphs take (the others keep the heuristic's tiles).
    """

    name = "cpu"

    def __init__(self, config: AcceleratorConfig, *, threads: int | None = None, cache_dir: str | Path | None = None,
                 tuning_log: str | Path | None = None):
        super().__init__(config)
        if threads is not None and int(threads) < 1:
            raise DeviceError(f"device 'cpu': threads must be at least 1, got {threads}")
        if isinstance(tuning_log, (str, Path)) and not Path(tuning_log).is_file():  # (or a TuningLog)
            raise DeviceError(f"device 'cpu': tuning log '{tuning_log}' does not exist")
        self.threads = int(threads) if threads is not None else default_threads()
        self.cache_dir = cache_dir
        self.tuning_log = tuning_log
        self._static: tuple[Any, dict[str, Any]] | None = None

    def _plan(self, artifact: Artifact) -> Any:
        # The runtime's one way into the compiler, made lazily: host code needs llvmlite, optional on a board.
        from weft.compiler.llvm.graph import plan_graph

        try:
            return plan_graph(artifact.graph, cache_dir=self.cache_dir, tuning_log=self.tuning_log,
                              threads=self.threads)
        except ValueError as err:  # an unreadable tuning log
            if self.tuning_log is None:
                raise
            raise DeviceError(f"device 'cpu': {err}") from None

    def run(self, feeds: Mapping[str, np.ndarray], *, keep_intermediates: bool = False
            ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray]]:
        outputs, layers = self.plan.run(self._checked_feeds(feeds), self.threads, timings=True)
        values = self.plan.values() if keep_intermediates else {}
        if self._static is None or self._static[0] is not self.plan:  # what no run changes, counted once
            self._static = (self.plan, {
                "threads": self.threads, "kernels": self.plan.kernels, "compile_seconds": self.plan.compile_seconds,
                "numpy_steps": len(self.plan.numpy_steps()),
                "tuned_convs": sum(tuned for _, _, tuned in self.plan.convs.values())})
        return outputs, {"cycles": None, "layers": layers, **self._static[1]}, values


class CudaDevice(_GeneratedCode):
    """Float graphs lowered to PTX and run on an NVIDIA GPU through the CUDA driver API."""

    name = "cuda"

    def __init__(self, config: AcceleratorConfig, *, device_index: int = 0):
        super().__init__(config)
        self.device_index = device_index

    def _plan(self, artifact: Artifact) -> Any:
        # The runtime's one way into the compiler, made lazily: host code needs llvmlite, optional on a board.
        from weft.compiler.llvm.cuda import CudaError, plan_cuda

        try:
            return plan_cuda(artifact.graph, device_index=self.device_index)
        except CudaError as err:
            raise DeviceError(f"device 'cuda': {err}") from None

    def run(self, feeds: Mapping[str, np.ndarray], *, keep_intermediates: bool = False
            ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray]]:
        outputs, layers = self.plan.run(self._checked_feeds(feeds))
        return outputs, {"cycles": None, "layers": layers}, {}


register_device("cpu", CpuDevice)
register_device("cuda", CudaDevice)
