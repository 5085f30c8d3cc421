"""The sweep grammar: short knob names mapped to config fields, and the grid of configs they span."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from weft.config import AcceleratorConfig, ConfigError
from weft.errors import UsageError

__all__ = ["KNOBS", "expand_grid", "parse_sweep", "point_name"]


def _kib(field: str) -> Callable[[float], dict[str, Any]]:
    return lambda v: {field: int(v * 1024)}


#: knob -> (what it sets, value -> config field changes).
KNOBS: dict[str, tuple[str, Callable[[float], dict[str, Any]]]] = {
    "block": ("block_in and block_out (square GEMM)", lambda v: {"block_in": int(v), "block_out": int(v)}),
    "block_in": ("block_in", lambda v: {"block_in": int(v)}),
    "block_out": ("block_out", lambda v: {"block_out": int(v)}),
    "batch": ("batch", lambda v: {"batch": int(v)}),
    "acc_kib": ("acc_buff_bytes in KiB", _kib("acc_buff_bytes")),
    "inp_kib": ("inp_buff_bytes in KiB", _kib("inp_buff_bytes")),
    "wgt_kib": ("wgt_buff_bytes in KiB", _kib("wgt_buff_bytes")),
    "uop_kib": ("uop_buff_bytes in KiB", _kib("uop_buff_bytes")),
    "bus": ("bus_width in bits", lambda v: {"bus_width": int(v)}),
    "clock": ("clock_mhz", lambda v: {"clock_mhz": float(v)}),
    "wgt_bits": ("wgt_width", lambda v: {"wgt_width": int(v)}),
    "inp_bits": ("inp_width", lambda v: {"inp_width": int(v)}),
}


def parse_sweep(specs: Sequence[str]) -> dict[str, list[float]]:
    """``["block=8,16", "acc_kib=64,128"]`` -> ``{"block": [8, 16], "acc_kib": [64, 128]}``.

    A ValueError names the spec and the rule it breaks (unknown knob, a repeated knob, no or bad values).
    """
    sweep: dict[str, list[float]] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = name.strip()
        if not sep or not values.strip():
            raise UsageError(f"--sweep '{spec}': expected KNOB=V1,V2,...")
        if name not in KNOBS:
            raise UsageError(f"--sweep '{spec}': unknown knob '{name}' (knobs: {', '.join(KNOBS)})")
        if name in sweep:
            raise UsageError(f"--sweep '{spec}': knob '{name}' is swept twice")
        try:
            numbers = [float(v) for v in values.split(",")]
        except ValueError:
            raise UsageError(f"--sweep '{spec}': values must be numbers") from None
        # Whole numbers stay ints, so a point reads `block 8` in messages and the CSV, not `8.0`.
        sweep[name] = [int(v) if v.is_integer() else v for v in numbers]
    return sweep


def point_name(base: str, knobs: dict[str, float]) -> str:
    """A design point's name: its base config's and its knob values, ``default-block8-acc_kib64``."""
    return "-".join([base, *(f"{n}{v:g}" for n, v in knobs.items())])


def expand_grid(base: AcceleratorConfig, sweep: dict[str, list[float]]
                ) -> tuple[list[tuple[dict[str, float], AcceleratorConfig]], list[tuple[dict[str, float], str]]]:
    """Every combination of knob values applied to `base`: (valid points, skipped points with the rule
    they break). A point's name lists its knob values."""
    valid: list[tuple[dict[str, float], AcceleratorConfig]] = []
    skipped: list[tuple[dict[str, float], str]] = []
    names = list(sweep)
    for combo in itertools.product(*(sweep[n] for n in names)):
        knobs = dict(zip(names, combo, strict=True))
        changes: dict[str, Any] = {}
        for n, v in knobs.items():
            changes.update(KNOBS[n][1](v))
        try:
            valid.append((knobs, base.replace(name=point_name(base.name, knobs), **changes)))
        except ConfigError as err:
            skipped.append((knobs, str(err)))
    return valid, skipped
