"""The files every generated design comes from, and their fingerprint: part of the key of each cache of a
design's products (the RTL simulation builds, the synthesis results), which stand only while those files and
Amaranth's version are what made them."""

from __future__ import annotations

from pathlib import Path

from weft.core.files import sources_digest

__all__ = ["hardware_fingerprint", "hardware_sources"]

_PACKAGE = Path(__file__).resolve().parent.parent
#: Modules of weft.hw that do not shape a design (its commands, the package's exports).
_NOT_HARDWARE = {"__init__.py", "cli.py", "slack.py"}


def hardware_sources() -> list[Path]:
    """weft.hw's generator modules, all of weft.isa (the layouts and the rules the hardware checks and routes
    by) and the config (the numbers every width derives from)."""
    hw = [p for p in sorted((_PACKAGE / "hw").glob("*.py")) if p.name not in _NOT_HARDWARE]
    return [*hw, *sorted((_PACKAGE / "isa").glob("*.py")), _PACKAGE / "config.py"]


def hardware_fingerprint() -> str:
    """A short hash of :func:`hardware_sources` and Amaranth's version."""
    import amaranth  # here, not above: weft.hw.synth's board tables load on a board without Amaranth

    return sources_digest(hardware_sources(), _PACKAGE, f"amaranth {amaranth.__version__}")[:16]
