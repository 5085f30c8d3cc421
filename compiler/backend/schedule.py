"""Schedules of accelerator layers: the knobs, the search space, and the default choice.

A :class:`Schedule` says how a layer is cut into tiles that fit the config's buffers and how the tiles are
ordered and spread over virtual threads:

* ``tile_n``, ``tile_h``, ``tile_w``: batch blocks, output rows and output columns per tile (divisors of
  the layer's, so every tile has one shape and one micro-op kernel);
* ``tile_oc``: output channel blocks per tile; ``tile_ic``: input channel blocks per reduction step
  (convolutions; a layer whose inputs do not fit at once accumulates over several steps);
* ``order``: ``"oc_outer"`` walks all pixel tiles of one output-channel tile before the next (weights stay
  in SRAM), ``"pix_outer"`` walks the channel tiles of one pixel tile first (inputs stay);
* ``vthreads``: virtual threads; consecutive tiles alternate between them and each owns a slice of every
  buffer, so one thread's loads overlap the other's GEMMs (1 turns latency hiding off).

Channel blocks count the packed activation block ``max(block_in, block_out)``. Schedules are frozen and
JSON-serializable (:meth:`Schedule.to_dict`), :func:`space` enumerates every legal one for a layer (what
a tuner searches) and :func:`default_schedule` picks the one an analytic cost model likes best.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["ORDERS", "LayerGeom", "Schedule", "Usage", "cost", "default_schedule", "ranked", "space", "usage"]

ORDERS = ("oc_outer", "pix_outer")
KINDS = ("conv", "maxpool", "avgpool", "eltwise")


@dataclass(frozen=True)
class LayerGeom:
    """What scheduling needs to know about an accelerator layer, in blocks and rows."""

    name: str
    kind: str  # conv, maxpool, avgpool, eltwise
    nb: int  # batch blocks (N / config.batch)
    icb: int  # input channel blocks
    ocb: int  # output channel blocks
    ri: int  # GEMM input blocks per channel block (block / block_in)
    ro: int  # GEMM output blocks per channel block (block / block_out)
    h: int
    w: int
    ho: int
    wo: int
    kh: int = 1
    kw: int = 1
    sh: int = 1
    sw: int = 1
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    residual: bool = False
    vectors: int = 0  # per-channel vectors of the epilogue (acc rows per output block)
    alu_steps: int = 0  # ALU instructions of the epilogue

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"layer '{self.name}': unknown kind '{self.kind}'")


@dataclass(frozen=True)
class Schedule:
    tile_n: int = 1
    tile_h: int = 1
    tile_w: int = 1
    tile_oc: int = 1
    tile_ic: int = 1
    order: str = "oc_outer"
    vthreads: int = 2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schedule:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown schedule field '{unknown[0]}' (known: {', '.join(sorted(known))})")
        return cls(**dict(data))

    def without_latency_hiding(self) -> Schedule:
        return replace(self, vthreads=1)


@dataclass(frozen=True)
class Usage:
    """SRAM rows one thread needs, and what the layer moves and computes with a schedule."""

    inp: int
    wgt: int
    acc: int
    uops: int
    tasks: int
    stages: int
    gemm_execs: int
    alu_execs: int
    dram_bytes: int
    insns: int


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _window(t: int, stride: int, k: int) -> int:
    return (t - 1) * stride + k


def usage(g: LayerGeom, s: Schedule, config: AcceleratorConfig) -> Usage:
    """Rows per thread and traffic of layer `g` under schedule `s` (exact for SRAM rows; micro-ops as the
    folder will generate them, up to the few ALU kernels)."""
    c = config
    pix = s.tile_n * s.tile_h * s.tile_w
    tile_rows = pix * s.tile_oc * g.ro
    hin, win = _window(s.tile_h, g.sh, g.kh), _window(s.tile_w, g.sw, g.kw)
    n_tiles = (g.nb // s.tile_n) * (g.ho // s.tile_h) * (g.wo // s.tile_w)
    oc_tiles = g.ocb // s.tile_oc
    tasks = n_tiles * oc_tiles
    single = 1 if tile_rows == 1 else 0  # a spare row for one-row reductions
    vec_rows = g.vectors * s.tile_oc * g.ro
    acc = tile_rows * (2 if g.residual else 1) + vec_rows + single
    row_bytes = {"inp": c.inp_row_bits // 8, "wgt": c.wgt_row_bits // 8, "acc": c.acc_row_bits // 8,
                 "out": c.out_row_bits // 8}
    out_bytes = g.nb * g.ocb * g.ho * g.wo * g.ro * row_bytes["out"]
    alu_execs = tasks * tile_rows * (g.alu_steps + (1 if g.residual else 0))
    insns_per_task = g.alu_steps + 2 + s.tile_n * s.tile_oc + (2 if g.residual else 0)
    if g.kind == "conv":
        ic_steps = g.icb // s.tile_ic
        stages = tasks * ic_steps
        inp = s.tile_n * s.tile_ic * hin * win * g.ri
        wgt = s.tile_oc * g.ro * s.tile_ic * g.ri * g.kh * g.kw
        gemm_execs = stages * tile_rows * s.tile_ic * g.ri * g.kh * g.kw
        reuse_w = ic_steps == 1 and s.order == "oc_outer"
        reuse_i = ic_steps == 1 and s.order == "pix_outer"
        # Resident tiles are not reloaded: with V threads alternating, a thread sees every V-th task.
        w_loads = stages if not reuse_w else oc_tiles * min(s.vthreads, n_tiles)
        i_loads = stages if not reuse_i else n_tiles * min(s.vthreads, oc_tiles)
        dram = w_loads * wgt * row_bytes["wgt"] + i_loads * inp * row_bytes["inp"] + out_bytes
        uops = _gemm_uops(g, s) + 8
        insns = stages * (2 + s.tile_n * s.tile_ic) + tasks * insns_per_task
    else:
        stages, inp, wgt, gemm_execs = tasks, 0, 0, 0
        win_rows = s.tile_n * s.tile_oc * hin * win * g.ro if g.kind != "eltwise" else tile_rows
        acc += win_rows if g.kind != "eltwise" else 0
        alu_execs += tasks * tile_rows * g.kh * g.kw if g.kind != "eltwise" else 0
        dram = tasks * win_rows * row_bytes["out"] + out_bytes
        uops = (g.ro * (1 if g.kind == "eltwise" else g.kh * g.kw) + 8)
        insns = tasks * (insns_per_task + s.tile_n * s.tile_oc + 3)
    if g.residual:
        dram += out_bytes
    dram += tasks * vec_rows * row_bytes["acc"]
    return Usage(inp, wgt, acc, uops * s.vthreads, tasks, stages, gemm_execs, alu_execs, dram, insns)


def _gemm_uops(g: LayerGeom, s: Schedule) -> int:
    """Micro-ops of one GEMM kernel: all inner axes but the two largest (and one spatial axis kept)."""
    spatial = [e for e in (s.tile_n, s.tile_oc, g.ro, s.tile_h, s.tile_w) if e > 1]
    reduce_ = [e for e in (s.tile_ic, g.ri, g.kh, g.kw) if e > 1]
    if not spatial:
        return math.prod(reduce_)
    inner = min(spatial)
    rest = sorted([*reduce_, *spatial], reverse=True)
    rest.remove(inner)
    return math.prod(rest[2:]) * inner


def fits(g: LayerGeom, s: Schedule, config: AcceleratorConfig) -> bool:
    c, v = config, s.vthreads
    u = usage(g, s, config)
    return (u.inp <= c.inp_rows // v and u.wgt <= c.wgt_rows // v and u.acc <= c.acc_rows // v
            and u.uops <= c.uop_rows)


def space(g: LayerGeom, config: AcceleratorConfig, vthreads: tuple[int, ...] = (2, 1)) -> Iterator[Schedule]:
    """Every legal schedule of layer `g` on `config` (tile sizes divide the layer; buffers fit)."""
    ic_choices = divisors(g.icb) if g.kind == "conv" else [None]
    orders = ORDERS if g.kind == "conv" else ("pix_outer",)
    for v in vthreads:
        for tn in divisors(g.nb):
            for th in divisors(g.ho):
                for tw in divisors(g.wo):
                    for toc in divisors(g.ocb):
                        for tic in ic_choices:
                            for order in orders:
                                s = Schedule(tn, th, tw, toc, toc if tic is None else tic, order, v)
                                if fits(g, s, config):
                                    yield s


#: Cycles the cost model charges per instruction (dispatch, DMA setup, pipeline fill).
INSN_CYCLES = 24


def cost(g: LayerGeom, s: Schedule, config: AcceleratorConfig) -> float:
    """Estimated cycles: GEMM and ALU executions, DRAM bytes over the bus, per-instruction overhead;
    with two or more threads, loads, compute and stores overlap (the slowest one dominates)."""
    u = usage(g, s, config)
    compute = u.gemm_execs + 2 * u.alu_execs
    memory = u.dram_bytes / (config.bus_width / 8)
    overhead = INSN_CYCLES * u.insns
    if s.vthreads > 1:
        return max(compute, memory) + (compute + memory) / max(u.tasks, 1) + overhead
    return compute + memory + overhead


def ranked(g: LayerGeom, config: AcceleratorConfig, vthreads: int = 2) -> list[Schedule]:
    """Legal schedules with `vthreads` threads (falling back to one when none fits), best first."""
    candidates = list(space(g, config, (vthreads,)))
    if not candidates and vthreads > 1:
        candidates = list(space(g, config, (1,)))
    if not candidates:
        raise ValueError(f"layer '{g.name}': no tiling fits the buffers of config '{config.name}' "
                         f"(inp {config.inp_rows}, wgt {config.wgt_rows}, acc {config.acc_rows}, "
                         f"uop {config.uop_rows} rows)")
    return sorted(candidates, key=lambda s: (cost(g, s, config), -s.tile_h * s.tile_w * s.tile_oc))


def default_schedule(g: LayerGeom, config: AcceleratorConfig) -> Schedule:
    """The cost model's favourite schedule with two virtual threads (one if two cannot fit)."""
    return ranked(g, config)[0]
