"""The "fsim" device: accelerator layers run their instruction streams on the functional simulator, host
layers run in numpy, all on one DRAM image.

The artifact's ``accel`` section (written by :mod:`weft.compiler.backend`) gives the constant part of the
image (weights, epilogue vectors, micro-ops, programs) and where each activation and program lives. A
run writes the image once, then walks the graph: before an accelerator layer, inputs made on the host are
packed into their DRAM buffers; the layer's program runs to its FINISH; a value the host needs next is
read back from DRAM. Every run checks races between units (``check_races``), so a missing token is an
error here, not a silent difference.

Cycles come from the timing model (:mod:`weft.sim.timing`, its default DRAM timing) when this build has
one, else they are None: each layer's program is timed once (timing does not depend on the data).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.compiler.float_ops import FLOAT_OPS, macs_of
from weft.compiler.ir import numpy_dtype
from weft.isa.encoding import decode_insns
from weft.runtime.devices import Device, DeviceError, register_device
from weft.runtime.qkernels import QKERNELS
from weft.runtime.reference import check_feeds, widths_of
from weft.sim.bits import pack, unpack
from weft.sim.dram import Dram
from weft.sim.fsim import FunctionalSimulator

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig
    from weft.runtime.artifact import Artifact

__all__ = ["FsimDevice", "timing_model"]

SECTION = "accel"


def _one_blas_thread() -> contextlib.AbstractContextManager:
    """The simulator's matmuls are small (one instruction each): BLAS threads cost more than they save,
    and on a busy machine their spin-waits cost a hundredfold. Limited when threadpoolctl is installed."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def timing_model() -> Any | None:
    """The timing model module when this build has one."""
    if importlib.util.find_spec("weft.sim.timing") is None:
        return None
    return importlib.import_module("weft.sim.timing")


