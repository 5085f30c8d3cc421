"""The "fsim" device: accelerator layers run their instruction streams on the functional simulator, host
layers run in numpy, all on one DRAM image.

It is the graph walker (:mod:`weft.core.walker`) with a :class:`~weft.runtime.dram_runner.DramRunner`
whose programs run on :class:`~weft.sim.fsim.FunctionalSimulator`: before an accelerator layer, inputs made
on the host are packed into their DRAM buffers; the layer's program runs to its FINISH; a value the host
needs next is read back from DRAM. Every run checks races between units (``check_races``), so a missing
token is an error here, not a silent difference.

Cycles come from the timing model (:mod:`weft.sim.timing`, its default DRAM timing) when this build has
one, else they are None: each layer's program is timed once (timing does not depend on the data).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.isa.encoding import decode_insns
from weft.runtime.devices import Device, DeviceError, register_device, run_loaded
from weft.runtime.dram_runner import AcceleratorImage, DramRunner, OnLayer
from weft.sim.fsim import FunctionalSimulator

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig
    from weft.core.artifact import Artifact

__all__ = ["FsimDevice", "ProgramTimer", "new_timing_model", "timing_model"]


def timing_model() -> Any | None:
    """The timing model module when this build has one."""
    if importlib.util.find_spec("weft.sim.timing") is None:
        return None
    return importlib.import_module("weft.sim.timing")


def new_timing_model(config: AcceleratorConfig) -> Any | None:
    """This build's timing model for `config` (its default DRAM timing), None without one."""
    module = timing_model()
    cls = getattr(module, "TimingModel", None) if module is not None else None
    return cls(config) if cls is not None else None


class ProgramTimer:
    """Cycles the timing model predicts for each layer's program of `image`, each program timed once
    (timing does not depend on the data)."""

    def __init__(self, model: Any, image: AcceleratorImage, *, chains: bool = True):
        self.model, self.image, self.chains = model, image, chains
        self._cycles: dict[str, int] = {}

    @classmethod
    def of(cls, image: AcceleratorImage, *, chains: bool = True) -> ProgramTimer | None:
        """A timer on this build's timing model (None without one); `chains`: time the layers of a chain as
        the runner runs them (its program), else each layer's own program."""
        model = new_timing_model(image.config)
        return cls(model, image, chains=chains) if model is not None else None

    def cycles(self, layer: Mapping[str, Any]) -> int:
        """The layer's program and the relayout programs that follow it (:mod:`weft.runtime.dram_runner`); a
        layer of a chain (:mod:`weft.compiler.backend.chain`) run as one: its part of the chain's program."""
        name = layer["name"]
        chain = self.image.chain_of(layer) if self.chains else None
        if chain is not None and name not in self._cycles:
            words = self.image.section.words_at(chain["insn_addr"], chain["insn_count"], layer["insn_bytes"])
            report = self.model.simulate(decode_insns(self.image.config, words), chain["insn_addr"])
            split = timing_model().part_cycles  # type: ignore[union-attr]  # (a timer has the module)
            self._cycles.update(zip(chain["layers"], split(report.trace, chain["ends"]), strict=True))
        if name not in self._cycles:
            insns = decode_insns(self.image.config, self.image.program_words(name))
            total = int(self.model.simulate(insns, layer["insn_addr"]).cycles)
            for program in layer.get("relayout", ()):
                start = program["insn_addr"] - self.image.section.const_base
                words = self.image.const[start:start + program["insn_count"] * program["insn_bytes"]]
                total += int(self.model.simulate(decode_insns(self.image.config, words), program["insn_addr"]).cycles)
            self._cycles[name] = total
        return self._cycles[name]


class FsimDevice(Device):
    """Runs accelerator layers on :class:`~weft.sim.fsim.FunctionalSimulator`; options go to the simulator
    (``check_races``, ``model_fetch``) except ``timing`` (False: no cycle counts even with a timing model),
    ``on_layer`` and ``chains``."""

    name = "fsim"

    def __init__(self, config: AcceleratorConfig, *, timing: bool = True, on_layer: OnLayer | None = None,
                 chains: bool = True, **sim_options: Any):
        super().__init__(config)
        known = [p for p in inspect.signature(FunctionalSimulator).parameters if p != "config"]
        unknown = sorted(set(sim_options) - set(known))
        if unknown:
            options = ", ".join(dict.fromkeys(["timing", "on_layer", "chains", *known]))
            raise DeviceError(f"device 'fsim' has no option '{unknown[0]}' (options: {options})")
        self.sim_options = sim_options
        self.timing = timing
        #: Run each chain of layers as its one program (:mod:`weft.compiler.backend.chain`), else each
        #: layer's own (option ``chains=False``: layer by layer, as the driver devices run them).
        self.chains = chains
        #: Called as ``on_layer(layer, dram, "before" | "after")`` around each accelerator program (to
        #: replay a layer elsewhere, e.g. on the RTL, from the same DRAM image).
        self.on_layer = on_layer
        self.runner: DramRunner | None = None
        self.timer: ProgramTimer | None = None

    def load(self, artifact: Artifact) -> None:
        super().load(artifact)
        self.image = AcceleratorImage(artifact, self.config, self.name)
        self.layers = self.image.layers
        self.timer = ProgramTimer.of(self.image, chains=self.chains) if self.timing else None
        sim = FunctionalSimulator(self.config, **self.sim_options)
        self.runner = DramRunner(self.image, sim, self, cycles=self.layer_cycles, chains=self.chains)

    def layer_cycles(self, layer: dict[str, Any]) -> int | None:
        """Cycles the timing model predicts for a layer's program (None without one)."""
        return self.timer.cycles(layer) if self.timer is not None else None

    def run(self, feeds: Mapping[str, np.ndarray], *, keep_intermediates: bool = False
            ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray]]:
        return run_loaded(self.artifact, feeds, runner=self.runner, keep_intermediates=keep_intermediates)


register_device("fsim", FsimDevice)
