"""Devices a session runs an artifact on, by name, from a registry.

A device is made for one accelerator config by its factory, ``factory(config, **options) -> Device``. The
session only talks to the small :class:`Device` interface, so each device ("fsim", "rtl", "cpu", "pynq",
...) registers itself with :func:`register_device` from its own module without touching the session. This
module registers "ref": the numpy reference interpreter (integer layers bit-exact, host layers in numpy).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.core.walker import AcceleratorRunner, walk_graph
from weft.errors import WeftError

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig
    from weft.core.artifact import Artifact

__all__ = ["Device", "DeviceError", "RefDevice", "available_devices", "create_device", "register_device",
           "run_loaded"]


class DeviceError(WeftError):
    """A device that does not exist, or cannot run the artifact it was given."""


class Device:
    """What a session needs from a device: load an artifact once, then run it on feeds.

    ``run`` returns the graph outputs by name and the run's figures: at least ``cycles`` (None when the
    device does not count them) and ``layers``, one dict per node with name, op, target, macs, shape and
    seconds.
    """

    name = "device"

    def __init__(self, config: AcceleratorConfig):
        self.config = config
        self.artifact: Artifact | None = None

    def load(self, artifact: Artifact) -> None:
        """Accept `artifact`, or refuse one compiled for another config (naming both hashes)."""
        if artifact.target == "accel" and artifact.config_hash != self.config.hash:
            raise DeviceError(
                f"device '{self.name}' was created for config '{self.config.name}' (hash {self.config.hash}) but the "
                f"artifact was compiled for config '{artifact.config.name}' (hash {artifact.config_hash}); recompile "
                "for this config or use a device with the artifact's config"
            )
        self.artifact = artifact

    def run(self, feeds: Mapping[str, np.ndarray], *, keep_intermediates: bool = False
            ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray]]:
        """(outputs by name, figures, intermediates by value name if asked)."""
        raise NotImplementedError


def run_loaded(artifact: Artifact | None, feeds: Mapping[str, Any], *, runner: AcceleratorRunner | None = None,
               keep_intermediates: bool = False
               ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray]]:
    """A device's ``run``: the walk of the loaded artifact's graph as (outputs, figures, intermediates)."""
    if artifact is None:
        raise DeviceError("load an artifact before running")
    result = walk_graph(artifact.graph, feeds, runner=runner, keep_intermediates=keep_intermediates)
    return result.outputs, {"cycles": result.cycles, "layers": result.layers}, result.values


class RefDevice(Device):
    """The reference interpreter as a device: the graph walker with no accelerator runner (no cycles, the
    partition's layers as they would run)."""

    name = "ref"

    def run(self, feeds: Mapping[str, np.ndarray], *, keep_intermediates: bool = False
            ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray]]:
        return run_loaded(self.artifact, feeds, keep_intermediates=keep_intermediates)


Factory = Callable[..., Device]
_REGISTRY: dict[str, Factory] = {}


def register_device(name: str, factory: Factory, *, replace: bool = False) -> None:
    """Make `name` available to sessions: ``factory(config, **options)`` builds the device."""
    if name in _REGISTRY and not replace:
        raise ValueError(f"device '{name}' is already registered")
    _REGISTRY[name] = factory


def available_devices() -> list[str]:
    return sorted(_REGISTRY)


def create_device(name: str, config: AcceleratorConfig, **options: Any) -> Device:
    factory = _REGISTRY.get(name)
    if factory is None and ":" in name:  # "kind:target", e.g. "remote:HOST:PORT"
        kind, _, target = name.partition(":")
        if kind in _REGISTRY:
            return _REGISTRY[kind](config, target=target, **options)
    if factory is None:
        known = ", ".join(available_devices())
        raise DeviceError(f"device '{name}' is not available in this build (available: {known})")
    _check_options(name, factory, options)
    return factory(config, **options)


def _check_options(name: str, factory: Callable[..., Device], options: Mapping[str, Any]) -> None:
    """Refuse an option the device's factory does not take, or the lack of one it needs, naming it
    (factories that pass options on through **kwargs check them themselves)."""
    import inspect

    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(options) - set(params))
    if unknown:
        accepted = [p for p in params if p != "config"]
        raise DeviceError(f"device '{name}' has no option '{unknown[0]}' (options: {', '.join(accepted) or 'none'})")
    missing = [p.name for p in params.values()
               if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is p.empty and p.name not in options]
    if missing:
        raise DeviceError(f"device '{name}' needs the option '{missing[0]}'")


register_device("ref", RefDevice)
