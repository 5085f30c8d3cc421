"""The .weft artifact: one zip file holding a compiled model. Loading it never runs code.

Members:

* ``manifest.json``: format name and version, weft version, compile target, the config (as data) and its
  hash, the graph as JSON whose arrays are references, free-form ``meta`` (source model, pipeline,
  calibration), the named sections, and a SHA-256 of every other member.
* ``arrays/N.npy``: the graph's arrays (weights, epilogue vectors), read with ``allow_pickle=False``.
* ``sections/NAME/FILE``: named sections that later stages add (instruction streams, DRAM images, host
  code) without changing the format: a reader keeps sections it does not know.

A file of another format version, a broken zip, a missing member or one whose hash differs is refused
with an :class:`ArtifactError` saying which; so is a manifest whose keys are missing, mistyped, out of
range or unsafely named (:mod:`weft.core.artifact_schema`, checked before anything is allocated).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from weft import __version__
from weft.config import AcceleratorConfig, ConfigError
from weft.core.artifact_schema import ArtifactError, check_manifest, check_shape
from weft.core.errors import GraphError
from weft.core.files import write_atomic
from weft.core.ir import Graph, graph_from_dict, graph_to_dict
from weft.errors import read_input

__all__ = ["FORMAT", "FORMAT_VERSION", "Artifact", "ArtifactError", "Section", "load_artifact"]

FORMAT = "weft-artifact"
FORMAT_VERSION = 1
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _npy_load(data: bytes, what: str) -> np.ndarray:
    buf = io.BytesIO(data)
    try:
        # numpy allocates the header's shape before reading the data: bound it first
        major, _ = np.lib.format.read_magic(buf)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(buf)
        check_shape(list(shape), what, "shape", label="the .npy header's")
        if len(data) - buf.tell() < math.prod(shape) * dtype.itemsize:
            raise ArtifactError(f"{what} is shorter than its header's shape {list(shape)}")
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise ArtifactError(f"{what} is not a valid .npy array ({err})") from None
    if not isinstance(array, np.ndarray):
        raise ArtifactError(f"{what} is not a single array")
    array.flags.writeable = False
    return array


@dataclass
class Section:
    """A named, versioned-by-its-owner part of an artifact: JSON metadata plus raw files."""

    name: str
    meta: dict[str, Any] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)

    def add_array(self, name: str, array: np.ndarray) -> None:
        self.files[f"{name}.npy"] = _npy_bytes(array)

    def array(self, name: str) -> np.ndarray:
        key = f"{name}.npy"
        if key not in self.files:
            raise ArtifactError(f"section '{self.name}' has no array '{name}'")
        return _npy_load(self.files[key], f"sections/{self.name}/{key}")


class Artifact:
    """A compiled model: the partitioned graph, the config it was compiled for, and sections."""

    def __init__(self, graph: Graph, config: AcceleratorConfig, target: str, *, meta: Mapping[str, Any] | None = None,
                 sections: Mapping[str, Section] | None = None):
        self.graph = graph
        self.config = config
        self.target = target
        self.meta: dict[str, Any] = dict(meta or {})
        self.sections: dict[str, Section] = dict(sections or {})

    @property
    def config_hash(self) -> str:
        return self.config.hash

    # ---- sections ----------------------------------------------------------------------------------
    def add_section(self, name: str, meta: Mapping[str, Any] | None = None,
                    files: Mapping[str, bytes] | None = None) -> Section:
        """Add (or replace) section `name`; names and file names are plain identifiers."""
        for n in (name, *(files or {})):
            if not _NAME.match(n):
                raise ValueError(f"section and file names must match {_NAME.pattern}, got '{n}'")
        section = Section(name, dict(meta or {}), dict(files or {}))
        self.sections[name] = section
        return section

    def section(self, name: str) -> Section:
        try:
            return self.sections[name]
        except KeyError:
            raise ArtifactError(f"the artifact has no section '{name}' (sections: "
                                f"{', '.join(self.sections) or 'none'})") from None

    # ---- writing -----------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        arrays: dict[str, bytes] = {}
        by_id: dict[int, str] = {}

        def put(array: np.ndarray) -> str:
            key = by_id.get(id(array))
            if key is None:
                key = f"arrays/{len(arrays)}.npy"
                arrays[key] = _npy_bytes(array)
                by_id[id(array)] = key
            return key

        graph = graph_to_dict(self.graph, put)
        files = dict(arrays)
        sections = {}
        for name, section in self.sections.items():
            sections[name] = {"meta": section.meta, "files": sorted(section.files)}
            for fname, data in section.files.items():
                files[f"sections/{name}/{fname}"] = data
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "weft_version": __version__,
            "target": self.target, "config": self.config.to_dict(), "config_hash": self.config.hash,
            "graph": graph, "meta": self.meta, "sections": sections,
            "members": {k: hashlib.sha256(v).hexdigest() for k, v in files.items()},
        }
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr("manifest.json", json.dumps(manifest, indent=1, allow_nan=False),
                        compress_type=zipfile.ZIP_DEFLATED)
            for key, data in files.items():
                zf.writestr(key, data, compress_type=zipfile.ZIP_STORED)
        return buf.getvalue()

    def save(self, path: str | Path) -> Path:
        """Write the artifact atomically: a failed save leaves no file (and no partial one) behind."""
        return write_atomic(path, self.to_bytes())

    # ---- reading -----------------------------------------------------------------------------------
    @classmethod
    def from_bytes(cls, data: bytes, what: str = "the artifact") -> Artifact:
        try:
            zf = zipfile.ZipFile(io.BytesIO(data))
        except (zipfile.BadZipFile, ValueError, OSError, EOFError):
            raise ArtifactError(f"{what} is not a weft artifact (not a zip file, or truncated)") from None
        with zf:
            names = set(zf.namelist())
            if "manifest.json" not in names:
                raise ArtifactError(f"{what} is not a weft artifact (no manifest.json)")

            def read(member: str) -> bytes:
                try:
                    return zf.read(member)
                # a damaged directory surfaces as any of these (a negative seek is a ValueError, an unknown
                # compression method NotImplementedError, an encrypted member RuntimeError)
                except (zipfile.BadZipFile, KeyError, EOFError, OSError, ValueError, NotImplementedError, RuntimeError,
                        zlib.error) as err:
                    raise ArtifactError(f"{what}: member '{member}' is corrupt or missing ({err})") from None

            try:
                manifest = json.loads(read("manifest.json"))
            except ValueError as err:  # JSONDecodeError, or UnicodeDecodeError of damaged bytes
                raise ArtifactError(f"{what}: manifest.json is not valid JSON ({err})") from None
            if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
                raise ArtifactError(f"{what} is not a weft artifact (format is {manifest.get('format')!r})"
                                    if isinstance(manifest, dict) else f"{what}: manifest.json is not an object")
            version = manifest.get("format_version")
            if version != FORMAT_VERSION:
                raise ArtifactError(f"{what} has format version {version!r}; this weft "
                                    f"reads version {FORMAT_VERSION} only (recompile the model)")
            check_manifest(manifest, what)
            members: dict[str, str] = manifest["members"]
            blobs: dict[str, bytes] = {}
            for member, digest in members.items():
                blob = read(member)
                if hashlib.sha256(blob).hexdigest() != digest:
                    raise ArtifactError(f"{what}: member '{member}' is corrupt (its hash does not match the manifest)")
                blobs[member] = blob
        try:
            config = AcceleratorConfig.from_dict(manifest["config"])
        except (ConfigError, KeyError, TypeError) as err:
            raise ArtifactError(f"{what}: the recorded config is invalid ({err})") from None
        if config.hash != manifest.get("config_hash"):
            raise ArtifactError(f"{what}: the recorded config hashes to {config.hash}, not the recorded "
                                f"{manifest.get('config_hash')}")
        cache: dict[str, np.ndarray] = {}

        def get(ref: str) -> np.ndarray:
            if ref not in cache:
                if ref not in blobs:
                    raise ArtifactError(f"{what}: array '{ref}' is missing")
                cache[ref] = _npy_load(blobs[ref], ref)
            return cache[ref]

        try:
            graph = graph_from_dict(manifest["graph"], get)
        except (KeyError, TypeError, ValueError, GraphError) as err:
            raise ArtifactError(f"{what}: the graph is malformed ({err})") from None
        sections = {}
        for name, info in manifest.get("sections", {}).items():
            files = {f: blobs[f"sections/{name}/{f}"] for f in info["files"]}
            sections[name] = Section(name, info["meta"], files)
        return cls(graph, config, manifest["target"], meta=manifest.get("meta", {}), sections=sections)

    @classmethod
    def load(cls, path: str | Path) -> Artifact:
        path = Path(path)
        if not path.is_file():
            raise ArtifactError(f"{path}: no such artifact file")
        return cls.from_bytes(read_input(path, "artifact"), str(path))

    def __repr__(self) -> str:
        return (f"Artifact({self.graph.name!r}, target={self.target!r}, config={self.config.name!r} "
                f"({self.config_hash}), {len(self.graph.nodes)} layers)")


def load_artifact(path: str | Path) -> Artifact:
    """Read a .weft file (see :class:`Artifact`)."""
    return Artifact.load(path)
