"""Host im2col for thin host-fed convolutions: the kernel window moves into the GEMM's reduction.

A convolution reads its input channels in blocks of the activation block (:func:`weft.core.layout.act_block`),
so an image with 3 channels padded to 16 keeps 13/16 of the GEMM core idle for every kernel tap: ResNet's
7x7/2 first layer runs at 16% of peak. When the convolution's input is quantized on the host (the float
graph input passing through ``quantize``), the host can lay it out any way it likes, so this pass inserts
a ``qim2col`` host layer that gathers each output pixel's window, ``(kh, kw, C)`` in that order, into the
channels of a new tensor, and the convolution becomes a 1x1 stride-1 one over those ``kh * kw * C``
channels: 7x7x3 = 147 channels padded to 160 instead of 49 taps of 16.

The rewrite is exact: the window's elements and the weights meet in the same products (the weights are
reordered to match), the padding positions hold the integer 0 that the convolution's own padding means
(activations are symmetric, no zero point), and the sum, the bias and the epilogue are unchanged, so the
accumulator is the same integer. It applies where it shrinks the GEMM's reduction (its blocks fall from
``kh * kw * ceil(C / B)`` to ``ceil(kh * kw * C / B)``), for ungrouped convolutions only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from weft.core.ir import Graph, Node, Value
from weft.core.layout import act_block, pad_to

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["im2col_host_convs", "unfolds"]


def unfolds(channels: int, kernel: tuple[int, int], block: int) -> bool:
    """True when gathering a `kernel` window of `channels` into the reduction needs fewer `block`-wide
    channel blocks than the convolution reading the channels tap by tap."""
    taps = kernel[0] * kernel[1]
    return taps > 1 and pad_to(taps * channels, block) < taps * pad_to(channels, block)


def im2col_host_convs(config: AcceleratorConfig) -> Callable[[Graph], Graph]:
    """The pass for `config` (Graph -> Graph): a qconv2d that reads a ``quantize`` output and whose
    reduction shrinks (see :func:`unfolds`) reads a ``qim2col`` of it instead, as a 1x1 convolution."""
    block = act_block(config)

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
            nodes += _unfold(g, node)
        g.nodes = nodes
        g.prune_values()
        return g

    return im2col_graph


def _unfold(g: Graph, conv: Node) -> list[Node]:
    """The qim2col layer and the 1x1 convolution that together compute `conv` (rewritten in place)."""
    x = g.values[conv.inputs[0]]
    y = g.values[conv.outputs[0]]
    kh, kw = conv.attrs["kernel"]
    channels, out = conv.attrs["channels"]
    taps = kh * kw * channels
    cols = g.unique_name(f"{conv.inputs[0]}_cols")
    g.values[cols] = Value(cols, (y.shape[0], taps, y.shape[2], y.shape[3]), x.dtype, x.scale)  # type: ignore[index]
    unfold = Node("qim2col", [conv.inputs[0]], [cols],
                  {"kernel": (kh, kw), "strides": conv.attrs["strides"], "pads": conv.attrs["pads"]},
                  g.unique_name(f"{conv.name}_im2col"))
    w_name = conv.inputs[1]
    w = g.constants[w_name]
    # (O, C, kh, kw) -> (O, kh*kw*C, 1, 1): the order qim2col gathers a window in.
    flat = w.transpose(0, 2, 3, 1).reshape(out, taps, 1, 1)
    conv.inputs[0] = cols
    conv.inputs[1] = g.set_constant(g.unique_name(f"{w_name}_cols"), flat, g.values[w_name].dtype)
    conv.attrs.update(kernel=(1, 1), strides=(1, 1), pads=(0, 0, 0, 0), channels=(taps, out))
    return [unfold, conv]
