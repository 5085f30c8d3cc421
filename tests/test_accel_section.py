"""The accelerator section read typed: the same figures as its JSON, one name and version for writer, schema and
readers, and a section of another version or with overflowing constants refused by name."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import weft
from weft.compiler import models
from weft.core.accel_section import accel_section
from weft.core.artifact import Artifact, ArtifactError, Section
from weft.core.artifact_schema import ACCEL_SECTION, ACCEL_VERSION


@pytest.fixture(scope="module")
def artifact() -> Artifact:
    rng = np.random.default_rng(0)
    calibration = {"input": rng.standard_normal((2, 1, 3, 32, 32)).astype(np.float32)}
    return weft.compile(models.small_resnet(widths=(8, 16, 24)), calibration=calibration)


def _with_meta(artifact: Artifact, meta: dict) -> Artifact:
    """`artifact` with its accelerator section's meta replaced (same constants)."""
    files = dict(artifact.sections[ACCEL_SECTION].files)
    return Artifact(artifact.graph, artifact.config, artifact.target, meta=artifact.meta,
                    sections={**artifact.sections, ACCEL_SECTION: Section(ACCEL_SECTION, meta, files)})


def test_typed_section_equals_its_json(artifact: Artifact, tmp_path) -> None:
    loaded = Artifact.load(artifact.save(tmp_path / "net.weft"))
    section = accel_section(loaded)
    meta = loaded.sections[ACCEL_SECTION].meta
    assert section is not None and meta["version"] == ACCEL_VERSION
    assert (section.dram_bytes, section.const_base) == (meta["dram_bytes"], meta["const_base"])
    assert [layer.name for layer in section.layers] == [layer["name"] for layer in meta["layers"]]
    for layer in section.layers:
        assert (layer.insn_addr, layer.insn_count, layer.insn_bytes) == \
            (layer.record["insn_addr"], layer.record["insn_count"], layer.record["insn_bytes"])
        assert len(section.program_words(layer)) == layer.insn_count * layer.insn_bytes
    for name, value in section.values.items():
        assert list(value.shape) == meta["values"][name]["shape"] and value.addr == meta["values"][name]["addr"]


def test_no_section_is_none(artifact: Artifact) -> None:
    host = Artifact(artifact.graph, artifact.config, artifact.target, meta=artifact.meta)
    assert accel_section(host) is None


def test_another_version_loads_but_is_not_read(artifact: Artifact, tmp_path) -> None:
    meta = {"version": ACCEL_VERSION + 1}
    other = _with_meta(artifact, meta)
    loaded = Artifact.load(other.save(tmp_path / "future.weft"))  # the schema checks only known versions
    with pytest.raises(ArtifactError, match=f"version {ACCEL_VERSION + 1}; this weft reads {ACCEL_VERSION}"):
        accel_section(loaded)


def test_constants_past_the_image_are_refused(artifact: Artifact) -> None:
    meta = copy.deepcopy(artifact.sections[ACCEL_SECTION].meta)
    meta["dram_bytes"] = meta["const_base"] + 1
    with pytest.raises(ArtifactError, match="do not fit dram_bytes"):
        accel_section(_with_meta(artifact, meta))
