"""Host kernels for the float ops of a graph: which kernel each op becomes, in which layouts.

Convolutions produce channel-blocked tensors and read whatever their producer gave (a plain NCHW input is
a block of one channel); pooling and element-wise ops keep their input's layout; every other op reads
plain tensors. Weights are packed here, once, into the order their kernel reads.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from weft.compiler.llvm import elementwise as ew
from weft.compiler.llvm import nn
from weft.compiler.llvm.depthwise import depthwise_kernel, grouped_tiles
from weft.compiler.llvm.depthwise import pack_depthwise_weights as depthwise_weights
from weft.compiler.llvm.elementwise import Operand
from weft.compiler.llvm.expr import Buffer, Expr, cast, dtype_of_numpy, maximum, minimum
from weft.compiler.llvm.hostplan import Planner, Tensor, ident
from weft.compiler.llvm.layout import PLAIN, Layout, block_for
from weft.compiler.llvm.pointwise import pointwise_applies, pointwise_kernel, pointwise_tile
from weft.compiler.llvm.te import Kernel, compute
from weft.compiler.llvm.winograd import pack_winograd_weights, winograd_applies, winograd_kernel, winograd_tile
from weft.core.errors import UnsupportedError
from weft.core.float_ops import conv_out_size, full_pads, pool_geometry, slice_index
from weft.core.ir import Graph, Node, numpy_dtype

__all__ = ["FLOAT_HANDLERS", "constant_tensor", "elementwise_handler", "plan_halos"]


def _fused_conv(p: Planner, node: Node) -> None:
    x_name, w_name, b_name = node.inputs[:3]
    res_name = node.inputs[3] if len(node.inputs) > 3 else ""
    if not (p.g.is_constant(w_name) and (not b_name or p.g.is_constant(b_name))):
        raise UnsupportedError("weights and bias must be constants", node=node.name, op=node.op)
    groups = int(node.attrs.get("group", 1))
    w = np.asarray(p.g.constants[w_name], np.float32)
    o, c, kh, kw = w.shape
    bias = np.asarray(p.g.constants[b_name], np.float32) if b_name else np.zeros(o, np.float32)
    x_shape = tuple(p.g.values[x_name].shape or ())
    act, clip = node.attrs.get("act", "none"), node.attrs.get("clip")
    out_shape = p.out_shape(node)
    cin = x_shape[1]
    depthwise = groups > 1 and groups == cin == o
    bo = block_for(o // groups, p.lanes) if groups > 1 and not depthwise else block_for(o, p.lanes)
    if len(x_shape) == 2 and groups > 1:
        raise UnsupportedError("a grouped dense layer has no host kernel", node=node.name, op=node.op)
    if len(x_shape) == 2:  # dense
        n = x_shape[0]
        x = p.get(x_name, PLAIN, node)
        args = [x, constant_tensor(p, node, "w", nn.pack_dense_weights(w.reshape(o, c), bo)),
                constant_tensor(p, node, "b", bias.reshape(o // bo, bo))]
        if res_name:
            args.append(p.get(res_name, PLAIN, node))
        kernel = nn.dense_kernel("dense", n, c, o, bo, p.target, act=act, clip=clip, residual=bool(res_name))
        p.algorithms[node.name] = "dense"
        y = p.new(node.outputs[0], out_shape, PLAIN)
        p.step(node.name, kernel, [*args, y])
        return
    src = p.get(x_name, None, node)
    if depthwise:  # channel c of the input meets channel c of the output: one block for both
        block = bo
    elif src.layout.blocked and (groups == 1 or c % src.layout.block == 0):  # (a block must not straddle groups)
        block = src.layout.block
    else:
        block = block_for(c, p.lanes) if c >= p.lanes or groups > 1 else 1
    strides = tuple(node.attrs["strides"])
    pads = tuple(node.attrs["pads"])
    t, l, b_, r = pads
    oh = conv_out_size(x_shape[2], kh, strides[0], t, b_)
    ow = conv_out_size(x_shape[3], kw, strides[1], l, r)
    converted = (x_name, Layout(block)) in p.tensors
    if src.layout.block != block and max(pads) and not converted:  # change the layout while padding: one pass
        src = _padded(p, node, src, Layout(block), pads)
        offset = (0, 0)
    else:
        src = _blocked_source(p, node, src, block)
        halo = src.layout.halo
        if max(pads) > halo:  # the producer left no border wide enough: pad into a copy
            src, offset = _padded(p, node, src, src.layout.without_halo(), pads), (0, 0)
        else:  # the zeros are already around the input: read from inside its halo
            offset = (halo - t, halo - l)
    bi = src.layout.block
    phys = src.physical
    out_halo = p.halos.get(node.outputs[0], 0) if len(out_shape) == 4 else 0
    spec = nn.ConvSpec(x_shape[0], cin, phys[2], phys[3], o, kh, kw, strides, bi, bo,  # type: ignore[arg-type]
                       offset=offset, out=(oh, ow), out_halo=out_halo)
    r_t, r_layout = None, None
    if res_name:
        if len(out_shape) == 4:
            r_t = p.get(res_name, None, node)
            if r_t.layout.block != bo:
                r_t = p.get(res_name, Layout(bo), node)
        else:
            r_t = p.get(res_name, PLAIN, node)
        r_layout = r_t.layout if r_t.layout.blocked else Layout(bo)  # (N, O) is (N, O/bo, 1, 1, bo)
    shape4 = (x_shape[0], o, oh, ow)
    residual = Operand(Buffer("residual", r_layout.physical(shape4)), shape4, r_layout) if r_layout else None
    if groups > 1:  # not tuned: host tuning times ungrouped convolutions only
        packed = depthwise_weights(w, bo) if depthwise else nn.pack_conv_weights(w, bi, bo)
        p.algorithms[node.name] = "depthwise" if depthwise else "grouped"
        if depthwise:
            kernel = depthwise_kernel("dwconv", spec, p.target, act=act, clip=clip, residual=residual)
        else:
            kernel = nn.conv_kernel("gconv", spec, p.target, act=act, clip=clip, residual=residual,
                                    tiles=grouped_tiles(ow, p.target), groups=groups)
    else:  # the direct kernel comes from its workload, exactly as host tuning builds and times it
        workload = nn.ConvWorkload(spec, act, clip, r_layout)
        schedule = p.tuned.get(workload.key)
        p.convs[node.name] = (workload, schedule or nn.ConvSchedule.default(spec, p.target), schedule is not None)
        # a tuning log's schedule is the direct kernel's: untuned 3x3 stride-1 convolutions with tiles enough
        # for the target's vectors take Winograd's, untuned 1x1 ones the pixel-axis product where the direct
        # kernel's rows tile poorly (both shaped and measured on CPUs: a GPU keeps the direct kernel)
        packed = nn.pack_conv_weights(w, bi, bo)
        cpu = schedule is None and p.target.kind == "cpu"
        tile = winograd_tile(spec, p.target) if cpu and winograd_applies(spec) else 0
        if tile:
            packed = pack_winograd_weights(w, bi, bo, tile)
            kernel = winograd_kernel("wconv", spec, p.target, act=act, clip=clip, residual=residual, tile=tile)
            p.algorithms[node.name] = f"winograd F({tile}x{tile})"
        elif cpu and len(out_shape) == 4 and pointwise_applies(spec, p.target):
            kernel = pointwise_kernel("pconv", spec, p.target, act=act, clip=clip, residual=residual)
            p.algorithms[node.name] = "pointwise {}x{}".format(*pointwise_tile(spec, p.target))
        else:
            kernel = workload.kernel(p.target, schedule)
            chosen = p.convs[node.name][1]
            shape = f" {chosen.r}x{chosen.ocb}" if p.target.kind == "cpu" else ""  # (a GPU maps it otherwise)
            p.algorithms[node.name] = "direct" + shape + (" (tuned)" if schedule else "")
    args = [src, constant_tensor(p, node, "w", packed), constant_tensor(p, node, "b", bias.reshape(o // bo, bo))]
    if r_t is not None:
        args.append(r_t)
    if len(out_shape) == 2:  # a dense layer over a whole image: (N, O/bo, 1, 1, bo) is (N, O)
        y = p.new(node.outputs[0], out_shape, PLAIN)
    else:
        y = p.new(node.outputs[0], out_shape, Layout(bo, out_halo))
    p.step(node.name, kernel, [*args, y])


def _padded(p: Planner, node: Node, src: Tensor, layout: Layout, pads: tuple[int, ...]) -> Tensor:
    """A zero-padded copy of NCHW `src` in `layout`."""
    t, l, b, r = pads
    n, c, h, w = src.shape
    padded = p.new(f"{node.name}.padded", (n, c, h + t + b, w + l + r), layout, primary=False)
    kernel = ew.pad_kernel("pad", src.operand("x"), (0, 0, t, l, 0, 0, b, r), 0.0, p.target, out_layout=layout)
    p.step(node.name, kernel, [src, padded])
    return padded


def _blocked_source(p: Planner, node: Node, src: Tensor, block: int) -> Tensor:
    """`src` in channel blocks of `block` (a block of one: the plain bytes)."""
    if src.layout.blocked and src.layout.block == block:
        return src
    if block > 1:
        return p.get(src.name, Layout(block), node)
    return _as_block1(p, src if not src.layout.blocked else p.get(src.name, PLAIN, node))


def plan_halos(graph: Graph) -> dict[str, int]:
    """Outputs of convolutions (and of pools of convolutions) that only convolutions read, some of them
    with pads: the widest of those pads, as the halo the producer writes around its output (so that no
    pad kernel runs in between)."""
    readers = graph.consumers()
    producers = graph.producers()
    halos = {}
    for node in graph.nodes:
        out = node.outputs[0]
        if len(graph.values[out].shape or ()) != 4 or out in graph.outputs:
            continue
        source = producers.get(node.inputs[0]) if node.inputs else None
        pooled_blocks = node.op in ("MaxPool", "AveragePool") and source is not None and source.op == "FusedConv"
        if node.op != "FusedConv" and not pooled_blocks:  # only these write channel-blocked outputs
            continue
        users = readers.get(out, [])
        if not users or any(u.op != "FusedConv" or len(graph.values[u.inputs[0]].shape or ()) != 4 for u in users):
            continue
        if any(out in u.inputs[1:3] for u in users):  # read as weights or bias: not an activation
            continue
        widest = max((max(u.attrs["pads"]) for u in users if u.inputs[0] == out), default=0)
        if widest:
            halos[out] = widest
    return halos


def _as_block1(p: Planner, t: Tensor) -> Tensor:
    """A plain NCHW tensor seen as (N, C, H, W, 1): the same bytes."""
    key = (t.name, Layout(1))
    if key not in p.tensors:
        p.alias_same(t.name, t.root() if t.alias_of is None else t, Layout(1))
    return p.tensors[key]


def constant_tensor(p: Planner, node: Node, what: str, array: np.ndarray) -> Tensor:
    """`array` (packed for a kernel) as a constant tensor of the plan, named after `node`."""
    t = Tensor(f"{node.name}.{what}", tuple(array.shape), PLAIN, dtype_of_numpy(array.dtype),
               np.ascontiguousarray(array), constant=True)
    p.all.append(t)
    return t


def _pool(p: Planner, node: Node) -> None:
    src = p.get(node.inputs[0], None, node)
    if len(src.shape) != 4:
        raise UnsupportedError(f"pooling needs an NCHW input, got shape {list(src.shape)}", node=node.name, op=node.op)
    kernel_hw, strides, pads, out_hw = pool_geometry(node, src.shape)
    if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", ""):
        raise UnsupportedError("auto_pad must be resolved to explicit pads", node=node.name, op=node.op)
    for key in ("dilations",):
        if any(d != 1 for d in node.attrs.get(key, (1, 1))):
            raise UnsupportedError(f"{key} other than 1 are not supported", node=node.name, op=node.op)
    kind = "max" if node.op == "MaxPool" else "avg"
    halo = p.halos.get(node.outputs[0], 0) if src.layout.blocked else 0
    kernel = nn.pool_kernel("pool", src.operand("x"), kind, kernel_hw, strides, pads, out_hw,  # type: ignore[arg-type]
                            p.target, count_include_pad=bool(node.attrs.get("count_include_pad", 0)), out_halo=halo)
    y = p.new(node.outputs[0], p.out_shape(node), Layout(src.layout.block, halo) if halo else src.layout.without_halo())
    p.step(node.name, kernel, [src, y])


def global_pool(p: Planner, node: Node) -> None:
    """GlobalAveragePool or GlobalMaxPool on an NCHW tensor, in its layout less any halo."""
    src = p.get(node.inputs[0], None, node)
    if len(src.shape) != 4:
        raise UnsupportedError(f"global pooling needs an NCHW input, got shape {list(src.shape)}",
                               node=node.name, op=node.op)
    y = p.new(node.outputs[0], p.out_shape(node), src.layout.without_halo())
    kind, name = ("max", "gmp") if node.op == "GlobalMaxPool" else ("avg", "gap")
    p.step(node.name, nn.global_pool_kernel(name, src.operand("x"), p.target, kind=kind), [src, y])


def elementwise_handler(fn: Callable[[Node, list[Expr]], Expr]) -> Callable[[Planner, Node], None]:
    """The handler of an element-wise op: ``fn(node, inputs)`` on inputs broadcast numpy-style, in the
    layout of its full-size inputs when they share one (else plain)."""
    def handler(p: Planner, node: Node) -> None:
        out_shape = p.out_shape(node)
        names = [x for x in node.inputs if x]
        tensors = [p.get(x, None, node) for x in names]
        full = [t for t in tensors if not t.constant and t.shape == out_shape]
        layout = full[0].layout.without_halo() if full and all(
            t.layout.without_halo() == full[0].layout.without_halo() for t in full) else PLAIN
        args = []
        for t in tensors:
            if t.constant or t.shape != out_shape:
                if t.layout != PLAIN:
                    t = p.get(t.name, PLAIN, node)
            elif t.layout.without_halo() != layout:
                t = p.get(t.name, layout, node)
            args.append(t)
        operands = [t.operand(f"in{k}") for k, t in enumerate(args)]
        dtype = operands[0].buffer.dtype
        kernel = ew.elementwise_kernel(ident(node.op.lower()), out_shape, layout, operands,
                                       lambda *xs: fn(node, list(xs)), p.target, dtype=dtype)
        y = p.new(node.outputs[0], out_shape, layout, dtype)
        p.step(node.name, kernel, [*args, y])

    return handler


def _clip(node: Node, xs: list[Expr]) -> Expr:
    y = xs[0]
    # Clip's bounds are optional inputs: which ones are present decides what xs[1:] are
    k = 1
    for pos in (1, 2):
        if len(node.inputs) > pos and node.inputs[pos]:
            y = maximum(y, xs[k]) if pos == 1 else minimum(y, xs[k])
            k += 1
    return y


def _bn(p: Planner, node: Node) -> None:
    x, scale, bias, mean, var = node.inputs
    if not all(p.g.is_constant(v) for v in (scale, bias, mean, var)):
        raise UnsupportedError("BatchNormalization statistics must be constants", node=node.name, op=node.op)
    g = p.g.constants
    inv = (g[scale] / np.sqrt(g[var].astype(np.float64) + node.attrs.get("epsilon", 1e-5))).astype(np.float32)
    rank = len(p.out_shape(node))
    shape = (-1,) + (1,) * (rank - 2)
    consts = [np.ascontiguousarray(a.astype(np.float32).reshape(shape)) for a in (g[mean], inv, g[bias])]
    _affine_like(p, node, x, consts, lambda xs: (xs[0] - xs[1]) * xs[2] + xs[3])


def _channel_affine(p: Planner, node: Node) -> None:
    x, scale, shift = node.inputs
    rank = len(p.out_shape(node))
    shape = (-1,) + (1,) * (rank - 2)
    consts = [np.ascontiguousarray(np.asarray(p.g.constants[v], np.float32).reshape(shape)) for v in (scale, shift)]
    act = node.attrs.get("act", "none")  # a Relu the host planner fused (fusion.fuse_host_affine)
    _affine_like(p, node, x, consts, lambda xs: nn.activation(xs[0] * xs[1] + xs[2], act))


def _affine_like(p: Planner, node: Node, x: str, consts: list[np.ndarray], fn: Callable[[list[Expr]], Expr]) -> None:
    src = p.get(x, None, node)
    out_shape = p.out_shape(node)
    ctensors = [constant_tensor(p, node, f"c{k}", c) for k, c in enumerate(consts)]
    operands = [src.operand("x"), *[t.operand(f"c{k}") for k, t in enumerate(ctensors)]]
    layout = src.layout.without_halo()
    kernel = ew.elementwise_kernel("affine", out_shape, layout, operands, lambda *xs: fn(list(xs)), p.target)
    y = p.new(node.outputs[0], out_shape, layout)
    p.step(node.name, kernel, [src, *ctensors, y])


def _reshape(p: Planner, node: Node) -> None:
    src = p.get(node.inputs[0], PLAIN, node)
    p.alias(node.outputs[0], src, p.out_shape(node))


def _shape(p: Planner, node: Node) -> None:
    p.fold_static(node)


def _softmax(p: Planner, node: Node) -> None:
    src = p.get(node.inputs[0], PLAIN, node)
    shape = src.shape
    axis = node.attrs.get("axis", -1) % max(len(shape), 1)
    if node.attrs.get("legacy", False):
        outer = int(np.prod(shape[:axis], dtype=np.int64))
        kernel = nn.softmax_kernel("softmax", (outer, int(np.prod(shape[axis:], dtype=np.int64))), 1, p.target)
    else:
        kernel = nn.softmax_kernel("softmax", shape, axis, p.target)
    y = p.new(node.outputs[0], shape, PLAIN)
    p.step(node.name, kernel, [src, y])


def _concat(p: Planner, node: Node) -> None:
    out_shape = p.out_shape(node)
    parts = [p.get(x, None, node) for x in node.inputs]
    block = parts[0].layout.block
    # channel blocks stacked: a concatenation of whole blocks needs no conversion of its parts or its readers
    blocked = (len(out_shape) == 4 and node.attrs["axis"] % 4 == 1 and parts[0].layout.blocked
               and all(t.layout.blocked and t.layout.block == block and t.shape[1] % block == 0 for t in parts))
    operands = [t.operand(f"in{k}") for k, t in enumerate(parts)]
    if blocked:
        kernel, layout = ew.block_concat_kernel("concat", operands, p.target), Layout(block)
    else:
        parts = [p.get(x, PLAIN, node) for x in node.inputs]
        operands = [t.operand(f"in{k}") for k, t in enumerate(parts)]
        kernel, layout = ew.concat_kernel("concat", operands, node.attrs["axis"], PLAIN, p.target), PLAIN
    y = p.new(node.outputs[0], out_shape, layout)
    p.step(node.name, kernel, [*parts, y])
    # whole channel blocks of one image, or plain parts with only ones before the axis: each part is one
    # contiguous range of the output, which its producer can write in place (graph.concat_in_place)
    if (out_shape[0] == 1) if blocked else int(np.prod(out_shape[:node.attrs["axis"] % len(out_shape)])) == 1:
        p.steps[-1].kind = "concat_ranges"


def _pad(p: Planner, node: Node) -> None:
    src = p.get(node.inputs[0], PLAIN, node)
    if not all(p.g.is_constant(x) for x in node.inputs[1:] if x):
        raise UnsupportedError("pads, value and axes must be constants", node=node.name, op=node.op)
    if node.attrs.get("mode", "constant") != "constant":
        raise UnsupportedError(f"pad mode '{node.attrs.get('mode')}' is not supported", node=node.name, op=node.op)
    axes = p.g.constants[node.inputs[3]] if len(node.inputs) > 3 and node.inputs[3] else None
    pads = full_pads(node, len(src.shape), p.g.constants[node.inputs[1]], axes)
    value = float(p.g.constants[node.inputs[2]].item()) if len(node.inputs) > 2 and node.inputs[2] else 0.0
    kernel = ew.pad_kernel("pad", src.operand("x"), [int(v) for v in pads], value, p.target)
    y = p.new(node.outputs[0], p.out_shape(node), PLAIN)
    p.step(node.name, kernel, [src, y])


def _slice(p: Planner, node: Node) -> None:
    src = p.get(node.inputs[0], PLAIN, node)
    if not all(p.g.is_constant(x) for x in node.inputs[1:] if x):
        raise UnsupportedError("starts, ends, axes and steps must be constants", node=node.name, op=node.op)

    extra = [p.g.constants[node.inputs[k]] if len(node.inputs) > k and node.inputs[k] else None for k in (3, 4)]
    index = slice_index(node, src.shape, p.g.constants[node.inputs[1]], p.g.constants[node.inputs[2]], *extra)
    bounds = [s.indices(d) for s, d in zip(index, src.shape, strict=True)]
    starts = [b[0] for b in bounds]
    steps = [b[2] for b in bounds]
    out_shape = p.out_shape(node)
    if any(d == 0 for d in out_shape):
        raise UnsupportedError("empty slices are not supported", node=node.name, op=node.op)
    kernel = ew.slice_kernel("slice", src.operand("x"), starts, steps, out_shape, p.target)
    y = p.new(node.outputs[0], out_shape, PLAIN)
    p.step(node.name, kernel, [src, y])


def _cast(p: Planner, node: Node) -> None:
    src = p.get(node.inputs[0], PLAIN, node)
    to = node.attrs["to"]
    if to not in ("float32", "float64", "int32", "int64", "int8", "uint8", "int16"):
        raise UnsupportedError(f"cast to {to} is not supported", node=node.name, op=node.op)
    dtype = dtype_of_numpy(numpy_dtype(to))
    kernel = ew.elementwise_kernel("cast", src.shape, PLAIN, [src.operand("x")], lambda x: cast(dtype, x), p.target,
                                   dtype=dtype)
    y = p.new(node.outputs[0], src.shape, PLAIN, dtype)
    p.step(node.name, kernel, [src, y])


def _matmul(p: Planner, node: Node) -> None:
    a_t, b_t = (p.get(x, PLAIN, node) for x in node.inputs[:2])
    a_shape, b_shape = a_t.shape, b_t.shape
    a2 = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b2 = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    nb = int(np.prod(batch, dtype=np.int64))
    m, k, n = a2[-2], a2[-1], b2[-1]
    a_in = _broadcast_to(p, node, a_t, a2, (*batch, m, k))
    b_in = _broadcast_to(p, node, b_t, b2, (*batch, k, n))
    kernel = nn.matmul_kernel("matmul", nb, m, k, n, p.target)
    y = p.new(node.outputs[0], p.out_shape(node), PLAIN)
    p.step(node.name, kernel, [a_in, b_in, y])


def _broadcast_to(p: Planner, node: Node, t: Tensor, view: tuple[int, ...], shape: tuple[int, ...]) -> Tensor:
    """`t` (seen with shape `view`) materialized at `shape` when broadcasting changes it."""
    v = Tensor(t.name, view, PLAIN, t.dtype, alias_of=t)
    p.all.append(v)
    if tuple(view) == tuple(shape):
        return v
    out = Tensor(f"{node.name}.{ident(t.name)}.bcast", shape, PLAIN, t.dtype)
    p.all.append(out)
    kernel = ew.elementwise_kernel("broadcast", shape, PLAIN, [v.operand("x")], lambda x: x, p.target, dtype=t.dtype)
    p.step(node.name, kernel, [v, out])
    return out


def _gemm(p: Planner, node: Node) -> None:
    a_t, b_t = (p.get(x, PLAIN, node) for x in node.inputs[:2])
    if node.attrs.get("transA", 0):
        a_t = _transpose(p, node, a_t)
    if node.attrs.get("transB", 0):
        b_t = _transpose(p, node, b_t)
    m, k = a_t.shape
    n = b_t.shape[1]
    prod = p.new(f"{node.name}.ab", (m, n), PLAIN, primary=False)
    p.step(node.name, nn.matmul_kernel("matmul", 1, m, k, n, p.target), [a_t, b_t, prod])
    alpha = float(node.attrs.get("alpha", 1.0))
    beta = float(node.attrs.get("beta", 1.0))
    args = [prod]
    if len(node.inputs) > 2 and node.inputs[2]:
        args.append(p.get(node.inputs[2], PLAIN, node))

    def fn(*xs: Expr) -> Expr:
        y = xs[0] * alpha if alpha != 1.0 else xs[0]
        if len(xs) > 1:
            y = y + (xs[1] * beta if beta != 1.0 else xs[1])
        return y

    operands = [t.operand(f"in{k}") for k, t in enumerate(args)]
    kernel = ew.elementwise_kernel("gemm_epilogue", (m, n), PLAIN, operands, fn, p.target)
    y = p.new(node.outputs[0], (m, n), PLAIN)
    p.step(node.name, kernel, [*args, y])


def _transpose(p: Planner, node: Node, t: Tensor) -> Tensor:
    r, c = t.shape
    out = Tensor(f"{node.name}.{ident(t.name)}.T", (c, r), PLAIN, t.dtype)
    p.all.append(out)
    src = t.operand("x")

    stage = compute("xt", (c, r), lambda i, j: src.buffer[j, i], dtype=t.dtype)
    ew.schedule_elementwise(stage, p.target)
    p.step(node.name, Kernel("transpose", [src.buffer], [stage.out], [stage]), [t, out])
    return out


def _binary(op: str) -> Callable[[Node, list[Expr]], Expr]:
    def fn(node: Node, xs: list[Expr]) -> Expr:
        a, b = xs
        return {"Add": lambda: a + b, "Sub": lambda: a - b, "Mul": lambda: a * b, "Div": lambda: a / b}[op]()

    return fn


FLOAT_HANDLERS: dict[str, Callable[[Planner, Node], None]] = {
    "FusedConv": _fused_conv,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "GlobalAveragePool": global_pool,
    "Relu": elementwise_handler(lambda n, xs: maximum(xs[0], 0.0)),
    "Clip": elementwise_handler(_clip),
    "Add": elementwise_handler(_binary("Add")),
    "Sub": elementwise_handler(_binary("Sub")),
    "Mul": elementwise_handler(_binary("Mul")),
    "Div": elementwise_handler(_binary("Div")),
    "ChannelAffine": _channel_affine,
    "BatchNormalization": _bn,
    "Identity": _reshape,
    "Flatten": _reshape,
    "Reshape": _reshape,
    "Squeeze": _reshape,
    "Unsqueeze": _reshape,
    "Softmax": _softmax,
    "Concat": _concat,
    "Pad": _pad,
    "Slice": _slice,
    "Cast": _cast,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Shape": _shape,
}


