"""The artifact's accelerator section: the back end's DRAM image and one instruction stream per layer.

The back end writes it (:func:`weft.compiler.backend.codegen.generate`); the devices, the trace and the
benchmarks read it through :func:`accel_section`. On disk it is the section ``ACCEL_SECTION`` of a ``.weft``: its
meta (JSON, bounded by :func:`weft.core.artifact_schema.check_manifest` when a file is loaded) and the
array ``const``, the constant bytes that start at ``const_base`` of a ``dram_bytes`` DRAM image (weights,
micro-ops and every layer's program).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.core.artifact_schema import ACCEL_SECTION, ACCEL_VERSION, ArtifactError

if TYPE_CHECKING:
    from weft.core.artifact import Artifact

__all__ = ["AccelLayer", "AccelSection", "AccelValue", "accel_section"]


@dataclass(frozen=True)
class AccelValue:
    """Where a value the accelerator reads or writes sits in DRAM: `bytes` from `addr`, packed at the
    config's output width, holding a tensor of `shape` and IR `dtype`."""

    addr: int
    bytes: int
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class AccelLayer:
    """One accelerator layer's program: `insn_count` instructions of `insn_bytes` at DRAM `insn_addr`,
    reading the values named by `inputs`. `record` is the layer's whole meta as the back end wrote it
    (schedule, geometry, counts), the form the per-layer hooks receive."""

    name: str
    insn_addr: int
    insn_bytes: int
    insn_count: int
    inputs: tuple[str, ...]
    record: Mapping[str, Any]


@dataclass(frozen=True)
class AccelSection:
    """The ``accel`` section of one artifact, typed. `const` holds the bytes from `const_base` on;
    `compile_seconds` is the back end's time (None in an artifact that does not record it)."""

    dram_bytes: int
    const_base: int
    compile_seconds: float | None
    values: Mapping[str, AccelValue]
    layers: tuple[AccelLayer, ...]
    const: np.ndarray

    def program_words(self, layer: AccelLayer) -> np.ndarray:
        """The encoded instruction stream of `layer` (a slice of the constants)."""
        return self.words_at(layer.insn_addr, layer.insn_count, layer.insn_bytes)

    def words_at(self, insn_addr: int, insn_count: int, insn_bytes: int) -> np.ndarray:
        """The encoded instructions of the program at DRAM `insn_addr` (a slice of the constants)."""
        start = insn_addr - self.const_base
        return self.const[start:start + insn_count * insn_bytes]


def accel_section(artifact: Artifact) -> AccelSection | None:
    """The typed ``accel`` section of `artifact`; None when it has none (an artifact for the host, or compiled
    without the back end). Raises ArtifactError for a version other than :data:`ACCEL_VERSION` and for
    constants that overflow the DRAM image (the manifest check bounds every key, but not the array's size)."""
    section = artifact.sections.get(ACCEL_SECTION)
    if section is None:
        return None
    meta = section.meta
    if meta.get("version") != ACCEL_VERSION:
        raise ArtifactError(f"section '{ACCEL_SECTION}' has version {meta.get('version')!r}; this weft reads "
                            f"{ACCEL_VERSION}")
    const = section.array("const")
    dram_bytes, const_base = int(meta["dram_bytes"]), int(meta["const_base"])
    if const_base + const.nbytes > dram_bytes:
        raise ArtifactError(f"section '{ACCEL_SECTION}': {const.nbytes} bytes of constants at const_base "
                            f"{const_base} do not fit dram_bytes {dram_bytes}")
    values = {name: AccelValue(int(v["addr"]), int(v["bytes"]), tuple(int(d) for d in v["shape"]), str(v["dtype"]))
              for name, v in meta["values"].items()}
    layers = tuple(AccelLayer(str(x["name"]), int(x["insn_addr"]), int(x["insn_bytes"]), int(x["insn_count"]),
                              tuple(x["inputs"]), x) for x in meta["layers"])
    seconds = meta.get("compile_seconds")
    return AccelSection(dram_bytes, const_base, None if seconds is None else float(seconds), values, layers, const)
