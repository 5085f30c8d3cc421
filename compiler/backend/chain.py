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
inputs wait for (pseudo rows "stored" and "loadable" of inject_sync). The layer's other loads (weights,
micro-ops, vectors) and its compute unit's start go ahead of the barrier.

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

__all__ = ["BARRIER_NOTE", "chain_program", "chain_runs"]

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


def chain_program(programs: Sequence[list[Insn]], inputs: Sequence[Sequence[int]],
                  config: AcceleratorConfig) -> tuple[list[Insn], list[int]]:
    """One program of the layers' `programs` (each a whole program: micro-op loads, body, FINISH), where
    layer k reads the outputs of the layers ``inputs[k]`` (indices of earlier layers of the chain). Returns
    its instructions (tokens and beside marks set) and, per layer, the index one past its last instruction."""
    insns: list[Insn] = []
    ends: list[int] = []
    for k, program in enumerate(programs):
        if not program or program[-1].fields.get("opcode") != Opcode.FINISH:
            raise ValueError(f"layer {k} of the chain: a program must end with FINISH")
        body = [_fresh(x) for x in program[:-1]]
        for x in body:
            if x.unit == Unit.STORE:
                x.writes = (*x.writes, ("stored", k, k + 1))
        waits = tuple(("stored", j, j + 1) for j in sorted(set(inputs[k])))
        if waits:
            # The loads of what earlier layers stored wait for the barrier; the rest of the layer's start (its
            # weights, micro-ops and vectors, up to its first GEMM) goes ahead of it, the order of each unit's
            # own instructions kept.
            first = next((j for j, x in enumerate(body) if x.fields.get("opcode") in (Opcode.GEMM, Opcode.ALU)),
                         len(body))
            ahead = [x for x in body[:first] if not _reads_activation(x)]
            behind = [x for x in body[:first] if _reads_activation(x)]
            barrier = Insn(dict(opcode=int(Opcode.LOAD), mem_id=int(MemId.ACC)), Unit.COMPUTE, reads=waits,
                           writes=(("loadable", k, k + 1),), note=BARRIER_NOTE)
            for x in body:
                if _reads_activation(x):
                    if x.unit == Unit.COMPUTE:  # (a residual into acc rows: the compute unit waits itself)
                        x.reads = (*x.reads, *waits)
                    else:
                        x.reads = (*x.reads, ("loadable", k, k + 1))
            body = [*ahead, barrier, *behind, *body[first:]]
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
