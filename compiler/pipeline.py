"""The compile pipeline: named passes from graph to graph, in one visible list.

``build_pipeline(target, config, calibration)`` returns the list; ``run_pipeline`` runs it, optionally
verifying the graph after every pass (a failure names the pass); ``describe`` lists it for humans and
tools (``weft compile --list-passes``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from weft.compiler import fusion, passes
from weft.compiler.backend.codegen import pool_fits
from weft.compiler.calibrate import calibrate
from weft.compiler.im2col import im2col_host_convs
from weft.compiler.packing import pack_layout
from weft.compiler.partition import partition
from weft.compiler.pool_fusion import fuse_pools
from weft.compiler.quantize import fuse_clamps, quantize
from weft.compiler.verify import verify
from weft.core.errors import GraphError
from weft.core.ir import Graph
from weft.core.qdq import absorb_fake_quant
from weft.errors import UsageError

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["TARGETS", "Pass", "build_pipeline", "describe", "run_pipeline"]

TARGETS = ("accel", "cpu")


@dataclass(frozen=True)
class Pass:
    """One named step of the pipeline: a function Graph -> Graph."""

    name: str
    run: Callable[[Graph], Graph]
    doc: str


#: Abbreviations whose period ends no sentence.
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.")


def _first_sentence(fn: Callable) -> str:
    """The docstring's first sentence: up to the first period followed by a space that is outside
    parentheses and not an abbreviation's ("(e.g. a Pad)" would otherwise end it)."""
    text = " ".join((fn.__doc__ or "").split())
    depth = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif (ch == "." and depth == 0 and text[i + 1:i + 2] == " "
              and not text[: i + 1].lower().endswith(_ABBREVIATIONS)):
            return text[: i + 1]
    return text


def _p(name: str, fn: Callable[[Graph], Graph], doc: str | None = None) -> Pass:
    return Pass(name, fn, doc or _first_sentence(fn))


def _named(fn: Callable[[Graph], Graph]) -> Pass:
    """A pass named after its function, described by its docstring's first sentence."""
    return _p(fn.__name__, fn)


def float_passes() -> list[Pass]:
    """The target-independent float passes: cleanup, then shaping into accelerator-sized layers."""
    cleanup = [passes.infer_shapes, passes.fold_constants, passes.remove_identity, passes.remove_dead]
    shaping = [fusion.fold_pad, fusion.lower_dense, fusion.fold_batchnorm, fusion.fold_affine, fusion.flatten_dense,
               fusion.fuse_residual, fusion.fuse_activation, fusion.lower_affine]
    return [*map(_named, cleanup + shaping),
            _p("remove_dead_2", passes.remove_dead, "drop nodes and constants the fusions left unused")]


def build_pipeline(target: str, config: AcceleratorConfig,
                   calibration: Sequence[Mapping[str, np.ndarray]] | None = None, *,
                   prequantized: bool = False) -> list[Pass]:
    """The passes for `target`: "accel" quantizes for `config` (calibration batches required unless the
    model is `prequantized`: its QDQ scales then serve), "cpu" keeps the float graph for the host."""
    if target not in TARGETS:
        raise UsageError(f"target must be one of {', '.join(TARGETS)}, got '{target}'")
    pipeline = float_passes()
    if target == "accel":
        if calibration is None and not prequantized:
            raise UsageError("the accel target needs calibration batches")
        # The model's own fake quants leave the float graph before fusion; their scales stay in the meta.
        pipeline.insert(2, _p("absorb_fake_quant", absorb_fake_quant(config.inp_width),
                              "a pre-quantized model's fake quants become Identity or Clip; their scales stay"))
        if calibration is not None:
            batches = list(calibration)
            pipeline.append(_p("calibrate", lambda g: calibrate(g, batches),
                               "record the range of every float tensor on the calibration batches"))
        pipeline += [
            _p("quantize", quantize(config), "int8 post-training quantization: integer layers with ALU epilogues"),
            _p("fuse_clamps", fuse_clamps),
            _p("im2col_host_convs", im2col_host_convs(config),
               "host-fed convolutions with few input channels read their windows gathered on the host"),
            _p("pack_layout", pack_layout(config), "packed, block-padded layouts for the config's GEMM blocks"),
        ]
    pipeline.append(_p("partition", partition(target, config), "assign each layer to the accelerator or the host"))
    if target == "accel":
        pipeline.append(_p("fuse_pools", fuse_pools(lambda node, g: pool_fits(node, g, config)),
                           "a max-pool on the accelerator runs in the epilogue of the convolution before it"))
    return pipeline


def run_pipeline(graph: Graph, pipeline: Sequence[Pass], *, verify_each: bool = True,
                 trace: Callable[[Pass, Graph], None] | None = None) -> Graph:
    """Run the passes in order; with `verify_each`, check the graph after each one (a broken invariant
    is a GraphError naming the pass). `trace(pass, graph)` sees every intermediate graph."""
    for p in pipeline:
        graph = p.run(graph)
        if verify_each:
            try:
                verify(graph)
            except GraphError as err:
                raise GraphError(f"after pass '{p.name}': {err}") from None
        if trace is not None:
            trace(p, graph)
    return graph


def describe(pipeline: Sequence[Pass]) -> list[dict[str, str]]:
    """The pipeline as data: each pass's name and what it does."""
    return [{"name": p.name, "doc": p.doc} for p in pipeline]
