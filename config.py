"""The accelerator config: the single source of truth for every layer of weft.

An :class:`AcceleratorConfig` holds only the independent knobs (GEMM shape, data widths, buffer sizes,
memory bus, clock, queue depths). Everything else (buffer depths in rows, instruction field widths, the
tensor intrinsic, the register map, the bitstream name, the content hash) is derived from it, so a
hardware researcher changes one number and the RTL, the ISA, the compiler and the runtime follow.

The config is frozen and validates itself on construction: a bad config never exists.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from weft.errors import ConfigError, read_input
from weft.isa.constants import INSN_BITS
from weft.isa.layout import IsaLayout

__all__ = [
    "PRESETS",
    "AcceleratorConfig",
    "ConfigError",
    "load_config",
]


_DATA_WIDTHS = (2, 4, 8, 16)
_ACC_WIDTHS = (16, 32)
_BUS_WIDTHS = (32, 64, 128, 256, 512)

# Knobs that shape the hardware; they (and only they) enter the content hash.
_HW_FIELDS = (
    "batch", "block_in", "block_out",
    "inp_width", "wgt_width", "acc_width", "out_width",
    "uop_buff_bytes", "inp_buff_bytes", "wgt_buff_bytes", "acc_buff_bytes", "out_buff_bytes",
    "bus_width", "clock_mhz", "cmd_queue_depth", "token_queue_depth",
)


def _is_pow2(value: int) -> bool:
    return isinstance(value, int) and value > 0 and (value & (value - 1)) == 0


def _bits_for(count: int) -> int:
    """Bits needed to index `count` distinct entries (at least 1)."""
    return max(1, math.ceil(math.log2(count))) if count > 1 else 1


#: Each data buffer's row: the config fields whose product is its lanes, then its element width. A row is one
#: vector (batch x block) of inputs, accumulators or outputs, or one block_out x block_in weight tile.
_ROW_SHAPE: dict[str, tuple[str, ...]] = {
    "inp": ("batch", "block_in", "inp_width"),
    "wgt": ("block_out", "block_in", "wgt_width"),
    "acc": ("batch", "block_out", "acc_width"),
    "out": ("batch", "block_out", "out_width"),
}


@dataclass(frozen=True)
class AcceleratorConfig:
    """One accelerator design point.

    Buffer sizes are in bytes, widths in bits. ``out_buff_bytes`` may be left as ``None``: the output
    buffer mirrors the accumulator buffer row for row (GEMM and ALU write ``out[dst]`` beside
    ``acc[dst]``), so its size follows from ``acc_buff_bytes`` and the widths.
    """

    name: str = "custom"
    batch: int = 1
    block_in: int = 16
    block_out: int = 16
    inp_width: int = 8
    wgt_width: int = 8
    acc_width: int = 32
    out_width: int = 8
    uop_buff_bytes: int = 32 * 1024
    inp_buff_bytes: int = 32 * 1024
    wgt_buff_bytes: int = 256 * 1024
    acc_buff_bytes: int = 128 * 1024
    out_buff_bytes: int | None = None
    bus_width: int = 64
    clock_mhz: float = 100.0
    cmd_queue_depth: int = 512
    token_queue_depth: int = 256
    #: Keys carried over from a foreign config format (VTA's TARGET, HW_VER...): kept, not interpreted.
    extras: tuple[tuple[str, Any], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        # bool is an int subclass: `"batch": true` would pass as 1 yet hash differently from 1
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("name", "extras") or (f.name == "out_buff_bytes" and value is None):
                continue
            allowed = (int, float) if f.name == "clock_mhz" else int
            if isinstance(value, bool) or not isinstance(value, allowed):
                raise ConfigError(f.name, f"must be a number, not {type(value).__name__} ({value!r})"
                                  if f.name == "clock_mhz" else f"must be an integer, got {value!r}")
        for name in ("batch", "block_in", "block_out"):
            value = getattr(self, name)
            if not _is_pow2(value):
                raise ConfigError(name, f"must be a power of two >= 1, got {value!r}")
        if self.block_in < 2 or self.block_out < 2:
            raise ConfigError("block_in" if self.block_in < 2 else "block_out", "must be at least 2")
        for name in ("inp_width", "wgt_width", "out_width"):
            value = getattr(self, name)
            if value not in _DATA_WIDTHS:
                raise ConfigError(name, f"must be one of {_DATA_WIDTHS} bits, got {value!r}")
        if self.acc_width not in _ACC_WIDTHS:
            raise ConfigError("acc_width", f"must be one of {_ACC_WIDTHS} bits, got {self.acc_width!r}")
        if self.inp_width + self.wgt_width > self.acc_width:
            raise ConfigError(
                "acc_width",
                f"{self.acc_width} bits cannot hold one product of inp_width={self.inp_width} "
                f"and wgt_width={self.wgt_width} bits",
            )
        if self.out_width > self.acc_width:
            raise ConfigError("out_width", f"{self.out_width} exceeds acc_width={self.acc_width}")
        if self.out_buff_bytes is None:
            object.__setattr__(self, "out_buff_bytes", self.acc_rows * self.out_row_bits // 8)
        for name, row_bits, what in (
            ("uop_buff_bytes", self.uop_bits, "micro-op"),
            ("inp_buff_bytes", self.inp_row_bits, "input tile (batch x block_in x inp_width)"),
            ("wgt_buff_bytes", self.wgt_row_bits, "weight tile (block_out x block_in x wgt_width)"),
            ("acc_buff_bytes", self.acc_row_bits, "accumulator tile (batch x block_out x acc_width)"),
            ("out_buff_bytes", self.out_row_bits, "output tile (batch x block_out x out_width)"),
        ):
            value = getattr(self, name)
            if row_bits % 8:
                raise ConfigError(
                    name.replace("_buff_bytes", "_width"),
                    f"one {what} is {row_bits} bits, not a whole number of bytes: DRAM addresses count rows",
                )
            if not _is_pow2(value):
                raise ConfigError(name, f"must be a power of two number of bytes, got {value!r}")
            if value * 8 < row_bits:
                raise ConfigError(
                    name, f"{value} bytes is smaller than one {what} of {row_bits // 8} bytes"
                )
        if self.out_rows != self.acc_rows:
            raise ConfigError(
                "out_buff_bytes",
                f"holds {self.out_rows} rows but the accumulator holds {self.acc_rows}: the output "
                "buffer mirrors the accumulator row for row",
            )
        if self.bus_width not in _BUS_WIDTHS:
            raise ConfigError("bus_width", f"must be one of {_BUS_WIDTHS} bits, got {self.bus_width!r}")
        if not (isinstance(self.clock_mhz, (int, float)) and 1 <= self.clock_mhz <= 1000):
            raise ConfigError("clock_mhz", f"must be within 1..1000 MHz, got {self.clock_mhz!r}")
        for name in ("cmd_queue_depth", "token_queue_depth"):
            value = getattr(self, name)
            if not _is_pow2(value) or value < 2:
                raise ConfigError(name, f"must be a power of two >= 2, got {value!r}")
        # Derived ISA fields must fit the instruction word: build the layout once to check.
        IsaLayout.check_fits(self)

    # ---- rows and element sizes -------------------------------------------------------------------
    def row_bits(self, memory: str) -> int:
        """Bits of one row of an on-chip buffer ("uop", "inp", "wgt", "acc", "out")."""
        if memory == "uop":
            return self.uop_bits
        *lanes, width = _ROW_SHAPE[memory]
        return math.prod(getattr(self, name) for name in lanes) * getattr(self, width)

    def rows(self, memory: str) -> int:
        """Rows of an on-chip buffer ("uop", "inp", "wgt", "acc", "out")."""
        size = getattr(self, f"{memory}_buff_bytes")
        assert size is not None  # out_buff_bytes is filled in by __post_init__
        return size * 8 // self.row_bits(memory)

    inp_row_bits = property(lambda self: self.row_bits("inp"), doc="Bits of an input row.")
    wgt_row_bits = property(lambda self: self.row_bits("wgt"), doc="Bits of a weight row (one tile).")
    acc_row_bits = property(lambda self: self.row_bits("acc"), doc="Bits of an accumulator row.")
    out_row_bits = property(lambda self: self.row_bits("out"), doc="Bits of an output row.")

    inp_rows = property(lambda self: self.rows("inp"), doc="Rows of the input buffer.")
    wgt_rows = property(lambda self: self.rows("wgt"), doc="Rows of the weight buffer.")
    acc_rows = property(lambda self: self.rows("acc"), doc="Rows of the accumulator buffer.")
    out_rows = property(lambda self: self.rows("out"), doc="Rows of the output buffer.")
    uop_rows = property(lambda self: self.rows("uop"), doc="Micro-ops the uop buffer holds.")

    # ---- index widths -----------------------------------------------------------------------------
    def index_bits(self, memory: str) -> int:
        """Bits of an address into an on-chip buffer ("uop", "inp", "wgt", "acc", "out")."""
        return _bits_for(self.rows(memory))

    inp_index_bits = property(lambda self: self.index_bits("inp"), doc="Bits of an input buffer address.")
    wgt_index_bits = property(lambda self: self.index_bits("wgt"), doc="Bits of a weight buffer address.")
    acc_index_bits = property(lambda self: self.index_bits("acc"), doc="Bits of an accumulator buffer address.")
    uop_index_bits = property(lambda self: self.index_bits("uop"), doc="Bits of a uop buffer address.")

    @property
    def uop_field_bits(self) -> tuple[int, int, int]:
        """(dst, src, wgt) field widths of a micro-op: dst indexes acc, src inp (GEMM) or acc (ALU)."""
        # the data buffers' depths do not depend on the micro-op width, so this does not recurse via uop_rows
        acc, inp, wgt = (self.index_bits(memory) for memory in ("acc", "inp", "wgt"))
        return acc, max(acc, inp), wgt

    @property
    def uop_bits(self) -> int:
        """Micro-op word width in DRAM and in the uop buffer: 32 bits, or 64 when the fields need it."""
        return 32 if sum(self.uop_field_bits) <= 32 else 64

    # ---- performance figures ----------------------------------------------------------------------
    @property
    def macs_per_cycle(self) -> int:
        return self.batch * self.block_in * self.block_out

    @property
    def peak_gops(self) -> float:
        """Peak throughput in GOP/s, counting a MAC as two operations."""
        return 2 * self.macs_per_cycle * self.clock_mhz / 1000.0

    # ---- identity ---------------------------------------------------------------------------------
    def hw_dict(self) -> dict[str, Any]:
        """The knobs that determine the hardware, in a fixed order."""
        return {name: getattr(self, name) for name in _HW_FIELDS}

    @cached_property
    def hash(self) -> str:
        """Stable content hash (16 hex digits) of the hardware knobs; the name and extras do not count."""
        canonical = json.dumps(self.hw_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def bitstream_name(self) -> str:
        """VTA-style design name, extended with the output width, bus, clock and hash."""
        log = lambda v: int(math.log2(v))  # noqa: E731
        return (
            f"{self.batch}x{self.block_in}x{self.block_out}"
            f"_i{self.inp_width}w{self.wgt_width}a{self.acc_width}o{self.out_width}"
            f"_{log(self.uop_buff_bytes)}_{log(self.inp_buff_bytes)}_{log(self.wgt_buff_bytes)}"
            f"_{log(self.acc_buff_bytes)}_b{self.bus_width}_{self.clock_mhz:g}mhz_{self.hash[:8]}"
        )

    def with_fields(self, changes: Mapping[str, Any]) -> AcceleratorConfig:
        """:meth:`replace` for fields named by a user (a file, ``--set``): an unknown name is a ConfigError."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ConfigError(unknown[0], f"unknown config field (known: {', '.join(sorted(known))})")
        return self.replace(**changes)

    def replace(self, **changes: Any) -> AcceleratorConfig:
        """A new config with some knobs changed (validated like any other)."""
        if "acc_buff_bytes" in changes or "acc_width" in changes or "out_width" in changes \
                or "batch" in changes or "block_out" in changes:
            changes.setdefault("out_buff_bytes", None)
        return dataclasses.replace(self, **changes)

    # ---- serialization ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The knobs as JSON-ready data; :meth:`from_dict` reads it back."""
        data: dict[str, Any] = {"name": self.name, **self.hw_dict()}
        if self.extras:
            data["extras"] = dict(self.extras)
        return data

    def describe(self) -> dict[str, Any]:  # keys beside "config": DESCRIBED
        """The resolved config with its hash and every derived value (what `weft config` prints)."""
        layout = IsaLayout(self)
        return {
            "config": self.to_dict(),
            "hash": self.hash,
            "bitstream_name": self.bitstream_name,
            "derived": {
                "rows": {
                    "uop": self.uop_rows, "inp": self.inp_rows, "wgt": self.wgt_rows,
                    "acc": self.acc_rows, "out": self.out_rows,
                },
                "row_bits": {
                    "uop": self.uop_bits, "inp": self.inp_row_bits, "wgt": self.wgt_row_bits,
                    "acc": self.acc_row_bits, "out": self.out_row_bits,
                },
                "index_bits": {
                    "uop": self.uop_index_bits, "inp": self.inp_index_bits,
                    "wgt": self.wgt_index_bits, "acc": self.acc_index_bits,
                },
                "insn_bits": INSN_BITS,
                "insn_used_bits": {name: fmt.used_bits for name, fmt in layout.formats.items()},
                "uop_bits": self.uop_bits,
                "macs_per_cycle": self.macs_per_cycle,
                "peak_gops": self.peak_gops,
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AcceleratorConfig:
        """Read a config from weft's own JSON form, from what `weft config` prints, or from VTA's
        `vta_config.json` form.

        weft's form is the fields to set; ``"base": PRESET`` names the preset the other fields start from
        (``default`` when absent). `weft config`'s output (``{"config": {...}, "hash": ..., "derived":
        ...}``) loads as its ``config`` part: the hash and derived values are recomputed, never read.
        """
        if any(key.startswith("LOG_") for key in data):
            return cls.from_vta(data)
        if isinstance(data.get("config"), Mapping):
            extra = sorted(set(data) - {"config", *DESCRIBED})
            if extra:
                raise ConfigError(extra[0], f"unknown key beside 'config' (known: {', '.join(DESCRIBED)})")
            return cls.from_dict(data["config"])
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known - {"base"})
        if unknown:
            raise ConfigError(unknown[0], f"unknown config field (known: base, {', '.join(sorted(known))})")
        kwargs = dict(data)
        base = kwargs.pop("base", None)
        if "extras" in kwargs:
            kwargs["extras"] = tuple(sorted(dict(kwargs["extras"]).items()))
        if base is None:
            return cls(**kwargs)
        if not isinstance(base, str) or base not in PRESETS:
            raise ConfigError("base", f"{base!r} is not a preset (presets: {', '.join(PRESETS)})")
        return PRESETS[base].with_fields(kwargs)

    @classmethod
    def from_vta(cls, data: Mapping[str, Any], name: str | None = None) -> AcceleratorConfig:
        """Load VTA's `vta_config.json` content as-is (LOG_* keys; TARGET, HW_VER... kept as extras)."""
        required = (
            "LOG_INP_WIDTH", "LOG_WGT_WIDTH", "LOG_ACC_WIDTH", "LOG_BATCH", "LOG_BLOCK",
            "LOG_UOP_BUFF_SIZE", "LOG_INP_BUFF_SIZE", "LOG_WGT_BUFF_SIZE", "LOG_ACC_BUFF_SIZE",
        )
        for key in required:
            if key not in data:
                raise ConfigError(key, "missing from the VTA config")
            if isinstance(data[key], bool) or not isinstance(data[key], int) or data[key] < 0:
                raise ConfigError(key, f"must be a non-negative integer, got {data[key]!r}")
        target = str(data.get("TARGET", "sim"))
        # VTA keeps the bus width and clock per target in pkg_config.py; mirror that table.
        bus, clock = {"ultra96": (128, 333.0), "zcu104": (128, 333.0)}.get(target, (64, 100.0))
        block_in = 1 << data.get("LOG_BLOCK_IN", data["LOG_BLOCK"])
        block_out = 1 << data.get("LOG_BLOCK_OUT", data["LOG_BLOCK"])
        extras = tuple(sorted((k, v) for k, v in data.items() if k not in required))
        return cls(
            name=name or f"vta-{target}",
            batch=1 << data["LOG_BATCH"],
            block_in=block_in,
            block_out=block_out,
            inp_width=1 << data["LOG_INP_WIDTH"],
            wgt_width=1 << data["LOG_WGT_WIDTH"],
            acc_width=1 << data["LOG_ACC_WIDTH"],
            out_width=1 << data.get("LOG_OUT_WIDTH", data["LOG_INP_WIDTH"]),
            uop_buff_bytes=1 << data["LOG_UOP_BUFF_SIZE"],
            inp_buff_bytes=1 << data["LOG_INP_BUFF_SIZE"],
            wgt_buff_bytes=1 << data["LOG_WGT_BUFF_SIZE"],
            acc_buff_bytes=1 << data["LOG_ACC_BUFF_SIZE"],
            bus_width=bus,
            clock_mhz=clock,
            extras=extras,
        )


#: What :meth:`AcceleratorConfig.describe` adds beside the config itself (recomputed when loaded back).
DESCRIBED = ("hash", "bitstream_name", "derived")

#: Named design points.
PRESETS: dict[str, AcceleratorConfig] = {
    # VTA's PYNQ design: the Pynq-Z1/Z2 class (xc7z020), 1x16x16 int8, 64-bit HP port at 100 MHz.
    "default": AcceleratorConfig(name="default"),
    # Small enough for fast RTL simulation; still exercises every unit and sub-bus-width rows.
    "tiny": AcceleratorConfig(
        name="tiny", batch=1, block_in=4, block_out=4,
        uop_buff_bytes=1024, inp_buff_bytes=1024, wgt_buff_bytes=1024, acc_buff_bytes=4096,
        bus_width=64, clock_mhz=100.0, cmd_queue_depth=16, token_queue_depth=16,
    ),
    # Non-square GEMM with batch 2 and a narrower 32-bit bus: the odd shapes the compiler must handle.
    "rect": AcceleratorConfig(
        name="rect", batch=2, block_in=8, block_out=4,
        uop_buff_bytes=2048, inp_buff_bytes=4096, wgt_buff_bytes=4096, acc_buff_bytes=8192,
        bus_width=32, clock_mhz=100.0, cmd_queue_depth=32, token_queue_depth=16,
    ),
    # UltraScale+ class (ZCU104, Kria KV260): 1x32x32 on a 128-bit bus with larger buffers.
    "zcu104": AcceleratorConfig(
        name="zcu104", batch=1, block_in=32, block_out=32,
        uop_buff_bytes=32 * 1024, inp_buff_bytes=64 * 1024, wgt_buff_bytes=512 * 1024,
        acc_buff_bytes=256 * 1024, bus_width=128, clock_mhz=250.0,
    ),
    # The default design with half the weight buffer: 87.5 BRAM36 under Yosys synth_xilinx against default's
    # 116, for an xc7z020 (140) that must hold other block-RAM users beside the accelerator; it costs ResNet-18
    # about 0.01% of its cycles.
    "pynq": AcceleratorConfig(name="pynq", wgt_buff_bytes=128 * 1024),
    # The default design with int4 weights: as many weight rows in half the BRAM.
    "int4w": AcceleratorConfig(name="int4w", wgt_width=4, wgt_buff_bytes=128 * 1024),
}


def load_config(spec: str | Path | AcceleratorConfig | Mapping[str, Any] | None = None) -> AcceleratorConfig:
    """Resolve a preset name, a JSON file path (weft or VTA format), a dict, or a config."""
    if spec is None:
        return PRESETS["default"]
    if isinstance(spec, AcceleratorConfig):
        return spec
    if isinstance(spec, Mapping):
        return AcceleratorConfig.from_dict(spec)
    text = str(spec)
    if text in PRESETS:
        return PRESETS[text]
    path = Path(text)
    if not path.is_file():
        raise ConfigError(
            "config", f"'{text}' is neither a preset ({', '.join(PRESETS)}) nor a readable JSON file"
        )
    try:
        data = json.loads(read_input(path, "config file"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError("config", f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path}: expected a JSON object")
    if any(key.startswith("LOG_") for key in data):
        return AcceleratorConfig.from_vta(data, name=path.stem)
    if "config" not in data:  # `weft config` output names its config; a file of fields is named after itself
        data.setdefault("name", path.stem)
    return AcceleratorConfig.from_dict(data)