class FsimDevice(Device):
    """Runs accelerator layers on :class:`~weft.sim.fsim.FunctionalSimulator`; options go to the simulator
    (``check_races``, ``model_fetch``) except ``timing`` (False: no cycle counts even with a timing model)
    and ``on_layer``."""

    name = "fsim"

    def __init__(self, config: AcceleratorConfig, *, timing: bool = True,
                 on_layer: Callable[[dict[str, Any], Dram, str], None] | None = None, **sim_options: Any):
        super().__init__(config)
        import inspect

        from weft.sim.fsim import FunctionalSimulator

        known = [p for p in inspect.signature(FunctionalSimulator).parameters if p != "config"]
        unknown = sorted(set(sim_options) - set(known))
        if unknown:
            options = ", ".join(dict.fromkeys(["timing", "on_layer", *known]))
            raise DeviceError(f"device 'fsim' has no option '{unknown[0]}' (options: {options})")
        self.sim_options = sim_options
        self.timing = timing
        #: Called as ``on_layer(layer, dram, "before" | "after")`` around each accelerator program (to
        #: replay a layer elsewhere, e.g. on the RTL, from the same DRAM image).
        self.on_layer = on_layer
        self.sim: Any = None

    def load(self, artifact: Artifact) -> None:
        super().load(artifact)
        if artifact.target != "accel":
            raise DeviceError(f"device 'fsim' runs artifacts compiled for the accelerator, not target "
                              f"'{artifact.target}' (use device 'ref')")
        if SECTION not in artifact.sections:
            raise DeviceError("the artifact has no instruction streams (section 'accel'): recompile it with a "
                              "weft that has the accelerator back end")
        section = artifact.sections[SECTION]
        self.meta = section.meta
        if self.meta.get("version") != 1:
            raise DeviceError(f"section 'accel' has version {self.meta.get('version')!r}; this device reads 1")
        self.const = section.array("const")
        self.layers = {layer["name"]: layer for layer in self.meta["layers"]}
        self.sim = self._make_simulator()

    def _make_simulator(self) -> Any:
        model = timing_model() if self.timing else None
        cls = getattr(model, "TimingModel", None) if model is not None else None
        self._timing = cls(self.config) if cls is not None else None
        self._cycles: dict[str, int] = {}
        return FunctionalSimulator(self.config, **self.sim_options)

    def layer_cycles(self, layer: dict[str, Any]) -> int | None:
        """Cycles the timing model predicts for a layer's program (None without one). Timing does not
        depend on the data, so each program is timed once."""
        if self._timing is None:
            return None
        name = layer["name"]
        if name not in self._cycles:
            start = layer["insn_addr"] - self.meta["const_base"]
            words = self.const[start:start + layer["insn_count"] * layer["insn_bytes"]]
            report = self._timing.simulate(decode_insns(self.config, words), layer["insn_addr"])
            self._cycles[name] = int(report.cycles)
        return self._cycles[name]

    # ---- DRAM <-> numpy ---------------------------------------------------------------------------------
    def _write_value(self, dram: Dram, name: str, array: np.ndarray) -> None:
        info = self.meta["values"][name]
        data = pack(np.asarray(array).reshape(-1, array.shape[-1]).astype(np.int64), self.config.out_width)
        if data.size != info["bytes"]:
            raise DeviceError(f"value '{name}' has {data.size} bytes, its DRAM buffer {info['bytes']}")
        dram.write(info["addr"], data)

    def _read_value(self, dram: Dram, name: str) -> np.ndarray:
        info = self.meta["values"][name]
        raw = dram.read(info["addr"], info["bytes"])
        values = unpack(raw[None, :], self.config.out_width)
        return values.reshape(tuple(info["shape"])).astype(numpy_dtype(info["dtype"]))

    # ---- running ------------------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, np.ndarray], *, keep_intermediates: bool = False
            ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray]]:
        if self.artifact is None:
            raise DeviceError("load an artifact before running")
        with _one_blas_thread():
            return self._run(feeds, keep_intermediates)

    def _run(self, feeds: Mapping[str, np.ndarray], keep_intermediates: bool
             ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray]]:
        assert self.artifact is not None
        graph = self.artifact.graph
        env: dict[str, Any] = dict(graph.constants)
        env.update(check_feeds(graph, feeds))
        widths = widths_of(graph)
        dram = Dram(self.meta["dram_bytes"])
        dram.write(self.meta["const_base"], self.const)
        in_dram: set[str] = set()  # values whose DRAM buffer holds their current contents
        layers: list[dict[str, Any]] = []
        cycles_total: int | None = 0
        for node in graph.nodes:
            ins = [graph.values.get(x) if x else None for x in node.inputs]
            outs = [graph.values[o] for o in node.outputs]
            start = time.perf_counter()
            record: dict[str, Any] = {"name": node.name, "op": node.op, "target": node.attrs.get("target", "host"),
                                      "macs": macs_of(node, [v.logical_shape if v else None for v in ins],
                                                      [v.logical_shape for v in outs]),
                                      "shape": list(outs[0].logical_shape or ())}
            if record["target"] == "accel":
                layer = self.layers.get(node.name)
                if layer is None:
                    raise DeviceError(f"layer '{node.name}' has no program in the artifact")
                for x in layer["inputs"]:
                    if x not in in_dram:
                        self._write_value(dram, x, env[x])
                        in_dram.add(x)
                if self.on_layer is not None:
                    self.on_layer(layer, dram, "before")
                stats = self.sim.run(dram, layer["insn_addr"], layer["insn_count"])
                if self.on_layer is not None:
                    self.on_layer(layer, dram, "after")
                out = node.outputs[0]
                in_dram.add(out)
                env.pop(out, None)
                cycles = stats.get("cycles")
                record.update(insns=stats["insns"], insn_count=stats["insn_count"], bytes=stats["bytes"],
                              accel_macs=stats["macs"], alu_ops=stats["alu_ops"],
                              cycles=cycles if cycles is not None else self.layer_cycles(layer),
                              schedule=layer["schedule"])
                if record["cycles"] is None:
                    cycles_total = None
                elif cycles_total is not None:
                    cycles_total += int(record["cycles"])
            else:
                args = [self._get(dram, env, in_dram, x) if x else None for x in node.inputs]
                results = self._host(node, args, ins, outs, widths)
                for name, array in zip(node.outputs, results, strict=False):
                    env[name] = array
                    in_dram.discard(name)
                # The host's work: no accelerator instructions, DRAM traffic or cycles.
                record.update(insns={}, insn_count=0, bytes={}, accel_macs=0, alu_ops=0, cycles=None)
            record["seconds"] = time.perf_counter() - start
            layers.append(record)
        outputs = {name: self._get(dram, env, in_dram, name) for name in graph.outputs}
        values: dict[str, np.ndarray] = {}
        if keep_intermediates:
            for name in graph.values:
                if name in env or name in in_dram:
                    values[name] = self._get(dram, env, in_dram, name)
        return outputs, {"cycles": cycles_total, "layers": layers}, values

    def _get(self, dram: Dram, env: dict[str, Any], in_dram: set[str], name: str) -> np.ndarray:
        if name not in env and name in in_dram:
            env[name] = self._read_value(dram, name)
        return env[name]

    @staticmethod
    def _host(node: Any, args: list[Any], ins: list[Any], outs: list[Any], widths: Any) -> list[np.ndarray]:
        kernel = QKERNELS.get(node.op)
        if kernel is not None:
            return kernel(node, args, ins, outs, widths)
        opdef = FLOAT_OPS.get(node.op)
        if opdef is None:
            raise DeviceError(f"node '{node.name}' ({node.op}): no host kernel for this op")
        return opdef.run(node, args)


register_device("fsim", FsimDevice)
