"""Consecutive accelerator layers as one program (a chain), so that a layer's start overlaps the end of the
layer before it.

Run one program a layer, the accelerator idles at every layer's start (its first weights and inputs must
arrive before the first GEMM, 2 to 5 k cycles on ResNet-18's layers) and end (its last epilogue and store).
In one program the next layer's loads and its compute unit's start (its micro-ops, epilogue vectors, the
first tile's reset) run while the layer before still computes and stores: the tokens come from program
order as within a layer (:func:`~weft.compiler.backend.vthread.inject_sync`, on the SRAM rows each
instruction touches), so a load waits only for the GEMMs that still read the rows it overwrites.

What program order cannot say is an ordering through DRAM: a layer reads what an earlier layer of the chain
stored. Each value has a DRAM buffer of its own (:func:`~weft.compiler.backend.codegen.place_values`), so
that is the only one (the later layer's stores come after its own compute, which comes after the earlier
layer's loads). It becomes a barrier: an empty load on the compute unit that waits for the producer's last
store (and through the in-order store unit, all stores before it) and that the consumer's loads of its
inputs wait for (pseudo rows "stored" and "loadable" of inject_sync). The loads before the layer's first
load of an activation and its compute unit's start (micro-ops, vectors, a tile's start from the bias) go
ahead of the barrier; where ``constants_first`` says so, all its loads of constants before its first GEMM
too (the code generator times both on the pair of layers). A layer whose producers an earlier barrier
already waits for (a shortcut beside the block's first convolution) uses that one.

A chain is a run of accelerator layers the graph walker runs back to back with nothing between: no host
layer, no value the host packs into DRAM for a layer after the first, no relayout program. (The host may
read a layer's output after the chain: no layer of the chain writes that buffer again.) Each layer keeps
its own program too (to run one layer alone, or the chain's layers one by one); the chain's program is
recorded on its first layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from weft.compiler.backend.program import Insn, Stream
from weft.compiler.backend.vthread import inject_sync, mark_beside
from weft.config import AcceleratorConfig
from weft.core.ir import Graph
from weft.isa.constants import MemId, Opcode, Unit
from weft.isa.semantics import DEP_FLAGS

__all__ = ["BARRIER_NOTE", "chain_program", "chain_runs", "chain_stream", "constants_may_go_first"]

#: The note of a chain's barrier instruction (see the module docstring).
BARRIER_NOTE = "wait for the stores of the layers this one reads"

#: Memories whose loads read activations (a layer's input, a residual); the others read constants.
_ACTIVATION_LOADS = (MemId.INP, MemId.ACC_NARROW)


def chain_runs(graph: Graph, layers: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """The chains of `layers` (the lowered accelerator layers, in graph order): lists of indices of two
    layers or more that may run as one program (see the module docstring)."""
    position = {node.name: k for k, node in enumerate(graph.nodes)}
    producer = {o: node for node in graph.nodes for o in node.outputs}
    accel = {str(layer["name"]) for layer in layers}

    def joins(prev: Mapping[str, Any], layer: Mapping[str, Any]) -> bool:
        if prev.get("relayout") or layer.get("relayout"):
            return False
        if position[str(layer["name"])] != position[str(prev["name"])] + 1:
            return False  # the walker runs a host layer between them
        # (prev's output may be read back later: no layer of the chain writes its buffer)
        return all(x in producer and producer[x].name in accel for x in layer["inputs"])

    runs: list[list[int]] = []
    for k, layer in enumerate(layers):
        if runs and joins(layers[runs[-1][-1]], layer):
            runs[-1].append(k)
        else:
            runs.append([k])
    return [run for run in runs if len(run) > 1]


def _fresh(insn: Insn) -> Insn:
    """A copy of `insn` without the flags inject_sync and mark_beside set (they are derived again)."""
    fields = {k: v for k, v in insn.fields.items() if k not in DEP_FLAGS and k != "beside"}
    return replace(insn, fields=fields)


def _reads_activation(insn: Insn) -> bool:
    f = insn.fields
    return f.get("opcode") == Opcode.LOAD and f.get("mem_id") in _ACTIVATION_LOADS and f.get("x_size", 0) > 0


def _after_barrier(body: list[Insn], k: int, waits: tuple[tuple[str, int, int], ...]) -> None:
    """Make the loads of activations in `body` wait for the barrier of layer `k` (the compute unit's own:
    for the stores the barrier waits for)."""
    for x in body:
        if _reads_activation(x):
            if x.unit == Unit.COMPUTE:  # (a residual into acc rows)
                x.reads = (*x.reads, *waits)
            else:
                x.reads = (*x.reads, ("loadable", k, k + 1))


def _with_barrier(body: list[Insn], first: int, k: int, waits: tuple[tuple[str, int, int], ...],
                  constants_first: bool) -> list[Insn]:
    """Layer `k`'s instructions with its barrier before `first`, its first load of an activation: the loads
    before it (its weights' first piece, say) run ahead of the barrier, and so does the compute unit's start
    that does not need the loads behind it (its micro-ops, vectors, a tile's start from the bias). With
    `constants_first`, so do all its loads of constants before its first GEMM (its weights' other pieces:
    they load while the layer before still stores, but its first GEMM's inputs wait behind them), else the
    load unit keeps its order (the inputs right after the barrier)."""
    barrier = Insn(dict(opcode=int(Opcode.LOAD), mem_id=int(MemId.ACC)), Unit.COMPUTE, reads=waits,
                   writes=(("loadable", k, k + 1),), note=BARRIER_NOTE)
    _after_barrier(body, k, waits)
    ahead = [x for x in _start(body, first) if x.unit == Unit.COMPUTE or constants_first]
    moved = {id(x) for x in ahead}
    return [*body[:first], *ahead, barrier, *(x for x in body[first:] if id(x) not in moved)]


def _start(body: list[Insn], first: int) -> list[Insn]:
    """The instructions from `first` on that may go ahead of a barrier there: the compute unit's up to its
    first that needs what the loads bring, and the load unit's loads of constants before that."""
    out = []
    for x in body[first:]:
        if x.unit == Unit.LOAD:
            if not _reads_activation(x):
                out.append(x)
            continue
        if x.unit != Unit.COMPUTE:
            continue
        if x.fields.get("opcode") == Opcode.GEMM or _reads_activation(x) or \
                any(m in ("inp", "wgt") for m, _, _ in x.reads):
            break
        out.append(x)
    return out


def constants_may_go_first(program: Sequence[Insn]) -> bool:
    """Whether a barrier in `program` (a layer's whole program) could have loads of constants behind it that
    ``constants_first`` moves ahead of it."""
    first = next((j for j, x in enumerate(program) if _reads_activation(x)), None)
    return first is not None and any(x.unit == Unit.LOAD for x in _start(list(program), first))


def chain_program(programs: Sequence[list[Insn]], inputs: Sequence[Sequence[int]], config: AcceleratorConfig,
                  constants_first: Sequence[bool] = ()) -> tuple[list[Insn], list[int]]:
    """One program of the layers' `programs` (each a whole program: micro-op loads, body, FINISH), where
    layer k reads the outputs of the layers ``inputs[k]`` (indices of earlier layers of the chain) and, where
    ``constants_first[k]``, loads all its constants before its first GEMM ahead of its barrier (see
    :func:`_with_barrier`). Returns its instructions (tokens and beside marks set) and, per layer, the index
    one past its last instruction."""
    insns: list[Insn] = []
    ends: list[int] = []
    barriers: list[tuple[int, frozenset[int]]] = []  # (layer, the layers whose stores its barrier waits for)
    for k, program in enumerate(programs):
        if not program or program[-1].fields.get("opcode") != Opcode.FINISH:
            raise ValueError(f"layer {k} of the chain: a program must end with FINISH")
        body = [_fresh(x) for x in program[:-1]]
        for x in body:
            if x.unit == Unit.STORE:
                x.writes = (*x.writes, ("stored", k, k + 1))
        producers = frozenset(inputs[k])
        waits = tuple(("stored", j, j + 1) for j in sorted(producers))
        first = next((j for j, x in enumerate(body) if _reads_activation(x)), None)
        # A barrier of a layer after the producers that waits for all of them serves this layer too (a
        # shortcut beside the block's first convolution, both reading the block's input): the layer's loads
        # then wait for the stores only, not for the compute unit to reach a barrier of its own.
        shared = min((j for j, of in barriers if of >= producers and j > max(producers)), default=None) \
            if producers else None
        if shared is not None:
            _after_barrier(body, shared, waits)
        elif waits and first is not None:
            body = _with_barrier(body, first, k, waits, k < len(constants_first) and constants_first[k])
            barriers.append((k, producers))
        insns += body
        ends.append(len(insns))
    insns.append(Insn(dict(opcode=int(Opcode.FINISH)), Unit.COMPUTE, note="finish"))
    ends[-1] = len(insns)
    inject_sync(insns, config)
    mark_beside(insns, config)
    return insns, ends


def chain_stream(insns: list[Insn], config: AcceleratorConfig) -> Stream:
    """A stream holding the chain's instructions (to encode them)."""
    stream = Stream(config)
    stream.insns = insns
    return stream
