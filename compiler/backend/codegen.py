"""The back end's driver: a partitioned, packed graph -> one program per accelerator layer + a DRAM image.

For each accelerator node (in graph order): its geometry in blocks, its schedule (the default choice, or
one given per layer), its lowering (:mod:`conv` / :mod:`pool`) into a program, the micro-op loads and
FINISH, the dependency tokens (:mod:`vthread`), then the static checks (:mod:`check`): every stream's
token protocol and micro-op hazards are verified before anything is written. The result goes into the
artifact's ``accel`` section: the constant part of the DRAM image and, as JSON, where every value,
program and micro-op block lives, with each layer's schedule and static figures. A layer that no default
schedule lowers goes to the host (the partition's admission check catches most such layers earlier).

With batch > 1 and block_in != block_out, activations sit in DRAM in the row orders of
:mod:`weft.core.layout`: a value a layer writes (out rows) and a convolution reads (inp rows) has a second
buffer, which a relayout program (:func:`lower_relayout`, recorded under the producer's ``relayout``) fills
right after the producer's program.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.compiler.backend import alu, check, memory
from weft.compiler.backend.chain import chain_program, chain_runs, chain_stream, constants_may_go_first
from weft.compiler.backend.conv import ConvLowering
from weft.compiler.backend.pool import EltwiseLowering, PoolLowering
from weft.compiler.backend.program import Insn, Stream
from weft.compiler.backend.schedule import DUTY, LayerGeom, Schedule, copies_by_gemm, ranked, shared_tiles, usage
from weft.compiler.backend.te import tensorize
from weft.compiler.backend.tiles import Addresses, Lowering
from weft.compiler.backend.vthread import inject_sync, mark_beside
from weft.compiler.partition import send_to_host
from weft.compiler.pool_fusion import conv_hw, pool_of, unfuse_pool
from weft.core.artifact_schema import ACCEL_SECTION, ACCEL_VERSION
from weft.core.errors import CompileError
from weft.core.ir import ACCEL_OPS, Graph, Node
from weft.core.layout import act_block, dram_rows, pack_weights, reordered, row_order_refusal
from weft.errors import UsageError
from weft.isa.arith import rq_fields
from weft.isa.constants import INSN_BYTES
from weft.isa.encoding import EncodeError, encode_insns, encode_uops
from weft.isa.semantics import QUEUES
from weft.isa.spec import intrinsic
from weft.sim.timing import TimingError, TimingModel

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig
    from weft.core.artifact import Artifact

__all__ = ["BackendError", "generate", "layer_geometry", "lower_layer", "lower_relayout", "nonnegative_values",
           "place_values", "value_addr", "value_bytes"]

_KIND = {"qconv2d": "conv", "qmaxpool": "maxpool", "qavgpool": "avgpool", "qalu": "eltwise"}
_LOWERING: dict[str, type[Lowering]] = {"conv": ConvLowering, "maxpool": PoolLowering, "avgpool": PoolLowering,
                                       "eltwise": EltwiseLowering}


class BackendError(CompileError):
    """An accelerator layer the back end cannot lower for the config; names the node."""


def _steps(node: Node, config: AcceleratorConfig) -> tuple:
    """The node's epilogue as the ALU runs it (:func:`alu.simplify`: the same results in fewer passes)."""
    return alu.simplify(tuple(node.attrs.get("epilogue", ())), config)


def _count_alu(steps: tuple) -> int:
    return sum(_count_alu(op) + 1 if kind == "residual" else 1 for kind, op in steps)


