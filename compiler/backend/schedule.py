"""Schedules of accelerator layers: the knobs, the search space, and the default choice.

A :class:`Schedule` says how a layer is cut into tiles that fit the config's buffers and how the tiles are
ordered and spread over virtual threads:

* ``tile_n``, ``tile_h``, ``tile_w``: batch blocks, output rows and output columns per tile (divisors of
  the layer's, so every tile has one shape and one micro-op kernel);
* ``tile_oc``: output channel blocks per tile; ``tile_ic``: input channel blocks per reduction step
  (convolutions; a layer whose inputs do not fit at once accumulates over several steps); ``tile_kh``:
  kernel rows per reduction step (None: the whole kernel), so that large kernels stream their weights;
* ``order``: ``"oc_outer"`` walks all pixel tiles of one output-channel tile before the next (weights stay
  in SRAM), ``"pix_outer"`` walks the channel tiles of one pixel tile first (inputs stay);
* ``vthreads``: virtual threads; consecutive tiles alternate between them and each owns a slice of every
  buffer, so one thread's loads overlap the other's GEMMs (1 turns latency hiding off).

Channel blocks count the packed activation block ``max(block_in, block_out)``. Schedules are frozen and
JSON-serializable (:meth:`Schedule.to_dict`), :func:`space` enumerates every legal one for a layer (what
a tuner searches) and :func:`default_schedule` picks the one an analytic cost model likes best.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from weft.core.float_ops import conv_out_size
from weft.hw.structure import ALU_SRC_INTERVAL, SRC_ROWS, UNPACK_DEPTH
from weft.isa.encoding import layout_of
from weft.isa.semantics import named_row_bytes
from weft.sim.dram_timing import DramTiming

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["ORDERS", "LayerGeom", "Schedule", "Usage", "copies_by_gemm", "cost", "default_schedule",
           "every_other_row", "pool_reads_inp", "pool_slots", "pools_offset", "ranked", "separable", "shared_tiles",
           "space", "usage", "vector_chunks", "windows_all_real"]

ORDERS = ("oc_outer", "pix_outer")
KINDS = ("conv", "maxpool", "avgpool", "eltwise")


@dataclass(frozen=True)
class LayerGeom:
    """What scheduling needs to know about an accelerator layer, in blocks and rows."""

    name: str
    kind: str  # conv, maxpool, avgpool, eltwise
    nb: int  # batch blocks (N / config.batch)
    icb: int  # input channel blocks (of one super-group: the blocks each output block reduces over)
    ocb: int  # output channel blocks (of one super-group)
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
    #: Super-groups of a grouped convolution (weft.compiler.groups): independent convolutions side by side,
    #: each reading its own icb input blocks and writing its own ocb output blocks.
    groups: int = 1
    #: The residual is added by a GEMM with the scaled identity (weft.compiler.backend.alu.residual_scale)
    #: where it comes in by the load unit: no accumulator rows and no ALU add for it.
    residual_gemm: bool = False
    #: The input is proven >= 0 (the layer making it ends in a ReLU-like clamp): a max-pool's zero padding
    #: can then never win a window that holds a real element.
    input_nonnegative: bool = False
    #: (kernel, stride, pad) of a max-pool fused into a convolution (weft.compiler.pool_fusion): ho and wo
    #: are the convolution's own; the layer writes the pooled tensor (:attr:`pooled_hw`).
    pool: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"layer '{self.name}': unknown kind '{self.kind}'")
        object.__setattr__(self, "pool", tuple(int(x) for x in self.pool))

    @property
    def pooled_hw(self) -> tuple[int, int]:
        """Height and width of the pooled output (of the convolution's where nothing is fused)."""
        if not self.pool:
            return self.ho, self.wo
        k, s, p = self.pool
        return conv_out_size(self.ho, k, s, p, p), conv_out_size(self.wo, k, s, p, p)


@dataclass(frozen=True)
class Schedule:
    tile_n: int = 1
    tile_h: int = 1
    tile_w: int = 1
    tile_oc: int = 1
    tile_ic: int = 1
    order: str = "oc_outer"
    vthreads: int = 2
    tile_kh: int | None = None

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
    """SRAM rows one thread needs, and what each unit does for the layer under a schedule."""

    inp: int
    wgt: int
    acc: int
    uops: int
    tasks: int
    stages: int
    gemm_execs: int
    alu_execs: int
    #: DRAM bytes and instructions of the load unit (inp, wgt), the compute unit's own loads (acc rows:
    #: vectors, residuals, pooling windows) and the store unit.
    load_bytes: int
    load_insns: int
    acc_bytes: int
    compute_insns: int
    store_bytes: int
    store_insns: int
    #: The residual tile or pooling window comes in through the load unit and the identity GEMM
    #: (:func:`copies_by_gemm`, and its rows fit beside the thread's other tiles).
    copies: bool = False
    #: DRAM rows (separate read requests) of the load unit's input windows.
    input_rows: int = 0

    @property
    def dram_bytes(self) -> int:
        return self.load_bytes + self.acc_bytes + self.store_bytes

    @property
    def insns(self) -> int:
        return self.load_insns + self.compute_insns + self.store_insns


def copies_by_gemm(g: LayerGeom, config: AcceleratorConfig) -> bool:
    """Whether the int8 tiles the compute unit would load itself (a convolution's residual tile, a pooling
    window: acc_narrow rows, at the bus's rate, while nothing else runs on it) come in through the load
    unit instead, as inp rows beside the other tiles, and an identity GEMM copies them into the
    accumulator: the load then overlaps the other thread's work and the compute unit spends two passes
    over the rows (reset, copy). An inp row must hold exactly one out row (the back end already requires
    inp_width == out_width). A schedule uses the copy where its rows fit (:attr:`Usage.copies`)."""
    wanted = g.residual if g.kind == "conv" else g.kind in ("maxpool", "avgpool")
    return wanted and config.block_in == config.block_out


def windows_all_real(size: int, out: int, kernel: int, stride: int, pad_before: int) -> bool:
    """True when every window of one axis holds at least one element of the input."""
    return all(o * stride - pad_before + kernel > 0 and o * stride - pad_before < size for o in range(out))


def pools_offset(g: LayerGeom) -> bool:
    """Whether a max-pool runs in an offset domain (:class:`~weft.compiler.backend.pool.PoolLowering`): the
    DMA pads with zeros, which must never win, so unless the input is proven >= 0 and every window holds a
    real element, the window's real rows are shifted up first."""
    if g.kind != "maxpool":
        return False
    real = windows_all_real(g.h, g.ho, g.kh, g.sh, g.pads[0]) and windows_all_real(g.w, g.wo, g.kw, g.sw, g.pads[1])
    return not (real and g.input_nonnegative)


def pool_reads_inp(g: LayerGeom, s: Schedule, config: AcceleratorConfig) -> bool:
    """Whether a pooling layer whose window comes through the load unit (:func:`copies_by_gemm`) pools
    straight from the inp rows (ALU operands from inp: its own read port, one execution a cycle) instead of
    from an accumulator copy (a GEMM pass, then two cycles an execution through the accumulator's one read
    port): where it needs no offset domain, its tile has several rows (a one-row tile alternates with a spare
    row) and inp rows fit the ALU's source fields."""
    rows = s.tile_n * s.tile_h * s.tile_w * s.tile_oc * g.ro
    layout = layout_of(config)
    src_bits = min(layout.formats["alu"].field("src_factor_out").width, layout.uop.field("src").width)
    return (g.kind in ("maxpool", "avgpool") and copies_by_gemm(g, config) and not pools_offset(g) and rows > 1
            and config.inp_index_bits <= src_bits)


def every_other_row(g: LayerGeom) -> bool:
    """Whether a convolution with one kernel row, a row stride and no top or bottom padding (ResNet's
    downsampling shortcuts) reads only the input rows it uses: its window is a view of every `sh`-th row
    (a longer DMA stride), ``sh`` times smaller than the dense window of the same output rows."""
    return g.kind == "conv" and g.kh == 1 and g.sh > 1 and g.pads[0] == g.pads[2] == 0


def separable(g: LayerGeom, s: Schedule) -> bool:
    """Whether a max-pool reduces each window row first, in place (``kw - 1`` ALU passes over the window's
    rows and the tile's columns), then the rows into the tile (``kh`` passes), instead of ``kh * kw``
    passes over the tile: where the windows overlap by at most one column (``kw <= sw + 1``, ``sw >= 2``:
    a column a neighbour's passes change is read before they do) and it takes fewer executions."""
    if g.kind != "maxpool" or g.sw < 2 or not 2 <= g.kw <= g.sw + 1 or s.tile_h * s.tile_w * s.tile_n * s.tile_oc == 1:
        return False
    hin = _window(s.tile_h, g.sh, g.kh)
    return (g.kw - 1) * hin * s.tile_w + g.kh * s.tile_h * s.tile_w < g.kh * g.kw * s.tile_h * s.tile_w


def shared_tiles(g: LayerGeom, s: Schedule) -> tuple[bool, bool]:
    """Whether every task of a convolution reads the same input window (one pixel tile) and the same
    weights (one output-channel tile), each in one reduction step: such a tile is loaded once, into the
    first thread's slice, and both threads read it, instead of each thread loading its own copy (the
    second copy would hold up the other thread's first GEMM, and the load unit)."""
    if g.kind != "conv" or (g.icb // s.tile_ic) * (g.kh // kernel_rows(g, s)) != 1:
        return False, False
    pixel_tiles = (g.nb // s.tile_n) * (g.ho // s.tile_h) * (g.wo // s.tile_w)
    return pixel_tiles == 1 and g.groups == 1, g.ocb // s.tile_oc * g.groups == 1


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _window(t: int, stride: int, k: int) -> int:
    return (t - 1) * stride + k


def usage(g: LayerGeom, s: Schedule, config: AcceleratorConfig) -> Usage:
    """Rows per thread and work per unit of layer `g` under schedule `s` (exact for SRAM rows and
    executions; micro-ops, instructions and bytes as the lowering will emit them, up to DMA merging)."""
    c = config
    pix = s.tile_n * s.tile_h * s.tile_w
    tile_rows = pix * s.tile_oc * g.ro
    hin, win = _window(s.tile_h, g.sh, g.kh), _window(s.tile_w, g.sw, g.kw)
    n_tiles = (g.nb // s.tile_n) * (g.ho // s.tile_h) * (g.wo // s.tile_w)
    oc_tiles = g.ocb // s.tile_oc * g.groups
    tasks = n_tiles * oc_tiles
    single = 1 if tile_rows == 1 else 0  # a spare row for one-row reductions
    vec_rows = g.vectors * s.tile_oc * g.ro
    acc = tile_rows * (2 if g.residual else 1) + vec_rows + single
    rb = named_row_bytes(c)
    hp, wp = g.pooled_hw
    out_bytes = g.nb * g.ocb * g.groups * hp * wp * g.ro * rb["out"]
    planes = s.tile_n * s.tile_oc  # one 2-D transfer per output plane (fewer when they merge)
    alu_execs = tasks * tile_rows * (g.alu_steps + (1 if g.residual else 0))
    # Vectors are reloaded when a thread's output-channel tile changes.
    vec_loads = oc_tiles * min(s.vthreads, n_tiles) if s.order == "oc_outer" else tasks
    inp_max, wgt_max = c.inp_rows // s.vthreads, c.wgt_rows // s.vthreads
    by_gemm = copies_by_gemm(g, config)
    acc_bytes = 0  # the compute unit's own loads beyond the vectors and the residual
    compute_insns = tasks * (g.alu_steps + (1 if g.residual else 0) + (planes if g.residual else 0)) + vec_loads
    # A vector step over more GEMM output blocks than the compute unit holds: more instructions, or rereads.
    blocks, reps = s.tile_oc * g.ro, pix
    if g.vectors and blocks > SRC_ROWS:
        chunks = vector_chunks(blocks, reps)
        compute_insns += tasks * g.vectors * (chunks - 1 if chunks else 0)
        alu_execs += tasks * g.vectors * (blocks - chunks if chunks else blocks * reps - 1)
    store_insns = tasks * planes
    if g.pool:  # the pooled rows of a thread's last pool_slots rows, and the ALU passes that pool them
        acc += pool_slots(g, s) * wp * s.tile_oc * g.ro
        k = g.pool[0]
        alu_execs += tasks * s.tile_oc * g.ro * k * wp * (1 + 1 / g.pool[1])
        compute_insns += tasks * 2 * k
        store_insns = g.nb * hp * oc_tiles * planes
    if g.kind == "conv":
        kh = kernel_rows(g, s)
        steps = (g.icb // s.tile_ic) * (g.kh // kh)
        stages = tasks * steps
        hin = s.tile_h if every_other_row(g) else _window(s.tile_h, g.sh, kh)
        inp = s.tile_n * s.tile_ic * hin * win * g.ri
        wgt = s.tile_oc * g.ro * s.tile_ic * g.ri * kh * g.kw
        gemm_execs = stages * tile_rows * s.tile_ic * g.ri * kh * g.kw
        reuse_w = steps == 1 and s.order == "oc_outer"
        reuse_i = steps == 1 and s.order == "pix_outer"
        # Resident tiles are not reloaded: with V threads alternating, a thread sees every V-th task.
        w_loads = stages if not reuse_w else oc_tiles * min(s.vthreads, n_tiles)
        # (each super-group reads its own input blocks)
        i_loads = stages if not reuse_i else n_tiles * g.groups * min(s.vthreads, oc_tiles // g.groups)
        share_i, share_w = shared_tiles(g, s)
        i_loads, w_loads = (1 if share_i else i_loads), (1 if share_w else w_loads)
        load_bytes = w_loads * wgt * rb["wgt"] + i_loads * inp * rb["inp"]
        load_insns = w_loads + i_loads * s.tile_n * s.tile_ic
        # A window of whole image rows is one run of DRAM rows; otherwise each of its rows is a request.
        contiguous = win == g.w and not every_other_row(g)
        input_rows = i_loads * s.tile_n * s.tile_ic * (1 if contiguous else hin)
        compute_insns += stages + tasks  # a GEMM per stage, a reset per task
        uops = _gemm_uops(g, s) + 8
        by_gemm = by_gemm and inp + tile_rows <= inp_max and wgt + 1 <= wgt_max
        if by_gemm:  # the residual tile and the identity matrix beside the tiles; the copy runs on the GEMM
            inp += tile_rows
            wgt += 1
            load_bytes += out_bytes
            load_insns += tasks * planes + s.vthreads
            gemm_execs += tasks * tile_rows
            if g.residual_gemm:  # one GEMM adds it to the tile: no residual rows, no reset, no ALU add
                acc -= tile_rows
                alu_execs -= tasks * tile_rows
                compute_insns += tasks * (1 - planes)
            else:
                compute_insns += tasks * (2 - planes)
                alu_execs += tasks * tile_rows  # the reset of the residual rows: a pass like an ALU step's
    else:
        stages, inp, wgt, gemm_execs, load_bytes, load_insns, input_rows = tasks, 0, 0, 0, 0, 0, 0
        win_rows = s.tile_n * s.tile_oc * hin * win * g.ro if g.kind != "eltwise" else tile_rows
        if pool_reads_inp(g, s, c) and win_rows <= inp_max:
            # The window into inp rows; the ALU sets the tile to its first tap and pools the others from there.
            return Usage(win_rows, 0, acc, (g.ro * g.kh * g.kw + 8) * s.vthreads, tasks, tasks, 0,
                         alu_execs + tasks * tile_rows * g.kh * g.kw, tasks * win_rows * rb["inp"], tasks * planes,
                         vec_loads * vec_rows * rb["acc"], compute_insns + tasks * (planes + 3), out_bytes,
                         store_insns, True, 0)
        acc += win_rows if g.kind != "eltwise" else 0
        if separable(g, s):
            alu_execs += tasks * s.tile_n * s.tile_oc * g.ro * ((g.kw - 1) * hin * s.tile_w + g.kh * pix // s.tile_n)
        elif g.kind != "eltwise":
            alu_execs += tasks * tile_rows * g.kh * g.kw
        if pools_offset(g):
            alu_execs += tasks * (win_rows + tile_rows)  # the offset into and out of the padded domain
        by_gemm = by_gemm and win_rows <= inp_max and 1 <= wgt_max
        if by_gemm:  # the window through the load unit, then reset and copied by the GEMM
            inp, wgt = win_rows, 1
            load_bytes = tasks * win_rows * rb["inp"]
            load_insns = tasks * planes + s.vthreads
            gemm_execs = tasks * win_rows
            alu_execs += tasks * win_rows
        else:
            acc_bytes += tasks * win_rows * rb["out"]
        compute_insns += tasks * (planes + (4 if g.kind != "eltwise" else 0))
        uops = (g.ro * (1 if g.kind == "eltwise" else g.kh * g.kw) + 8)
    acc_bytes = vec_loads * vec_rows * rb["acc"] + (out_bytes if g.residual and not by_gemm else 0) + acc_bytes
    return Usage(inp, wgt, acc, uops * s.vthreads, tasks, stages, gemm_execs, alu_execs, load_bytes, load_insns,
                 acc_bytes, compute_insns, out_bytes, store_insns, by_gemm, input_rows)


def pool_slots(g: LayerGeom, s: Schedule) -> int:
    """Pooled rows a thread keeps for a fused max-pool: its own rows of a window (the latest of the other
    thread's is the window's other row with two threads; one thread keeps a whole window's)."""
    return 2 if s.vthreads == 2 else g.pool[0]


def vector_chunks(blocks: int, reps: int) -> int:
    """Instructions an epilogue vector step over `blocks` vector rows, each applied to `reps` tile rows, takes:
    at most ``SRC_ROWS`` rows each, which the compute unit reads once and holds
    (:func:`~weft.hw.structure.holds_src_rows`), or 0 for one instruction over all of them, which rereads its
    vector row at every execution (``ALU_SRC_INTERVAL`` cycles each): whichever costs fewer cycles."""
    chunks = -(-blocks // SRC_ROWS)
    executions = blocks * reps
    held = chunks * LOOP_CYCLES + executions + blocks - chunks
    folded = LOOP_CYCLES + executions + (executions - 1) * (ALU_SRC_INTERVAL - 1)
    return chunks if chunks == 1 or held < folded else 0


def kernel_rows(g: LayerGeom, s: Schedule) -> int:
    """Kernel rows one reduction step covers."""
    return g.kh if s.tile_kh is None else s.tile_kh


def _gemm_uops(g: LayerGeom, s: Schedule) -> int:
    """Micro-ops of one GEMM kernel: all inner axes but the two largest (and one spatial axis kept)."""
    spatial = [e for e in (s.tile_n, s.tile_oc, g.ro, s.tile_h, s.tile_w) if e > 1]
    reduce_ = [e for e in (s.tile_ic, g.ri, kernel_rows(g, s), g.kw) if e > 1]
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
    conv = g.kind == "conv"
    ic_choices = divisors(g.icb) if conv else [None]
    kh_choices = [None, *[d for d in divisors(g.kh) if d < g.kh]] if conv else [None]
    orders = ORDERS if conv else ("pix_outer",)
    # A fused max-pool pools whole output rows, one a task, in order (schedule.pool_rows)
    heights, widths = ([1], [g.wo]) if g.pool else (divisors(g.ho), divisors(g.wo))
    tns = [1] if g.pool else divisors(g.nb)
    for v, tn, th, tw, toc, tic, tkh, order in itertools.product(
            vthreads, tns, heights, widths, divisors(g.ocb), ic_choices, kh_choices, orders):
        if g.pool and order != "oc_outer" and toc != g.ocb:
            continue
        s = Schedule(tn, th, tw, toc, toc if tic is None else tic, order, v, tkh)
        if fits(g, s, config):
            yield s


#: Cycles the cost model charges per instruction, beyond its data: a DMA waits for DRAM's first beat
#: (tens of cycles), a GEMM/ALU fills and drains its pipeline.
DMA_CYCLES = 40
LOOP_CYCLES = 16
#: Cycles per DRAM row a load requests: a load keeps UNPACK_DEPTH rows in flight (hw.dma's unpack queue)
#: against the board DRAM's read latency, so windows of many short rows are bound by requests, not bytes.
ROW_CYCLES = DramTiming.pynq_z1().read_latency / UNPACK_DEPTH
#: Share of bus cycles that move a beat on the board DRAM the cycles are counted with.
DUTY = DramTiming.pynq_z1().read_duty
#: Share of the other units' time that overlapping does not hide (a unit waits at stage boundaries).
OVERLAP_LOSS = 0.1


def cost(g: LayerGeom, s: Schedule, config: AcceleratorConfig) -> float:
    """Estimated cycles. Each unit's busy time: the load unit's and store unit's DRAM bytes over the bus,
    the compute unit's GEMM and ALU executions (one per cycle) plus its own acc loads, and a fixed cost
    per instruction. With two or more threads the units overlap at the granularity of stages (the
    slowest unit dominates, plus one stage of pipeline fill and a little of the others); with one they
    take turns. The constants were fitted against the timing model on ResNet-18's layers (the chosen
    schedules come within about 1% of the best of the top candidates)."""
    u = usage(g, s, config)
    per_cycle = config.bus_width / 8 * DUTY
    load = u.load_bytes / per_cycle + DMA_CYCLES * u.load_insns + ROW_CYCLES * u.input_rows
    compute = u.gemm_execs + u.alu_execs + u.acc_bytes / per_cycle + LOOP_CYCLES * u.compute_insns
    store = u.store_bytes / per_cycle + DMA_CYCLES * u.store_insns
    total = load + compute + store
    # Threads overlap by taking turns on tasks: a lone task's stages reuse one thread's buffer slice, so its
    # loads wait for its GEMMs whatever the thread count.
    if s.vthreads > 1 and u.tasks > 1:
        slowest = max(load, compute, store)
        return slowest + OVERLAP_LOSS * (total - slowest) + total / max(u.stages, 1)
    return total


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
