"""Admission: can the accelerator take this layer on this config? The partition pass asks before it
places a layer, so an accelerator limit sends the layer to the host instead of failing the compile.

The checks are the lowering's own layer-level ones (:func:`layer_geometry`: the packed layout, a GEMM row
the DMA can move; :func:`space`: some tiling fits the on-chip buffers), so the two cannot disagree on
them. The DMA splits any transfer whose fields are too narrow, so strides, pads and sizes need no check.
Emitting the instruction stream is what costs, so admission stops short of it: a layer whose exact
micro-op count or encoding fails for every schedule is found by code generation, which then hands it to
the host itself (:func:`weft.compiler.partition.send_to_host`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from weft.compiler.backend.codegen import BackendError, layer_geometry
from weft.compiler.backend.schedule import space

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig
    from weft.core.ir import Graph, Node

__all__ = ["check_layer"]


def check_layer(node: Node, graph: Graph, config: AcceleratorConfig) -> str | None:
    """None when the back end can take `node` (a packed accelerator op of `graph`) on `config`, else why
    not (the back end's message, without the node's name)."""
    try:
        geom = layer_geometry(node, graph, config)
    except BackendError as err:
        return str(err).removeprefix(f"node '{node.name}' ({node.op}): ")
    if next(space(geom, config, (1,)), None) is None:  # one thread needs the least: the first fit suffices
        c = config
        return (f"no tiling fits the buffers of config '{c.name}' (inp {c.inp_rows}, wgt {c.wgt_rows}, "
                f"acc {c.acc_rows}, uop {c.uop_rows} rows)")
    return None
