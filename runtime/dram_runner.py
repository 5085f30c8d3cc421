"""Accelerator layers on one DRAM image: the accelerator runner of the fsim and driver devices.

The artifact's ``accel`` section (written by :mod:`weft.compiler.backend`) gives the constant part of the
image (weights, epilogue vectors, micro-ops, programs) and where each activation and program lives
(:class:`AcceleratorImage`). :class:`DramRunner` keeps that image for one run, packs values into their
buffers and unpacks them, and runs each layer's program with a :class:`ProgramRunner`: the functional
simulator itself (fsim), or the driver on hardware (rtl, pynq), which copies the image to its DMA buffer.

Imports numpy and light weft modules only: the board runtime uses it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from weft.core.accel_section import accel_section
from weft.core.artifact_schema import ACCEL_SECTION
from weft.core.ir import Node, numpy_dtype
from weft.core.layout import from_rows, to_rows
from weft.isa.arith import pack, unpack
from weft.runtime.devices import DeviceError
from weft.sim.dram import Dram

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig
    from weft.core.artifact import Artifact

__all__ = ["AcceleratorImage", "DramRunner", "LayerHooks", "OnLayer", "ProgramRunner", "one_blas_thread"]

#: ``on_layer(layer, dram, "before" | "after")`` around each accelerator program (to replay a layer
#: elsewhere, e.g. on the RTL, from the same DRAM image, or to follow progress).
OnLayer = Callable[[dict[str, Any], Dram, str], None]


def one_blas_thread() -> contextlib.AbstractContextManager:
    """The simulator's matmuls are small (one instruction each): BLAS threads cost more than they save,
    and on a busy machine their spin-waits cost a hundredfold. Limited when threadpoolctl is installed."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


class AcceleratorImage:
    """The ``accel`` section of `artifact` as device `device` (named in errors) reads it: ``section`` (typed),
    ``meta`` (its JSON), the constant bytes ``const``, and ``layers`` (each accelerator layer's record, by
    node name: the form the ``on_layer`` hooks receive)."""

    def __init__(self, artifact: Artifact, config: AcceleratorConfig, device: str):
        if artifact.target != "accel":
            raise DeviceError(f"device '{device}' runs artifacts compiled for the accelerator, not target "
                              f"'{artifact.target}' (use device 'ref')")
        section = accel_section(artifact)
        if section is None:
            raise DeviceError(f"the artifact has no instruction streams (section '{ACCEL_SECTION}'): recompile it "
                              "with a weft that has the accelerator back end")
        self.config, self.section = config, section
        self.meta = artifact.sections[ACCEL_SECTION].meta
        self.const = section.const
        self._programs = {layer.name: layer for layer in section.layers}
        self.layers: dict[str, dict[str, Any]] = {layer.name: dict(layer.record) for layer in section.layers}

    def fresh_dram(self) -> Dram:
        """A DRAM holding the constants only."""
        dram = Dram(self.section.dram_bytes)
        dram.write(self.section.const_base, self.const)
        return dram

    def program_words(self, name: str) -> np.ndarray:
        """The encoded instruction stream of layer `name` (from the constants)."""
        return self.section.program_words(self._programs[name])

    def chain_of(self, layer: Mapping[str, Any]) -> dict[str, Any] | None:
        """The chain `layer` belongs to (:mod:`weft.compiler.backend.chain`: its first layer's ``chain``), or
        None."""
        head = self.layers.get(str(layer.get("chain_head", layer["name"])))
        return head.get("chain") if head is not None else None

    def layer(self, name: str) -> dict[str, Any]:
        layer = self.layers.get(name)
        if layer is None:
            raise DeviceError(f"layer '{name}' has no program in the artifact")
        return layer

    def write_value(self, dram: Dram, name: str, array: np.ndarray) -> None:
        """Pack value `name` (in the packed layout) into each of its DRAM buffers, in the row order each
        holds (:func:`weft.core.layout.to_rows`)."""
        info, placed = self.section.values[name], self.meta["values"][name]
        array = np.asarray(array)
        for buf in (placed, *placed.get("copies", ())):
            ordered = to_rows(array, int(buf["rows"])) if "rows" in buf else array
            data = pack(ordered.reshape(-1, array.shape[-1]).astype(np.int64), self.config.out_width)
            if data.size != info.bytes:
                raise DeviceError(f"value '{name}' has {data.size} bytes, its DRAM buffer {info.bytes}")
            dram.write(int(buf["addr"]), data)

    def read_value(self, dram: Any, name: str) -> np.ndarray:
        """Value `name` unpacked from `dram` (anything with Dram's ``read(addr, nbytes)``), in the packed layout."""
        info, placed = self.section.values[name], self.meta["values"][name]
        raw = dram.read(info.addr, info.bytes)
        values = unpack(raw[None, :], self.config.out_width).reshape(info.shape)
        if "rows" in placed:
            values = from_rows(values, int(placed["rows"]))
        return values.astype(numpy_dtype(info.dtype))


def _summed(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}


