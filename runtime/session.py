"""InferenceSession: run a .weft artifact the way onnxruntime users run an .onnx model.

    sess = weft.InferenceSession("resnet18.weft", device="ref")
    outputs = sess.run(None, {"input": x})
    sess.get_inputs(), sess.get_outputs(), sess.stats
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from weft.config import AcceleratorConfig, load_config
from weft.core.artifact import Artifact
from weft.core.ir import onnx_type_string
from weft.core.walker import allowing_nonfinite
from weft.runtime.devices import Device, DeviceError, create_device

__all__ = ["InferenceSession", "NodeArg"]


@dataclass(frozen=True)
class NodeArg:
    """An input or output of the model: name, shape, and onnxruntime-style type ("tensor(float)")."""

    name: str
    shape: list[int]
    type: str


class InferenceSession:
    """A compiled model loaded on a device.

    `artifact` is a path to a .weft file or an :class:`Artifact`; `device` a registered device name or a
    :class:`Device`. The device is made for `config` when given (a preset name, a file, a config), else
    for the artifact's own config; a device whose config differs from the artifact's refuses it.
    Inputs holding NaN or Inf are refused unless `allow_nonfinite`.
    """

    def __init__(self, artifact: str | Path | Artifact, device: str | Device = "ref", *,
                 config: str | Path | AcceleratorConfig | None = None, allow_nonfinite: bool = False,
                 **device_options: Any):
        self.allow_nonfinite = allow_nonfinite
        self.artifact = artifact if isinstance(artifact, Artifact) else Artifact.load(artifact)
        if isinstance(device, Device):
            self.device = device
        else:
            cfg = self.artifact.config if config is None else load_config(config)
            self.device = create_device(device, cfg, **device_options)
        self.device.load(self.artifact)
        self._stats: dict[str, Any] | None = None
        self._figures: dict[str, Any] | None = None  # the last run's, summarized when stats is read
        self._intermediates: dict[str, np.ndarray] = {}

    def _args(self, names: Sequence[str]) -> list[NodeArg]:
        g = self.artifact.graph
        return [NodeArg(n, list(g.values[n].logical_shape or ()), onnx_type_string(g.values[n].dtype)) for n in names]

    def get_inputs(self) -> list[NodeArg]:
        return self._args(self.artifact.graph.inputs)

    def get_outputs(self) -> list[NodeArg]:
        return self._args(self.artifact.graph.outputs)

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], *,
            keep_intermediates: bool = False) -> list[np.ndarray]:
        """The requested outputs (all when `output_names` is None), in order, as numpy arrays.
        With `keep_intermediates`, :meth:`intermediate` then returns any value of the last run."""
        graph = self.artifact.graph
        names = list(graph.outputs) if output_names is None else list(output_names)
        for n in names:
            if n not in graph.outputs:
                raise DeviceError(f"'{n}' is not an output of the model (outputs: {', '.join(graph.outputs)})")
        # when NaN/Inf are let through, numpy's warnings about casting them (quantization) are expected
        quiet = np.errstate(invalid="ignore", over="ignore") if self.allow_nonfinite else contextlib.nullcontext()
        with allowing_nonfinite(self.allow_nonfinite), quiet:
            outputs, figures, values = self.device.run(feeds, keep_intermediates=keep_intermediates)
        self._intermediates = values
        # (summarized on demand: a caller that never reads stats does not pay for it on every run)
        self._figures, self._stats = figures, None
        return [outputs[n] for n in names]

    def intermediate(self, name: str) -> np.ndarray:
        """A value of the last run (packed, as the device holds it), kept with ``keep_intermediates``."""
        if name not in self._intermediates:
            raise DeviceError(f"no intermediate '{name}': run with keep_intermediates=True, and name a value of "
                              "the graph")
        return self._intermediates[name]

    def _summarize(self, figures: dict[str, Any]) -> dict[str, Any]:
        layers = figures["layers"]
        macs = sum(layer["macs"] for layer in layers)
        accel = sum(layer["macs"] for layer in layers if layer["target"] == "accel")
        extra = {k: v for k, v in figures.items() if k not in ("layers", "cycles")}
        return {
            "device": self.device.name,
            "config": self.device.config.name,
            "config_hash": self.device.config.hash,
            "target": self.artifact.target,
            "macs": macs,
            "accel_macs": accel,
            "accel_mac_fraction": accel / macs if macs else 0.0,
            "cycles": figures.get("cycles"),
            "seconds": sum(layer["seconds"] for layer in layers),
            **extra,
            "layers": layers,
        }

    @property
    def stats(self) -> dict[str, Any] | None:
        """Figures of the last run (None before the first): device, macs, accel_mac_fraction, cycles,
        seconds, and per layer name, op, target, macs, shape, seconds."""
        if self._stats is None and self._figures is not None:
            self._stats = self._summarize(self._figures)
        return self._stats
