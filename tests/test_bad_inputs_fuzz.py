"""Fuzzing the .weft loader: random damage to a valid artifact's bytes or to its manifest either loads
(and its arrays read) or ends in ArtifactError, never another exception."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft.core.artifact import Artifact, ArtifactError

from .artifact_util import members_of, rezip
from .driver_util import compiled

FUZZ = settings(max_examples=600, deadline=2000, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

_GOOD = compiled("mlp")[0].to_bytes()
_MANIFEST = json.loads(members_of(_GOOD)["manifest.json"])


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key or index path in the manifest (the root excluded)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    out = []
    for key, child in items:
        out.append((*prefix, key))
        out += _paths(child, (*prefix, key))
    return out


PATHS = _paths(_MANIFEST)
ODD_VALUES = [None, True, False, 0, -1, -(2**63), 2**45, 2**64, 10**30, 1e308, -0.5, "", "../x", "/etc/passwd",
              "..", [], [0], [-1, 2], [10**6, 10**6], {}, {"$array": "../x"}, {"$float": "nan"}]


def _load_fully(data: bytes) -> None:
    """Load `data`, read every section array: a correct load or ArtifactError, nothing else."""
    try:
        art = Artifact.from_bytes(data)
        for section in art.sections.values():
            for fname in section.files:
                if fname.endswith(".npy"):
                    section.array(fname[:-4])
    except ArtifactError:
        pass


def _mutated(path: tuple[Any, ...], how: str, value: Any) -> bytes:
    manifest = json.loads(json.dumps(_MANIFEST))
    parent = manifest
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if how == "delete":
        del parent[last]
    elif how == "rename" and isinstance(parent, dict):
        parent[value if isinstance(value, str) else "../evil"] = parent.pop(last)
    else:
        parent[last] = value
    members = members_of(_GOOD)
    members["manifest.json"] = json.dumps(manifest).encode()
    return rezip(members)


@FUZZ
@given(path=st.sampled_from(PATHS), how=st.sampled_from(["replace", "delete", "rename"]),
       value=st.sampled_from(ODD_VALUES))
def test_manifest_mutations_load_or_raise_artifact_error(path, how, value):
    _load_fully(_mutated(path, how, value))


def _damage(ops: list[tuple[str, int, bytes]]) -> bytes:
    data = bytearray(_GOOD)
    for kind, where, payload in ops:
        at = where % max(1, len(data))
        if kind == "flip" and data:
            data[at] ^= 1 << (payload[0] % 8 if payload else 0)
        elif kind == "insert":
            data[at:at] = payload or b"\0"
        elif kind == "delete":
            del data[at:at + 1 + len(payload)]
        else:
            del data[at:]
    return bytes(data)


# small ops, not the damaged bytes, are what hypothesis draws, shrinks and prints
OPS = st.lists(st.tuples(st.sampled_from(["flip", "flip", "insert", "delete", "truncate"]), st.integers(0, 2**20),
                         st.binary(max_size=16)), min_size=1, max_size=4)


@FUZZ
@given(ops=OPS)
def test_byte_damage_loads_or_raises_artifact_error(ops):
    _load_fully(_damage(ops))


@pytest.mark.parametrize("value", ODD_VALUES[:8])
def test_every_top_level_key_replaced(value):
    for key in _MANIFEST:
        _load_fully(_mutated((key,), "replace", value))
