"""The sweep grammar: short knob names mapped to config fields, and the grid of configs they span.

Most knobs set fields directly. ``depth`` sizes the data buffers in rows instead of bytes: the
instruction's index fields follow the rows, so a grid over block and batch at one depth keeps every point's
instruction the same width, where a fixed byte size would give a small block so many rows that its GEMM
instruction outgrows the 128-bit word (the 1x8x8 point at the default sizes).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from weft.config import AcceleratorConfig, ConfigError
from weft.errors import UsageError

__all__ = ["DERIVED_KNOBS", "KNOBS", "expand_grid", "parse_sweep", "point_name"]


def _kib(field: str) -> Callable[[float], dict[str, Any]]:
    return lambda v: {field: int(v * 1024)}


#: The data buffers the ``depth`` knob sizes and the fields whose product is one row's bits (a vector of batch x
#: block elements, or a block_out x block_in weight tile). The micro-op buffer holds code, not data: no block
#: size scales it.
_DEPTH_ROWS: dict[str, tuple[str, ...]] = {
    "inp": ("batch", "block_in", "inp_width"),
    "wgt": ("block_out", "block_in", "wgt_width"),
    "acc": ("batch", "block_out", "acc_width"),
}


def _depth_changes(value: float, fields: dict[str, Any], base: AcceleratorConfig) -> dict[str, Any]:
    """``<memory>_buff_bytes`` giving a point of `fields` `value` times the rows `base` has.

    From the fields, not a built config: the point at the base's byte sizes may itself break a rule (too
    many rows for the instruction), the very thing this knob avoids.
    """
    return {f"{m}_buff_bytes": int(base.rows(m) * value) * math.prod(fields[f] for f in lanes) // 8
            for m, lanes in _DEPTH_ROWS.items()}


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

#: knobs applied after the others, from the point's fields and the base config: what they set -> changes.
DERIVED_KNOBS: dict[str, tuple[str, Callable[[float, dict[str, Any], AcceleratorConfig], dict[str, Any]]]] = {
    "depth": ("inp/wgt/acc buffer rows as a multiple of the base config's (bytes follow block and batch)",
              _depth_changes),
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
        if name not in KNOBS and name not in DERIVED_KNOBS:
            raise UsageError(f"--sweep '{spec}': unknown knob '{name}' (knobs: {', '.join([*KNOBS, *DERIVED_KNOBS])})")
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
            if n in KNOBS:
                changes.update(KNOBS[n][1](v))
        fields = {**base.hw_dict(), **changes}
        for n, v in knobs.items():
            if n in DERIVED_KNOBS:
                changes.update(DERIVED_KNOBS[n][1](v, fields, base))
        try:
            valid.append((knobs, base.replace(name=point_name(base.name, knobs), **changes)))
        except ConfigError as err:
            skipped.append((knobs, str(err)))
    return valid, skipped
