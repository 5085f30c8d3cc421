"""The layout pass: quantized tensors into the accelerator's packed, block-padded layouts.

Integer activations get ``Value.logical`` (their NCHW/NK shape) and a packed ``shape``; qconv2d weights
become ``(O/block_out, I/block_in, kh, kw, block_out, block_in)`` with zero channel padding (grouped ones
first become their super-groups' dense block-diagonal matrices, stacked, :mod:`weft.compiler.groups`, and
the node gets ``attrs["super_groups"]``, their count); epilogue vectors are zero-padded to the padded
channel count. See :mod:`weft.core.layout`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from weft.compiler.groups import dense_super_weights
from weft.core.epilogue import pad_steps
from weft.core.ir import Graph, Value
from weft.core.layout import act_block, pack_weights, packed_act_shape, pad_to

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["pack_layout"]

_EPILOGUE_OPS = ("qconv2d", "qavgpool", "qalu")


def pack_layout(config: AcceleratorConfig) -> Callable[[Graph], Graph]:
    """The packing pass for `config` (Graph -> Graph)."""
    block, batch = act_block(config), config.batch

    def pack_graph(graph: Graph) -> Graph:
        g = graph.copy()
        for name, value in list(g.values.items()):
            if value.scale is not None and name not in g.constants and value.logical is None:
                g.values[name] = Value(name, packed_act_shape(value.shape, batch, block), value.dtype,  # type: ignore[arg-type]
                                       value.scale, value.shape)
        for node in g.nodes:
            if node.op not in _EPILOGUE_OPS:
                continue
            channels = pad_to(g.values[node.outputs[0]].logical[1], block)  # type: ignore[index]
            node.attrs["epilogue"] = pad_steps(node.attrs["epilogue"], channels)
            if node.op == "qconv2d":
                w_name = node.inputs[1]
                w = g.constants[w_name]
                in_pad = pad_to(w.shape[1], block)
                if "group" in node.attrs:
                    w, sg = dense_super_weights(w, node.attrs["group"], block)
                    node.attrs["super_groups"] = sg.count
                    in_pad = w.shape[1]
                packed = pack_weights(w, config.block_out, config.block_in, channels, in_pad)
                new = g.unique_name(f"{w_name}_packed")
                g.set_constant(new, packed, g.values[w_name].dtype)
                node.inputs[1] = new
        g.meta["layout"] = {"batch": batch, "block": block, "block_in": config.block_in,
                            "block_out": config.block_out}
        g.prune_values()
        return g

    return pack_graph