def layer_geometry(node: Node, graph: Graph, config: AcceleratorConfig) -> LayerGeom:
    """The geometry of an accelerator node, or a BackendError saying why the config cannot run it."""
    c = config
    kind = _KIND.get(node.op)
    if kind is None:
        raise BackendError(f"the accelerator does not run {node.op}", node=node.name, op=node.op)
    x, y = graph.values[node.inputs[0]], graph.values[node.outputs[0]]
    gemm = intrinsic(c)["shape"]  # the rows the GEMM intrinsic reads and writes
    block = act_block(c)
    for value in (x, y):
        if not value.packed or value.shape[4:] != (gemm["batch"], block):  # type: ignore[index]
            raise BackendError(f"'{value.name}' is not in the packed layout of config '{c.name}'",
                               node=node.name, op=node.op)
    refusal = row_order_refusal(c)
    if refusal is not None:
        raise BackendError(f"config '{c.name}' has {refusal}", node=node.name, op=node.op)
    if c.inp_width != c.out_width:
        raise BackendError(f"config '{c.name}' reads activations with inp_width {c.inp_width} but writes "
                           f"them with out_width {c.out_width}", node=node.name, op=node.op)
    nb, icb, h, w = x.shape[:4]  # type: ignore[misc]
    _, ocb, ho, wo = y.shape[:4]  # type: ignore[misc]
    pool = pool_of(node) or ()
    if pool:  # the layer's tiles are the convolution's rows; it writes their pool (weft.compiler.pool_fusion)
        ho, wo = conv_hw(node)  # type: ignore[misc]
    steps = _steps(node, c)
    vectors = len(alu.vectors_of(steps))
    residual = any(kind_ == "residual" for kind_, _ in steps)
    common = dict(name=node.name, kind=kind, nb=nb, icb=icb, ocb=ocb, ri=block // gemm["block_in"],
                  ro=block // gemm["block_out"], h=h, w=w, ho=ho, wo=wo, residual=residual, vectors=vectors,
                  alu_steps=_count_alu(steps),
                  residual_gemm=kind == "conv" and residual and alu.residual_scale(steps, c) is not None)
    if kind == "eltwise":
        if (nb, icb, h, w) != (y.shape[0], ocb, ho, wo):  # type: ignore[index]
            raise BackendError("element-wise layers keep their shape", node=node.name, op=node.op)
        return LayerGeom(**common)
    kh, kw = node.attrs["kernel"]
    sh, sw = node.attrs["strides"]
    pads = tuple(int(p) for p in node.attrs["pads"])
    if kind != "conv" and icb != ocb:
        raise BackendError("pooling keeps the channel count", node=node.name, op=node.op)
    groups = node.attrs.get("super_groups", 1)
    if icb % groups or ocb % groups:
        raise BackendError(f"{groups} super-groups do not split {icb} input and {ocb} output channel blocks",
                           node=node.name, op=node.op)
    common.update(icb=icb // groups, ocb=ocb // groups)
    return LayerGeom(**common, kh=kh, kw=kw, sh=sh, sw=sw, pads=pads, groups=groups, pool=pool)  # type: ignore[arg-type]


def pool_fits(node: Node, graph: Graph, config: AcceleratorConfig) -> bool:
    """Whether a convolution with a max-pool fused in (weft.compiler.pool_fusion; `graph` holds the two
    layers apart) lowers onto `config` and runs faster than they do, each with the schedule the back end
    picks (the cost model's first choices timed, default options): the fusion's check. A config whose
    buffers cannot hold its rows keeps them apart instead of sending the fused layer to the host, and so
    does a layer whose tiles of whole rows cost more than the pool's pass saves (VGG-19's 224x224 layers)."""
    try:
        fused = _timed_alone(node, graph, config)
        if fused is None:
            return False
        # `graph` still holds the two (the pass asks before it fuses them)
        apart = [_timed_alone(n, graph, config) for n in graph.nodes if n.name in (node.name, node.attrs["pooled"])]
    except (BackendError, ValueError):
        return False
    return len(apart) != 2 or None in apart or fused < sum(apart)  # type: ignore[operator]


def _timed_alone(node: Node, graph: Graph, config: AcceleratorConfig) -> float | None:
    """Cycles of `node`'s program on the timing model, lowered with placeholder addresses and the schedule
    lower_layer would pick before its options; None where no schedule fits."""
    geom = layer_geometry(node, graph, config)
    if geom.kind == "maxpool" and node.inputs[0] in nonnegative_values(graph, config.acc_width):
        geom = replace(geom, input_nonnegative=True)
    steps = _steps(node, config)
    vec = 0 if alu.vectors_of(steps) else None
    wgt = 0 if geom.kind == "conv" else None
    identity = 0 if copies_by_gemm(geom, config) else None
    addrs = Addresses(inp=0, out=0, wgt=wgt, vec=vec, identity=identity)
    cls = _LOWERING[geom.kind]
    choices, ratio, _ = _search(geom, config, False)
    found = _fastest_fitting(ranked(geom, config), config,
                             lambda sched: cls(node.name, geom, sched, config, addrs, steps), choices, ratio)
    if isinstance(found, str):
        return None
    return float(_program_cycles(found[2], config, deadlock=math.inf))


def nonnegative_values(graph: Graph, acc_width: int) -> set[str]:
    """Values proven >= 0: outputs of layers whose epilogue ends clamping at >= 0 (and max-pools of them)."""
    out: set[str] = set()
    for node in graph.nodes:
        if node.op == "qmaxpool":
            if node.inputs[0] in out:
                out.add(node.outputs[0])
            continue
        nonneg = False
        for kind, operand in node.attrs.get("epilogue", ()):
            if kind in ("max_imm", "max_vec"):
                nonneg = nonneg or bool(np.min(operand) >= 0)
            elif kind in ("min_imm", "min_vec", "shr_imm"):
                nonneg = nonneg and bool(np.min(operand) >= 0)
            elif kind == "rq_vec":  # its ReLU flag clamps at 0, a zero multiplier (a padded channel) gives 0
                m, _, relu = rq_fields(operand, acc_width)
                nonneg = bool(np.all((relu != 0) | (m == 0)))
            else:
                nonneg = False
        if nonneg and node.op in _KIND:
            out.add(node.outputs[0])
    return out


def value_bytes(graph: Graph, name: str, config: AcceleratorConfig) -> int:
    """Bytes a packed activation value takes in the DRAM image (out_width integers)."""
    return int(np.prod(graph.values[name].shape)) * config.out_width // 8


def _row_blocks(graph: Graph, accel: list[Node], config: AcceleratorConfig) -> dict[str, list[int]]:
    """The activations the accelerator layers read or write, in the order they are first named, each with
    the DRAM row blocks it is moved in, the one it is written in first: out rows for everything a layer
    writes, a residual and a pooling or element-wise input, inp rows for a convolution's input."""
    inp, out = dram_rows(config)
    found: dict[str, list[int]] = {}
    for node in accel:
        if node.op == "qconv2d":
            named = [(node.inputs[0], inp), *((x, out) for x in node.inputs[2:3]), (node.outputs[0], out)]
        else:
            named = [*((x, out) for x in node.inputs), (node.outputs[0], out)]
        for name, rows in named:
            if name and name not in graph.constants:
                blocks = found.setdefault(name, [])
                if rows not in blocks:
                    blocks.append(rows)
    for blocks in found.values():
        blocks.sort(key=lambda rows: rows != out)
    return found


def place_values(graph: Graph, accel: list[Node], config: AcceleratorConfig,
                  plan: memory.DramPlan) -> dict[str, dict[str, Any]]:
    """The DRAM buffer of every activation the accelerator layers read or write. Where the config's row
    orders differ from the packed order (:func:`weft.core.layout.reordered`), each buffer names the order
    it holds (``rows``) and a value moved in both inp and out rows gets a second buffer (``copies``, in inp
    rows), filled by its producer's relayout program or by the host."""
    c = config
    ordered = any(reordered(c.batch, act_block(c), rows) for rows in dram_rows(c))
    values: dict[str, dict[str, Any]] = {}
    for name, blocks in _row_blocks(graph, accel, c).items():
        size = value_bytes(graph, name, c)
        info: dict[str, Any] = {"addr": plan.alloc(f"value:{name}", size), "bytes": size,
                                "shape": list(graph.values[name].shape), "dtype": graph.values[name].dtype}
        if ordered:
            info["rows"] = blocks[0]
            info["copies"] = [{"addr": plan.alloc(f"value:{name}:rows{rows}", size), "rows": rows}
                              for rows in blocks[1:]]
        values[name] = info
    return values


def value_addr(info: dict[str, Any], rows: int) -> int:
    """The byte address of the buffer of a value (its ``values`` entry) that holds it in `rows` rows."""
    for buf in (info, *info.get("copies", ())):
        if buf.get("rows", rows) == rows:
            return int(buf["addr"])
    raise ValueError(f"no DRAM buffer holds the value in rows of {rows} channels")


def _schedule_for(node: Node, geom: LayerGeom, config: AcceleratorConfig, given: Any) -> list[Schedule]:
    """The given schedule, or the candidates in the cost model's order."""
    try:
        if given is not None:
            return [given if isinstance(given, Schedule) else Schedule.from_dict(given)]
        return ranked(geom, config)
    except (ValueError, TypeError) as err:
        raise BackendError(str(err), node=node.name, op=node.op) from None


def _whole_rows(given: Any, node: Node) -> bool:
    """Whether a schedule given for a convolution with a max-pool fused in has the tiles the pooling takes."""
    try:
        sched = given if isinstance(given, Schedule) else Schedule.from_dict(given)
    except (ValueError, TypeError):
        return True  # (the layer's lowering names what is wrong with it)
    return sched.tile_n == 1 and sched.tile_h == 1 and sched.tile_w == conv_hw(node)[1]  # type: ignore[index]


def generate(artifact: Artifact, *, latency_hiding: bool = True,
             schedules: Mapping[str, Any] | None = None, tuned: Mapping[str, Any] | None = None,
             chains: bool = True) -> dict[str, Any]:
    """Lower every accelerator layer of `artifact` and add the ``accel`` section; returns its meta.

    `schedules` maps layer names to a :class:`Schedule` (or its dict) to use instead of the default; `tuned`
    maps layer names to schedules from a tuning log, kept where they run faster than the default (see
    :func:`lower_layer`); ``latency_hiding=False`` runs every layer with one virtual thread (same tiles).
    With `chains`, each run of layers the walker runs back to back gets one program as well
    (:mod:`~weft.compiler.backend.chain`; the runtime runs it in their place)."""
    started = time.perf_counter()
    graph, c = artifact.graph, artifact.config
    tensorize(c, intrinsic(c))
    schedules = dict(schedules or {})
    for node in [n for n in graph.nodes if pool_of(n) is not None]:
        # A schedule given for a fused max-pool, or one of other tiles than whole rows for its convolution:
        # the two stay apart, each with what it was given.
        given = schedules.get(node.name)
        if str(node.attrs["pooled"]) in schedules or (given is not None and not _whole_rows(given, node)):
            unfuse_pool(graph, node)
    accel = [n for n in graph.nodes if n.attrs.get("target") == "accel"]
    unknown = sorted(set(schedules) - {n.name for n in accel})
    if unknown:
        node = next((n for n in graph.nodes if n.name == unknown[0] and n.op in ACCEL_OPS), None)
        if node is not None:  # the partition sent it to the host
            raise UsageError(f"schedules given for '{node.name}', which runs on the host: "
                             f"{node.attrs.get('host_reason', 'the partition put it there')}")
        raise UsageError(f"schedules given for '{unknown[0]}', which is not an accelerator layer of the model")
    plan = memory.DramPlan(c)
    values = place_values(graph, accel, c, plan)
    const_base = plan.size
    nonneg = nonnegative_values(graph, c.acc_width)
    layers = []
    timed: dict[tuple, dict[str, Any]] = {}  # a workload's timed choices (schedule, options), for its repeats
    tuned = dict(tuned or {})
    programs: dict[str, list[Insn]] = {}
    for node in accel:
        given = schedules.get(node.name)
        hint = tuned.get(node.name) if given is None else None
        workload = None
        if given is None and hint is None:
            geom = asdict(layer_geometry(node, graph, c))
            workload = (tuple((k, str(v)) for k, v in sorted(geom.items()) if k != "name"), node.inputs[0] in nonneg)
        try:
            known = timed.get(workload) if workload else None
            meta = lower_layer(node, graph, c, plan, values, known["schedule"] if known else given,
                               latency_hiding, node.inputs[0] in nonneg, known["lowering"] if known else None,
                               tuned=hint, programs=programs)
            layers.append(meta)
            if workload is not None:
                timed.setdefault(workload, meta)
        except BackendError as err:
            if given is not None:  # the schedule the caller chose is at fault, not the accelerator
                raise
            # A limit the partition's admission check does not foresee (the exact micro-op count, an
            # encoding): the host runs the layer. Its DRAM buffers stay allocated, unused.
            send_to_host(graph, node, str(err).removeprefix(f"node '{node.name}' ({node.op}): "))
    for layer in layers:
        copies = values[layer["output"]].get("copies", ())
        if copies:
            layer["relayout"] = [lower_relayout(layer["output"], values[layer["output"]], copy, c, plan)
                                 for copy in copies]
    if chains and latency_hiding:
        for run in chain_runs(graph, layers):
            for members, constants_first in _chain_starts([layers[k] for k in run], programs, c):
                _place_chain(members, programs, c, plan, constants_first)
    meta = {
        "version": ACCEL_VERSION, "dram_bytes": plan.size, "const_base": const_base,
        "latency_hiding": latency_hiding, "values": values, "layers": layers,
        "compile_seconds": time.perf_counter() - started,
    }
    section = artifact.add_section(ACCEL_SECTION, meta)
    section.add_array("const", plan.image(const_base))
    return meta


def lower_layer(node: Node, graph: Graph, c: AcceleratorConfig, plan: memory.DramPlan,
                values: dict[str, dict[str, Any]], given: Any, latency_hiding: bool, nonneg: bool,
                options: Mapping[str, Any] | None = None, tuned: Any = None,
                programs: dict[str, list[Insn]] | None = None) -> dict[str, Any]:
    """Lower one accelerator layer into `plan` (its instruction stream, uops and constants) and return the
    layer's metadata. `values` maps value names to their DRAM placement; `given` is a schedule (or None for
    the default); `nonneg` says the layer's input is proven >= 0; `options`: the lowering's (its meta's
    ``lowering``; None: :data:`~weft.compiler.backend.tiles.DEFAULT_OPTIONS`, or their fastest variants where
    the schedule is not given); `tuned`: a schedule from a tuning log, which competes with the default's
    (each with its fastest options: the faster program is kept, so a tuning log, measured without the
    options, never makes a layer slower than the default). Used by :func:`generate` and by the tuner's
    measurer, which lowers single layers with candidate schedules. `programs`, when given, gets the layer's
    whole program by name (for :mod:`~weft.compiler.backend.chain`)."""
    geom = layer_geometry(node, graph, c)
    if nonneg and geom.kind == "maxpool":  # its zero padding cannot win (schedule.pools_offset)
        geom = replace(geom, input_nonnegative=True)
    steps = _steps(node, c)
    kind = geom.kind
    in_mem = "inp" if kind == "conv" else "out"
    inp_rows, out_rows = dram_rows(c)
    addrs = {"inp": plan.element(value_addr(values[node.inputs[0]], inp_rows if kind == "conv" else out_rows),
                                 in_mem),
             "out": plan.element(value_addr(values[node.outputs[0]], out_rows), "out")}
    residual_input = node.inputs[2] if node.op == "qconv2d" and len(node.inputs) > 2 else \
        node.inputs[1] if node.op == "qalu" and len(node.inputs) > 1 else ""
    if residual_input:
        addrs["residual"] = plan.element(value_addr(values[residual_input], out_rows), "out")
    if kind == "conv":
        w = graph.constants[node.inputs[1]]
        want = (geom.ocb * geom.groups * geom.ro, geom.icb * geom.ri, geom.kh, geom.kw, c.block_out, c.block_in)
        if w.shape != want:
            raise BackendError(f"packed weights are {list(w.shape)}, expected {list(want)}", node=node.name,
                               op=node.op)
        addrs["wgt"] = plan.element(plan.constant(f"wgt:{node.name}", memory.weight_bytes(w, c)), "wgt")
    if copies_by_gemm(geom, c):
        # a residual the GEMM adds times c (alu.residual_scale) takes c times the identity
        scale = (alu.residual_scale(steps, c) or 1) if kind == "conv" else 1
        eye = scale * np.eye(c.block_out, c.block_in, dtype=np.int64).reshape(1, 1, 1, 1, c.block_out, c.block_in)
        addrs["identity"] = plan.element(plan.constant(f"wgt:identity:{node.name}", memory.weight_bytes(eye, c),
                                                       share=True), "wgt")
    vectors = alu.vectors_of(steps)
    if vectors:
        vec_addr = plan.constant(f"vec:{node.name}", memory.vector_bytes(vectors, c), share=True)
        addrs["vec"] = plan.element(vec_addr, "acc")
    lowering_cls = _LOWERING[kind]

    def lower_with(sched: Schedule, **changes: Any) -> Lowering:
        return lowering_cls(node.name, geom, sched, c, Addresses(**addrs), steps, {**(options or {}), **changes})

    def best(given: Any, variants: bool) -> tuple[Schedule, Lowering, Stream]:
        choices, ratio, bound = _search(geom, c, given is not None)
        found = _fastest_fitting(_schedule_for(node, geom, c, given), c, lower_with, choices, ratio, bound)
        if not latency_hiding and not isinstance(found, str):  # the same tiles (timed with latency hiding), one thread
            found = _first_fitting([found[0].without_latency_hiding()], c, lower_with)
        if isinstance(found, str):
            raise BackendError(f"no schedule lowers onto config '{c.name}' ({found})", node=node.name, op=node.op)
        sched, lowering, stream = found
        if latency_hiding and options is None and variants:
            lowering, stream = _fastest_variant(lowering, stream, c, lambda **options: lower_with(sched, **options))
        return sched, lowering, stream

    sched, lowering, stream = best(given, variants=given is None)
    if tuned is not None and given is None:
        try:
            other = best(tuned, variants=True)
        except BackendError:
            other = None  # (a log from another compiler version may name tiles that no longer fit)
        if other is not None and _program_cycles(other[2], c, deadlock=math.inf) < \
                _program_cycles(stream, c, deadlock=math.inf):
            sched, lowering, stream = other
    placed = _place_program(node.name, node.op, stream, c, plan)
    if programs is not None:
        programs[node.name] = placed["program"]
    return {
        "name": node.name, "op": node.op, "kind": kind, "geometry": asdict(geom), "schedule": sched.to_dict(),
        "lowering": dict(lowering.options),
        "inputs": [x for x in node.inputs if x in values], "output": node.outputs[0],
        "insn_addr": placed["insn_addr"], "insn_count": placed["insn_count"], "insn_bytes": INSN_BYTES,
        "uop_addr": placed["uop_addr"], "uop_count": int(stream.uop_count), "tasks": len(lowering.tasks()),
        "stages": lowering.stages(), "tokens_peak": placed["tokens_peak"],
        "checked_executions": placed["checked_executions"], "instructions_by_role": placed["instructions_by_role"],
    }


#: A convolution of at least this many block products (GEMM executions: 2**16 is 16.8 M MACs on a 16x16
#: core) has its first SCHEDULE_CHOICES fitting schedules, in the cost model's order, lowered and timed on
#: the timing model, and the fastest kept: the cost model ranks well, but its first choice is within a few
#: percent of the best only (a few tenths of a second a large layer). A smaller one has its first
#: SMALL_SCHEDULE_CHOICES timed, but not those whose programs have more than SMALL_INSNS_RATIO times the
#: first one's instructions (small tiles: the slowest to time, and rarely faster): its program is short
#: (tens of milliseconds each), and the cost model ranks DRAM-bound layers worse (ResNet-18's 1x1/2
#: shortcuts: the fastest is its 7th choice, 30% faster than its first; ShuffleNet 3.32 -> 3.17 M cycles,
#: its compile 2.9 -> 14 s).
TIMED_PRODUCTS = 1 << 16
SCHEDULE_CHOICES = 3
SMALL_SCHEDULE_CHOICES = 16
SMALL_INSNS_RATIO = 2
#: A large convolution whose fastest of the first SCHEDULE_CHOICES runs more than BOUND_SLACK above its
#: schedule's bound (its GEMM executions, or its DRAM bytes at the bus's rate and the board's duty, whichever
#: is more) has up to MORE_SCHEDULE_CHOICES timed: ResNet-18's layer2 on zcu104 (1x32x32) runs 2 to 3%
#: faster with its 6th and 10th choices, where most of default's layers, within a few percent of their
#: bound, time no more.
MORE_SCHEDULE_CHOICES = 10
BOUND_SLACK = 1.08


#: The program's first weights in this many pieces of output blocks, each with its own GEMM (option
#: ``weight_pieces`` of the convolution lowering), where that runs faster.
WEIGHT_PIECES = 4


def _fastest_variant(lowering: Lowering, stream: Stream, c: AcceleratorConfig,
                     lower: Callable[..., Lowering]) -> tuple[Lowering, Stream]:
    """The lowering options timed one after the other on the timing model, each kept where its program runs
    faster and its micro-ops fit: the epilogues beside the other thread's GEMMs or each with its stage
    (``hold_epilogue``), the first weights whole or in pieces (``weight_pieces``), one output tile a thread
    or two (``tile_slots``), a residual added by the epilogue's GEMM or its ALU (``residual_alu``), each
    reduction step's weights resident in rows of their own or not (``stage_weights``), each thread's last
    weights whole or in pieces (``last_pieces``: a layer bound by its weights' DRAM time then ends a piece's
    GEMM after its last load rather than a whole stage's), and with them each thread's last epilogue and
    store in those pieces (``epilogue_pieces``), the two threads' first tasks by piece in turn
    (``interleave_first``), a residual loaded ahead of the pieces (``residual_first``), and one pixel tile's
    input windows loaded once for both threads (``stage_inputs``)."""
    options = dict(lowering.options)
    cycles = None
    variants = []
    if lowering.s.vthreads > 1:
        variants.append({"hold_epilogue": False})
    if lowering.kind == "conv":
        variants.append({"weight_pieces": WEIGHT_PIECES})
        if lowering.s.vthreads > 1 and shared_tiles(lowering.g, lowering.s)[1]:  # (else the same as the last)
            variants.append({"weight_pieces": WEIGHT_PIECES, "interleave_first": True})
        variants.append({"tile_slots": 2})
        variants.append({"tile_slots": 2, "epilogue_own_stage": True})
        if lowering.residual_by_gemm:
            variants.append({"tile_slots": 2, "epilogue_own_stage": True, "residual_alu": True})
        if getattr(lowering, "weight_slots", 1) > 1:
            variants.append({"stage_weights": False})
        variants.append({"last_pieces": WEIGHT_PIECES})
        if lowering.piece_bounds(WEIGHT_PIECES):  # (options that change nothing are not lowered)
            variants.append({"last_pieces": WEIGHT_PIECES, "epilogue_pieces": 1})
            variants.append({"last_pieces": WEIGHT_PIECES, "epilogue_pieces": 2})
        if lowering.g.residual and lowering.copies_by_gemm:
            variants.append({"residual_first": True})
        if lowering.stage_inputs_apply:
            variants.append({"stage_inputs": True})
    for change in variants:
        try:
            trial = lower(**{**options, **change})
            trial_stream = trial.lower()
        except ValueError:  # its tiles do not fit (a second output tile in the accumulator)
            continue
        if trial_stream.insns == stream.insns or trial_stream.uop_count > c.uop_rows:
            continue  # the option changes nothing here, or its micro-ops do not fit
        cycles = _program_cycles(stream, c, deadlock=math.inf) if cycles is None else cycles
        trial_cycles = _program_cycles(trial_stream, c, deadlock=math.inf)
        if trial_cycles < cycles:
            lowering, stream, cycles = trial, trial_stream, trial_cycles
            options.update(change)
    return lowering, stream


def _search(g: LayerGeom, c: AcceleratorConfig, given: bool
            ) -> tuple[int, float | None, Callable[[Schedule], float] | None]:
    """How far lower_layer times schedules of `g`: the candidates, the instruction ratio past which a
    candidate is not timed, and the bound that extends a large convolution's search (see SCHEDULE_CHOICES)."""
    if given or g.kind != "conv":
        return 1, None, None
    if _block_products(g) < TIMED_PRODUCTS:
        return SMALL_SCHEDULE_CHOICES, SMALL_INSNS_RATIO, None
    return SCHEDULE_CHOICES, None, lambda sched: _bound(g, sched, c)


def _bound(g: LayerGeom, s: Schedule, c: AcceleratorConfig) -> float:
    """Cycles no program of layer `g` under schedule `s` can beat: its GEMM executions, or its reads or
    writes at the bus's rate and the board DRAM's duty."""
    u = usage(g, s, c)
    rate = c.bus_width / 8 * DUTY  # (the cost model's board DRAM)
    return max(u.gemm_execs, (u.load_bytes + u.acc_bytes) / rate, u.store_bytes / rate)


def _block_products(g: LayerGeom) -> int:
    return g.nb * g.groups * g.ocb * g.ro * g.ho * g.wo * g.icb * g.ri * g.kh * g.kw


def _fastest_fitting(schedules: Iterable[Schedule], c: AcceleratorConfig, lowering: Callable[[Schedule], Lowering],
                     choices: int, insns_ratio: float | None = None,
                     bound: Callable[[Schedule], float] | None = None) -> tuple[Schedule, Lowering, Stream] | str:
    """Of the first `choices` schedules that fit (:func:`_first_fitting`), the one whose program the timing
    model runs in the fewest cycles (the first on a tie), leaving out programs of more than `insns_ratio`
    times the first one's instructions; why none fits, where none does. With `bound` (a schedule's least
    possible cycles), where the fastest of them runs more than BOUND_SLACK above its bound (the cost model
    ranks the layer poorly), the next ones up to MORE_SCHEDULE_CHOICES are timed too."""
    pending = iter(schedules)
    found: list[tuple[Schedule, Lowering, Stream]] = []
    while len(found) < choices:
        got = _first_fitting(pending, c, lowering)
        if isinstance(got, str):
            if not found:
                return got
            break
        found.append(got)
    if insns_ratio is not None:  # programs much longer than the first are not timed
        limit = insns_ratio * len(found[0][2].insns)
        found = [f for f in found if len(f[2].insns) <= limit]
    if len(found) == 1 and bound is None:
        return found[0]
    timed = [_program_cycles(f[2], c, deadlock=math.inf) for f in found]
    best = min(range(len(found)), key=lambda k: timed[k])
    if bound is not None and timed[best] > BOUND_SLACK * bound(found[best][0]):
        while len(found) < MORE_SCHEDULE_CHOICES:
            got = _first_fitting(pending, c, lowering)
            if isinstance(got, str):
                break
            found.append(got)
            timed.append(_program_cycles(got[2], c, deadlock=math.inf))
        best = min(range(len(found)), key=lambda k: timed[k])
    return found[best]


def _program_cycles(stream: Stream, c: AcceleratorConfig, deadlock: float | None = None) -> float:
    """Cycles of a lowered stream as a program (its micro-op load, tokens and FINISH) on the timing model;
    the stream itself is left as it was. Where the program deadlocks (its tokens outgrow the queues of a
    small config): `deadlock`, or TimingError when that is None."""

    program = stream.program(0)
    program.insns = [replace(i, fields=dict(i.fields)) for i in program.insns]  # inject_sync sets their flags
    inject_sync(program.insns, c)
    mark_beside(program.insns, c)
    try:
        return int(TimingModel(c).simulate(program.array()).cycles)
    except TimingError:
        if deadlock is None:
            raise
        return deadlock


def _first_fitting(schedules: Iterable[Schedule], c: AcceleratorConfig, lowering: Callable[[Schedule], Lowering]
                   ) -> tuple[Schedule, Lowering, Stream] | str:
    """The first of `schedules` whose lowering succeeds with its micro-ops inside the buffer, with that
    lowering and its stream; or, when none does, why the first three failed (for the caller's error)."""
    errors = []
    for sched in schedules:
        try:
            low = lowering(sched)
            stream = low.lower()
        except ValueError as err:  # the exact micro-op or row count did not fit: try the next schedule
            errors.append(f"{sched}: {err}")
            continue
        if stream.uop_count <= c.uop_rows:
            return sched, low, stream
        errors.append(f"{sched}: {stream.uop_count} micro-ops exceed the {c.uop_rows} of the buffer")
    return "; ".join(errors[:3])


def _place_program(name: str, op: str, stream: Stream, c: AcceleratorConfig, plan: memory.DramPlan) -> dict[str, Any]:
    """Encode a lowered stream with its micro-op loads, FINISH and tokens, check it and put its micro-ops and
    instructions into `plan`; returns where they live and the static figures."""
    uops = stream.uop_table()
    try:
        uop_words = encode_uops(c, uops)
    except EncodeError as err:
        raise BackendError(f"micro-op {err.index}: {err}", node=name, op=op) from None
    uop_addr = plan.constant(f"uop:{name}", uop_words, share=True)
    program = stream.program(plan.element(uop_addr, "uop"))
    inject_sync(program.insns, c)
    mark_beside(program.insns, c)
    insns = program.array()
    figures = check.check_stream(name, insns, uops, c)
    try:
        words = encode_insns(c, insns)
    except EncodeError as err:
        raise BackendError(f"instruction {err.index} ({program.insns[err.index].note}): {err}", node=name,
                           op=op) from None
    insn_addr = plan.constant(f"insns:{name}", words)
    kinds: dict[str, int] = {}
    for insn in program.insns:
        key = insn.note or "other"
        kinds[key] = kinds.get(key, 0) + 1
    return {"insn_addr": insn_addr, "insn_count": len(insns), "uop_addr": uop_addr,
            "tokens_peak": {k: figures[k] for k in QUEUES}, "checked_executions": figures["executions"],
            "instructions_by_role": kinds, "program": program.insns}


def _chain_inputs(members: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """For each layer of a chain, the earlier layers of the chain whose outputs it reads."""
    made = {str(m["output"]): k for k, m in enumerate(members)}
    return [[made[x] for x in m["inputs"] if x in made] for m in members]


def _chain_starts(members: list[dict[str, Any]], programs: Mapping[str, list[Insn]], c: AcceleratorConfig
                  ) -> list[tuple[list[dict[str, Any]], list[bool]]]:
    """How a run of layers that may chain (:func:`~weft.compiler.backend.chain.chain_runs`) is chained, timed
    on the timing model a pair of layers at a time where a layer reads the one before it: its constants
    first or its loads in their order (``constants_first``, whichever runs the pair faster: a layer's weights
    in four pieces of 18 KiB ahead of its input lost 3 k cycles after ResNet-18's layer1, its weights whole
    gained 3 to 4 k in layer4), or, where neither runs the pair faster than its two programs, no chain there.
    Returns the chains (two layers or more), each with its ``constants_first``. A pair of layers whose two
    workloads (geometry, schedule, options) a pair before had takes that pair's choice untimed (ResNet-50's
    blocks repeat)."""
    inputs = _chain_inputs(members)

    def cycles(ks: list[int], first: bool = False) -> float:
        reads = [[], [0] if ks[0] in inputs[ks[-1]] else []][:len(ks)]
        insns, _ = chain_program([programs[str(members[k]["name"])] for k in ks], reads, c, [False, first])
        return TimingModel(c).simulate(chain_stream(insns, c).array()).cycles

    def workload(k: int) -> str:
        m = members[k]
        return json.dumps([m["geometry"], m["schedule"], m["lowering"]], sort_keys=True)

    alone: dict[int, float] = {}
    decided: dict[tuple[str, str], tuple[bool, bool]] = {}
    chains: list[tuple[list[dict[str, Any]], list[bool]]] = [([members[0]], [False])]
    for k in range(1, len(members)):
        first, joined = False, True
        if k - 1 in inputs[k]:  # (else its barrier waits for stores long done: its loads keep their order)
            pair = (workload(k - 1), workload(k))
            if pair not in decided:
                choices = (False, True) if constants_may_go_first(programs[str(members[k]["name"])]) else (False,)
                timed = {choice: cycles([k - 1, k], choice) for choice in choices}
                best = min(timed, key=lambda choice: timed[choice])
                for j in (k - 1, k):
                    if j not in alone:
                        alone[j] = cycles([j])
                decided[pair] = best, timed[best] < alone[k - 1] + alone[k]
            first, joined = decided[pair]
        if joined:
            chains[-1][0].append(members[k])
            chains[-1][1].append(first)
        else:
            chains.append(([members[k]], [False]))
    return [chain for chain in chains if len(chain[0]) > 1]


def _place_chain(members: list[dict[str, Any]], programs: Mapping[str, list[Insn]], c: AcceleratorConfig,
                 plan: memory.DramPlan, constants_first: Sequence[bool] = ()) -> None:
    """One program for the chain of `members` (their metas, in order; see :mod:`weft.compiler.backend.chain`),
    checked and put into `plan`; recorded as ``chain`` on the first and ``chain_head`` on the others."""
    inputs = _chain_inputs(members)
    head = str(members[0]["name"])
    insns, ends = chain_program([programs[str(m["name"])] for m in members], inputs, c, constants_first)
    array = chain_stream(insns, c).array()
    name = f"chain from {head}"
    check.check_tokens(name, array, c)
    try:
        words = encode_insns(c, array)
    except EncodeError as err:
        raise BackendError(f"instruction {err.index} of its chain's program ({insns[err.index].note}): {err}",
                           node=head, op=str(members[0]["op"])) from None
    members[0]["chain"] = {"layers": [str(m["name"]) for m in members], "insn_addr": plan.constant(
        f"insns:chain:{head}", words), "insn_count": len(insns), "ends": ends}
    for m in members[1:]:
        m["chain_head"] = head


def lower_relayout(name: str, info: dict[str, Any], copy: dict[str, Any], c: AcceleratorConfig,
                   plan: memory.DramPlan) -> dict[str, Any]:
    """The program that fills buffer `copy` of value `name` (its ``values`` entry `info`, written in out
    rows) in the row order of `copy` (inp rows): an identity 1x1 convolution over the value's bytes seen
    as a tensor whose GEMM rows are its tiles' sub-blocks (:func:`weft.core.layout.row_order_refusal`).

    Read as inp rows, a tile ``(block/block_out, batch, block_out)`` is ``block/block_in`` rows whose batch
    slot is the sub-block and whose channels are (batch, channel); the identity writes each output
    sub-block (a batch element) as one out row of the slots' channels, which is the tile in
    ``(block/block_in, batch, block_in)`` order. Each tile is its own pixel: one channel block, the
    value's channel blocks folded into the rows."""
    block = act_block(c)
    nb, cb, h, w = info["shape"][:4]
    layer = f"{name}:relayout"
    geom = LayerGeom(name=layer, kind="conv", nb=nb, icb=1, ocb=1, ri=block // c.block_in, ro=block // c.block_out,
                     h=cb * h, w=w, ho=cb * h, wo=w)
    eye = np.eye(block, dtype=np.int64).reshape(block, block, 1, 1)
    wgt = plan.constant(f"wgt:identity:{layer}",
                        memory.weight_bytes(pack_weights(eye, c.block_out, c.block_in, block, block), c), share=True)
    addrs = Addresses(inp=plan.element(int(info["addr"]), "inp"), out=plan.element(int(copy["addr"]), "out"),
                      wgt=plan.element(wgt, "wgt"))
    found = _first_fitting(ranked(geom, c), c, lambda sched: ConvLowering(layer, geom, sched, c, addrs, ()))
    if isinstance(found, str):
        raise BackendError(f"no schedule converts '{name}' to rows of {copy['rows']} ({found})",
                           node=layer, op="relayout")
    sched, _, stream = found
    placed = _place_program(layer, "relayout", stream, c, plan)
    return {"name": layer, "rows": copy["rows"], "schedule": sched.to_dict(), "insn_addr": placed["insn_addr"],
            "insn_count": placed["insn_count"], "insn_bytes": INSN_BYTES, "uop_addr": placed["uop_addr"],
            "uop_count": int(stream.uop_count)}

