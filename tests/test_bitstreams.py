"""Bitstream projects: the Vivado scripts' structure per board (Vivado is not here), manifests, lookup
and config matching."""

from __future__ import annotations

import json

import pytest

from weft.cli import main
from weft.config import PRESETS, AcceleratorConfig
from weft.runtime import bitstreams
from weft.runtime.bitstreams import BOARDS, BitstreamError, lookup, project_tcl, read_manifest


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_project_script_structure(board):
    cfg = PRESETS["tiny"]
    b = BOARDS[board]
    tcl = project_tcl(b, cfg)
    assert f"-part {b.part}" in tcl
    assert f'set expected_vivado "{b.vivado}"' in tcl and "[version -short]" in tcl
    ps = "processing_system7" if b.family == "zynq" else "zynq_ultra_ps_e"
    assert f"xilinx.com:ip:{ps}" in tcl
    assert "ipx::package_project" in tcl and "weft:accel:weft_top:1.0" in tcl
    assert tcl.count("xilinx.com:ip:axi_interconnect") == 2
    assert f"ps/{b.dram_port}" in tcl and "weft_0/m_axi" in tcl and "weft_0/s_axil" in tcl
    assert f"{{{cfg.clock_mhz}}}" in tcl  # the PL clock from the config
    assert "write_bitstream" in tcl and "weft.hwh" in tcl
    assert tcl.count("{") == tcl.count("}")
    assert project_tcl(b, cfg, vivado="2023.1").count('"2023.1"') == 1


def test_manifest_and_lookup(tmp_path):
    cfg = PRESETS["tiny"]
    folder = bitstreams.write_project("kv260", cfg, tmp_path, verilog="module weft_top; endmodule\n")
    m = read_manifest(folder / "manifest.json")
    assert (m["board"], m["part"], m["config_hash"], m["clock_mhz"]) == ("kv260", BOARDS["kv260"].part, cfg.hash,
                                                                          cfg.clock_mhz)
    assert m["bit"] is None and m["hwh"] is None
    with pytest.raises(BitstreamError, match="not built yet"):
        lookup("kv260", cfg, tmp_path)
    (folder / "weft.bit").write_bytes(b"\x00\x01")
    (folder / "weft.hwh").write_text("<hwh/>")
    m = bitstreams.record_build(folder)
    assert m["bit"]["name"] == "weft.bit" and len(m["bit"]["sha256"]) == 64
    found, manifest = lookup("KV260", cfg, tmp_path)
    assert found == folder and manifest["config"] == cfg.to_dict()
    with pytest.raises(BitstreamError, match=f"no bitstream for board kv260 and config 'default'.*{cfg.hash}"):
        lookup("kv260", PRESETS["default"], tmp_path)
    with pytest.raises(BitstreamError, match="no bitstream for board zcu104"):
        lookup("zcu104", cfg, tmp_path)
    (folder / "weft.bit").write_bytes(b"tampered")
    with pytest.raises(BitstreamError, match="SHA-256 differs"):
        lookup("kv260", cfg, tmp_path)
    with pytest.raises(BitstreamError, match="unknown board 'pynq-z9'"):
        lookup("pynq-z9", cfg, tmp_path)


def test_bad_manifest_is_refused(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "manifest.json").write_text(json.dumps({"format": "weft-bitstream", "version": 99}))
    with pytest.raises(BitstreamError, match="version 99"):
        bitstreams.find_bitstreams(tmp_path)


def test_cli_project_and_list(tmp_path, capsys):
    assert main(["bitstream", "--board", "pynq-z1", "--config", "tiny", "-o", str(tmp_path)]) == 0
    folder = tmp_path / f"pynq-z1-{PRESETS['tiny'].hash}"
    assert (folder / "build.tcl").exists() and "module weft_top" in (folder / "weft_top.v").read_text()
    assert main(["bitstream", "list", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"pynq-z1     config tiny ({PRESETS['tiny'].hash})" in out and "not built" in out


@pytest.mark.parametrize("folder", [folder.name for folder, _ in bitstreams.find_bitstreams()])
def test_committed_build_scripts_are_what_the_generator_writes(folder):
    """Each project under bitstreams/ is generated, never edited: its build.tcl equals what `weft bitstream`
    writes today for the board, config and Vivado version of its manifest."""
    path = bitstreams.DEFAULT_ROOT / folder
    manifest = read_manifest(path / "manifest.json")
    config = AcceleratorConfig.from_dict(manifest["config"])
    board = BOARDS[manifest["board"]]
    assert config.hash == manifest["config_hash"] and folder == bitstreams.project_name(board, config.hash)
    assert (path / "build.tcl").read_text() == project_tcl(board, config, vivado=manifest["vivado"])
