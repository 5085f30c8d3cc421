"""Host im2col for thin host-fed convolutions: the kernel window moves into the GEMM's reduction.

A convolution reads its input channels in blocks of the activation block (:func:`weft.core.layout.act_block`),
so an image with 3 channels padded to 16 keeps 13/16 of the GEMM core idle for every kernel tap: ResNet's
7x7/2 first layer runs at 16% of peak. When the convolution's input is quantized on the host (the float
graph input passing through ``quantize``), the host can lay it out any way it likes, so this pass inserts
a ``qim2col`` host layer that gathers each output pixel's window, ``(kh, kw, C)`` in that order, into the
channels of a new tensor, and the convolution becomes a 1x1 stride-1 one over those ``kh * kw * C``
channels: 7x7x3 = 147 channels padded to 160 instead of 49 taps of 16.

The block padding leaves spare channels, and the epilogue's first step (the bias, with the rounding
constant of the pre-shift) is one ALU pass over every output row, which for a layer this short costs a
tenth of its GEMM time. So the host also writes a few constants (``attrs["constants"]``, after the
windows) and the weights get matching columns whose dot product with them is that first step's addend:
the GEMM adds the bias and the epilogue starts one step later.

The rewrite is exact: the window's elements and the weights meet in the same products (the weights are
reordered to match), the padding positions hold the integer 0 that the convolution's own padding means
(activations are symmetric, no zero point), the accumulator wraps modulo 2**acc_width in the GEMM as the
ALU's add did, and the rest of the epilogue is unchanged, so every output is the same integer. The
convolution's ``channels`` stay the window's ``kh * kw * C`` (its MACs); its weights hold the bias columns
too. It applies where it shrinks the GEMM's reduction (its blocks fall from ``kh * kw * ceil(C / B)`` to
``ceil(kh * kw * C / B)``), for ungrouped convolutions only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from weft.core.ir import Graph, Node, Value
from weft.core.layout import act_block, pad_to

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["bias_columns", "im2col_host_convs", "unfolds"]


def unfolds(channels: int, kernel: tuple[int, int], block: int) -> bool:
    """True when gathering a `kernel` window of `channels` into the reduction needs fewer `block`-wide
    channel blocks than the convolution reading the channels tap by tap."""
    taps = kernel[0] * kernel[1]
    return taps > 1 and pad_to(taps * channels, block) < taps * pad_to(channels, block)


def bias_columns(bias: np.ndarray, spare: int, act_max: int, wgt_max: int
                 ) -> tuple[tuple[int, ...], np.ndarray] | None:
    """Constant activations ``v`` (at most `spare`, within +-`act_max`) and integer weights ``w`` (one row
    per output channel, within +-`wgt_max`) with ``w @ v == bias`` exactly; None when no such split fits.

    ``v`` is 1, then each next constant at most one more than twice the reach of those before it (capped
    at `act_max`), so the constants cover every integer up to their joint reach; the weights come from
    the largest constant down, each the nearest multiple that the rest can still make up."""
    bias = np.asarray(bias, np.int64)
    values: list[int] = []
    for _ in range(spare):
        values.append(min(act_max, 2 * wgt_max * sum(values) + 1))
        rest = bias.copy()
        weights = np.zeros((bias.size, len(values)), np.int64)
        for j in range(len(values) - 1, -1, -1):
            weights[:, j] = np.clip(np.round(rest / values[j]), -wgt_max, wgt_max)
            rest -= weights[:, j] * values[j]
        if not rest.any():
            return tuple(values), weights
    return None


def im2col_host_convs(config: AcceleratorConfig) -> Callable[[Graph], Graph]:
    """The pass for `config` (Graph -> Graph): a qconv2d that reads a ``quantize`` output and whose
    reduction shrinks (see :func:`unfolds`) reads a ``qim2col`` of it instead, as a 1x1 convolution."""
    block = act_block(config)
    act_max, wgt_max = (1 << (config.inp_width - 1)) - 1, (1 << (config.wgt_width - 1)) - 1

    def im2col_graph(graph: Graph) -> Graph:
        g = graph.copy()
        producers = g.producers()
        nodes: list[Node] = []
        for node in g.nodes:
            x = node.inputs[0] if node.inputs else ""
            source = producers.get(x)
            if (node.op != "qconv2d" or source is None or source.op != "quantize" or "group" in node.attrs
                    or not unfolds(node.attrs["channels"][0], node.attrs["kernel"], block)):
                nodes.append(node)
                continue
            nodes += _unfold(g, node, block, act_max, wgt_max)
        g.nodes = nodes
        g.prune_values()
        return g

    return im2col_graph


def _unfold(g: Graph, conv: Node, block: int, act_max: int, wgt_max: int) -> list[Node]:
    """The qim2col layer and the 1x1 convolution that together compute `conv` (rewritten in place)."""
    x = g.values[conv.inputs[0]]
    y = g.values[conv.outputs[0]]
    kh, kw = conv.attrs["kernel"]
    channels, out = conv.attrs["channels"]
    taps = kh * kw * channels
    w_name = conv.inputs[1]
    # (O, C, kh, kw) -> (O, kh*kw*C): the order qim2col gathers a window in.
    flat = g.constants[w_name].transpose(0, 2, 3, 1).reshape(out, taps)
    steps = conv.attrs["epilogue"]
    constants: tuple[int, ...] = ()
    # The first step meets the raw accumulator: an add there is the GEMM's, on constant inputs.
    split = bias_columns(np.broadcast_to(steps[0][1], (out,)), pad_to(taps, block) - taps, act_max, wgt_max) \
        if steps and steps[0][0] in ("add_imm", "add_vec") else None
    if split is not None:
        constants, columns = split
        flat = np.concatenate([flat, columns.astype(flat.dtype)], axis=1)
        conv.attrs["epilogue"] = steps[1:]
    cols = g.unique_name(f"{conv.inputs[0]}_cols")
    g.values[cols] = Value(cols, (y.shape[0], flat.shape[1], y.shape[2], y.shape[3]), x.dtype, x.scale)  # type: ignore[index]
    unfold = Node("qim2col", [conv.inputs[0]], [cols],
                  {"kernel": (kh, kw), "strides": conv.attrs["strides"], "pads": conv.attrs["pads"],
                   "constants": constants}, g.unique_name(f"{conv.name}_im2col"))
    conv.inputs[0] = cols
    conv.inputs[1] = g.set_constant(g.unique_name(f"{w_name}_cols"), flat[:, :, None, None], g.values[w_name].dtype)
    conv.attrs.update(kernel=(1, 1), strides=(1, 1), pads=(0, 0, 0, 0), channels=(taps, out))
    return [unfold, conv]
