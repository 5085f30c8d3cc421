"""A damaged or hostile .weft manifest is refused on load with an ArtifactError naming the key or member,
before anything is allocated, and the file itself is left as it was."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from weft.cli import main
from weft.core.artifact import Artifact, ArtifactError
from weft.runtime import InferenceSession

from .artifact_util import members_of, rezip
from .driver_util import compiled


@pytest.fixture(scope="module")
def good() -> bytes:
    art, _ = compiled("mlp")
    return art.to_bytes()


def with_manifest(data: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    members = members_of(data)
    manifest = json.loads(members["manifest.json"])
    edit(manifest)
    members["manifest.json"] = json.dumps(manifest).encode()
    return rezip(members)


def _accel(m: dict[str, Any]) -> dict[str, Any]:
    return m["sections"]["accel"]["meta"]


def _first_layer(m: dict[str, Any]) -> dict[str, Any]:
    return _accel(m)["layers"][0]


def _first_value(m: dict[str, Any]) -> dict[str, Any]:
    return next(iter(_accel(m)["values"].values()))


def _qconv(m: dict[str, Any]) -> dict[str, Any]:
    return next(n for n in m["graph"]["nodes"] if n["op"] == "qconv2d")


def _quantize(m: dict[str, Any]) -> dict[str, Any]:
    return next(n for n in m["graph"]["nodes"] if n["op"] == "quantize")


def _qconv_attrs(m: dict[str, Any]) -> dict[str, Any]:
    return _qconv(m)["attrs"]


def _quantize_attrs(m: dict[str, Any]) -> dict[str, Any]:
    return _quantize(m)["attrs"]


def _rename_member(m: dict[str, Any], new: str) -> None:
    name = next(iter(m["members"]))
    m["members"][new] = m["members"].pop(name)


def _set(getter: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda m: getter(m).__setitem__(key, value)


def _drop(getter: Callable[[dict[str, Any]], dict[str, Any]], key: str) -> Callable[[dict[str, Any]], None]:
    return lambda m: getter(m).pop(key)


def _root(m: dict[str, Any]) -> dict[str, Any]:
    return m


CASES = {
    "members as a list": (lambda m: m.__setitem__("members", list(m["members"])), "'members' must be of type dict"),
    "member name with ../": (lambda m: _rename_member(m, "../evil.npy"), "unsafe member name '../evil.npy'"),
    "absolute member name": (lambda m: _rename_member(m, "/etc/passwd"), "unsafe member name '/etc/passwd'"),
    "digest not hex": (lambda m: m["members"].__setitem__(next(iter(m["members"])), "zz"), "SHA-256"),
    "section name with ../": (lambda m: m["sections"].__setitem__("../up", {"meta": {}, "files": []}),
                              "unsafe section name '../up'"),
    "section file not a member": (lambda m: m["sections"]["accel"]["files"].append("ghost.npy"),
                                  "'sections.accel.files' names 'ghost.npy', which is not a member"),
    "target is a number": (_set(_root, "target", 3), "'target' must be of type str"),
    "graph without nodes": (_drop(lambda m: m["graph"], "nodes"), "'graph.nodes' is missing"),
    "graph input unknown": (lambda m: m["graph"]["inputs"].append("nowhere"), "names 'nowhere', which is not a value"),
    "stride 0": (_set(_qconv_attrs, "strides", [0, 1]), "attrs.strides' must be a list of 2 integers within 1..65536"),
    "kernel a string": (_set(_qconv_attrs, "kernel", "3x3"), "attrs.kernel' must be a list of 2 integers"),
    "negative pads": (_set(_qconv_attrs, "pads", [0, -1, 0, 0]),
                      "attrs.pads' must be a list of 4 integers within 0..65536"),
    "kernel an int": (_set(_qconv_attrs, "kernel", 3), "attrs.kernel' must be a list of 2"),
    "bits 2**45": (_set(_quantize_attrs, "bits", 2**45), "attrs.bits' must be an integer within 1..32"),
    "scale null": (_set(_quantize_attrs, "scale", None), "attrs.scale' must be a positive finite"),
    "epilogue null": (_set(_qconv_attrs, "epilogue", None), "attrs.epilogue' must be a list of"),
    "attrs a float reference": (lambda m: _qconv(m).__setitem__("attrs", {"$float": "nan"}),
                                "attrs' must be an object"),
    "node without inputs": (lambda m: _qconv(m).__setitem__("inputs", []), "inputs' must name its values, got []"),
    "q op missing its weights": (lambda m: _qconv(m)["inputs"].__setitem__(1, ""), "inputs' must name its values"),
    "value without a shape": (lambda m: m["graph"]["values"][0].__setitem__("shape", None),
                              "values[0].shape' must be of type list, got NoneType"),
    "packed value with a 0": (lambda m: m["graph"]["values"][1]["shape"].__setitem__(5, 0),
                              "of a packed value must be 6 dimensions >= 1"),
    "graph input with a 0": (lambda m: m["graph"]["values"][0]["shape"].__setitem__(0, 0),
                             "'graph.inputs' 'input' has a zero dimension [0, 64]"),
    "value shape of 1e12": (lambda m: m["graph"]["values"][0].__setitem__("shape", [10**6, 10**6]),
                            "has 1000000000000 elements, more than the limit"),
    "negative value shape": (lambda m: m["graph"]["values"][0].__setitem__("shape", [4, -64]), "negative dimension"),
    "unknown dtype": (lambda m: m["graph"]["values"][0].__setitem__("dtype", "complex64"), "dtype' is 'complex64'"),
    "accel meta without layers": (_drop(_accel, "layers"), "'sections.accel.meta.layers' is missing"),
    "dram_bytes 2**45": (_set(_accel, "dram_bytes", 2**45), "'sections.accel.meta.dram_bytes' is 35184372088832"),
    "dram_bytes a string": (_set(_accel, "dram_bytes", "big"), "'sections.accel.meta.dram_bytes' must be of type int"),
    "dram_bytes true": (_set(_accel, "dram_bytes", True), "'sections.accel.meta.dram_bytes' must be of type int"),
    "const_base past DRAM": (_set(_accel, "const_base", 2**31), "'sections.accel.meta.const_base' is 2147483648"),
    "negative value addr": (_set(_first_value, "addr", -8), "values.input_q.addr' is -8"),
    "value bytes past DRAM": (_set(_first_value, "bytes", 2**31), "values.input_q.bytes' is 2147483648"),
    # as many instructions as the image has bytes: within the count's own range, past the image's end
    "layer program past DRAM": (lambda m: _first_layer(m).__setitem__("insn_count", _accel(m)["dram_bytes"]),
                                "insn_count' puts the program past"),
    "layer insn_bytes 0": (_set(_first_layer, "insn_bytes", 0), "layers[0].insn_bytes' is 0"),
    "layer input without a buffer": (_set(_first_layer, "inputs", ["nothing"]), "names 'nothing', which has no DRAM"),
    "layer without a schedule": (_drop(_first_layer, "schedule"), "layers[0].schedule' is missing"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_manifest_is_refused_naming_the_key(good, case):
    edit, fragment = CASES[case]
    with pytest.raises(ArtifactError) as err:
        Artifact.from_bytes(with_manifest(good, edit))
    assert fragment in str(err.value)


def test_an_npy_header_claiming_a_huge_shape_is_refused_before_allocating(good):
    members = members_of(good)
    name = "sections/accel/const.npy"
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (10**6, 10**6)})
    members[name] = buf.getvalue()
    manifest = json.loads(members["manifest.json"])
    manifest["members"][name] = hashlib.sha256(members[name]).hexdigest()
    members["manifest.json"] = json.dumps(manifest).encode()
    art = Artifact.from_bytes(rezip(members))  # arrays are read when used
    with pytest.raises(ArtifactError, match=r"const.npy: the .npy header's 'shape' \[1000000, 1000000\] has"):
        art.sections["accel"].array("const")


def test_constants_that_do_not_fit_dram_are_refused_by_the_device(good):
    base = Artifact.from_bytes(good).sections["accel"].meta["dram_bytes"] - 1  # inside DRAM, its constants not
    art = Artifact.from_bytes(with_manifest(good, _set(_accel, "const_base", base)))
    with pytest.raises(ArtifactError, match=rf"section 'accel': \d+ bytes of constants at const_base {base} do not "
                                            r"fit dram_bytes \d+"):
        InferenceSession(art, "fsim")


def test_a_failed_load_leaves_the_file_as_it_was(good, tmp_path):
    bad = with_manifest(good, _drop(_accel, "layers"))
    path = tmp_path / "bad.weft"
    path.write_bytes(bad)
    with pytest.raises(ArtifactError, match=r"bad.weft: manifest key 'sections.accel.meta.layers' is missing"):
        Artifact.load(path)
    assert path.read_bytes() == bad
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.weft"]


def test_cli_names_the_key_in_one_line(good, tmp_path, capsys):
    path = tmp_path / "bad.weft"
    path.write_bytes(with_manifest(good, _set(_accel, "dram_bytes", 2**45)))
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    assert "manifest key 'sections.accel.meta.dram_bytes'" in err