def _nothing(ran: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of a layer of a chain whose program runner counted the chain as a whole."""
    return {"insns": {}, "insn_count": 0, "bytes": {}, "macs": 0, "alu_ops": 0,
            "cycles": None if ran.get("cycles") is None else 0}


def _dense(g: Mapping[str, Any]) -> bool:
    """Whether a layer's geometry is a dense layer's: a convolution whose kernel covers its whole input (one
    output pixel, each a dot product of the whole image), bound by its weights' DRAM traffic."""
    return g.get("kind") == "conv" and g.get("ho") == g.get("wo") == 1 and (g.get("kh"), g.get("kw")) == \
        (g.get("h"), g.get("w")) and not any(g.get("pads") or ())


class ProgramRunner(Protocol):
    """Runs the program at `insn_addr` of `dram` to its FINISH, updating `dram`; returns its statistics:
    ``insns`` (by kind), ``insn_count``, ``bytes`` (by kind), ``macs``, ``alu_ops``, and ``cycles`` (None
    when unknown). A runner that splits a chain's figures by layer takes ``parts`` (see
    :meth:`weft.sim.fsim.FunctionalSimulator.run`) and returns them as ``parts``."""

    def run(self, dram: Dram, insn_addr: int, insn_count: int) -> dict[str, Any]: ...


class LayerHooks(Protocol):
    """Whose ``on_layer`` hook the runner calls (the device's, which callers may set after loading)."""

    on_layer: OnLayer | None


class DramRunner:
    """The :class:`~weft.core.walker.AcceleratorRunner` of a device whose accelerator works on one DRAM
    image: `programs` runs each layer's program, `hooks.on_layer` is called around it, and `cycles(layer)`
    gives a layer's cycles when the program runner does not count them (the timing model on fsim).

    With `chains`, a chain's first layer runs the chain's program and the later layers take their figures
    from it; the hooks still come around each layer, so a later layer's "before" image already holds its
    output (each value has a buffer of its own: replaying the layer's own program from it is still exact)."""

    def __init__(self, image: AcceleratorImage, programs: ProgramRunner, hooks: LayerHooks, *,
                 cycles: Callable[[dict[str, Any]], int | None] | None = None, chains: bool = False):
        self.image, self.programs, self.hooks, self.cycles = image, programs, hooks, cycles
        #: Run each chain's program in its layers' place (:mod:`weft.compiler.backend.chain`; the program
        #: runner splits its figures by ``parts``), else every layer's own program.
        self.chains = chains
        self._chained: dict[str, dict[str, Any]] = {}  # the figures of the chain's layers the walker is yet to reach
        self.dram: Dram | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self.dram = self.image.fresh_dram()
        self._chained = {}
        with one_blas_thread():
            yield

    def layer_info(self, node: Node) -> dict[str, Any]:
        return self.image.layer(node.name)

    def write_value(self, name: str, array: np.ndarray) -> None:
        assert self.dram is not None
        self.image.write_value(self.dram, name, array)

    def read_value(self, name: str) -> np.ndarray:
        assert self.dram is not None
        return self.image.read_value(self.dram, name)

    def run_layer(self, node: Node, layer: dict[str, Any]) -> dict[str, Any]:
        dram, hook = self.dram, self.hooks.on_layer
        assert dram is not None
        if hook is not None:
            hook(layer, dram, "before")
        chain = layer.get("chain") if self.chains else None
        if self.chains and "chain_head" in layer:
            stats = self._chained.pop(layer["name"], None)
            if stats is None:
                raise DeviceError(f"layer '{layer['name']}' runs in the program of its chain from "
                                  f"'{layer['chain_head']}', which has not run before it")
        elif chain is not None:
            if getattr(self.programs, "splits_parts", False):
                ran = self.programs.run(dram, chain["insn_addr"], chain["insn_count"],
                                        parts=chain["ends"])  # type: ignore[call-arg]
                parts = dict(zip(chain["layers"], ran["parts"], strict=True))
            else:  # the hardware counts the program as a whole: its figures go to the chain's first layer
                ran = self.programs.run(dram, chain["insn_addr"], chain["insn_count"])
                parts = {name: _nothing(ran) for name in chain["layers"]}
                parts[layer["name"]] = ran
            stats = parts.pop(layer["name"])
            self._chained.update(parts)
        else:
            stats = self.programs.run(dram, layer["insn_addr"], layer["insn_count"])
        measured = [stats.get("cycles")]
        for program in layer.get("relayout", ()):  # the output's copies in other row orders
            more = self.programs.run(dram, program["insn_addr"], program["insn_count"])
            measured.append(more.get("cycles"))
            stats = {**stats, "insns": _summed(stats["insns"], more["insns"]),
                     "insn_count": stats["insn_count"] + more["insn_count"],
                     "bytes": _summed(stats["bytes"], more["bytes"]), "macs": stats["macs"] + more["macs"],
                     "alu_ops": stats["alu_ops"] + more["alu_ops"]}
        if hook is not None:
            hook(layer, dram, "after")
        cycles = None if None in measured else sum(measured)
        if cycles is None and self.cycles is not None:
            cycles = self.cycles(layer)
        record = {"insns": stats["insns"], "insn_count": stats["insn_count"], "bytes": stats["bytes"],
                  "accel_macs": stats["macs"], "alu_ops": stats["alu_ops"], "cycles": cycles,
                  "schedule": layer["schedule"], "dense": _dense(layer.get("geometry") or {})}
        if self.chains and self.image.chain_of(layer) is not None:
            record["chain"] = str(layer.get("chain_head", layer["name"]))  # the chain's first layer
        return record

    def host_fields(self) -> dict[str, Any]:
        # The host's work: no accelerator instructions, DRAM traffic or cycles.
        return {"insns": {}, "insn_count": 0, "bytes": {}, "accel_macs": 0, "alu_ops": 0, "cycles": None}
