"""Test models built in code: ONNX graphs with seeded weights, so nothing is ever downloaded.

The compiler needs real networks to import, quantize, compile and run: the ResNet-18 of the demo, small
ResNet- and VGG-style CNNs, MobileNetV2- and ResNeXt-style CNNs (depthwise and grouped convolutions), an MLP
with batch > 1, models with awkward shapes (channel counts that are not block multiples, stride 2,
asymmetric padding, 1x1 and 7x7 kernels, Concat, Sum, Clip) and one whose shape subgraph folds to
constants. A small CNN trained here in numpy on scikit-learn's digits gives the
quantizer a model whose accuracy means something.

Every graph is written with ``onnx.helper`` for a chosen opset (9 to the newest onnx knows), each op in
the form its opset expects (Clip bounds, Pad pads, Dropout ratio, Unsqueeze axes as attributes before
they became inputs), and passes ``onnx.checker.check_model(full_check=True)`` before it is returned.
Every builder is deterministic for its seed.

BatchNorm statistics are "random but sane": each BN's running mean and variance are measured on a seeded
random input while the graph is built (a float64 numpy forward pass), then perturbed, so BN outputs are
roughly ``gamma * N(0, 1) + beta`` as in a trained network instead of exploding or vanishing with depth;
the last BN of each residual block gets a small gamma so the residual sum grows slowly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper, numpy_helper

from weft.errors import UsageError

__all__ = [
    "DEFAULT_OPSET",
    "MIN_OPSET",
    "MOBILENET_V2_BLOCKS",
    "MODELS",
    "accuracy",
    "awkward_cnn",
    "batched_runner",
    "build",
    "count_macs",
    "count_parameters",
    "digits_data",
    "max_opset",
    "mlp",
    "mobilenet_v2",
    "mobilenet_v2_224",
    "reshape_net",
    "resnet18",
    "resnext",
    "save",
    "small_resnet",
    "train_digits_cnn",
    "vgg_small",
]

DEFAULT_OPSET = 17
#: The oldest opset the builders can express (ConstantOfShape and BatchNormalization without `spatial`).
MIN_OPSET = 9
_BN_EPS = 1e-5


def max_opset() -> int:
    """The newest default-domain opset the installed onnx package knows."""
    return onnx.defs.onnx_opset_version()


def _check_args(opset: int, batch: int, num_classes: int = 1) -> None:
    if not MIN_OPSET <= opset <= max_opset():
        raise UsageError(f"opset {opset} is outside the supported range {MIN_OPSET}..{max_opset()}")
    if batch < 1:
        raise UsageError(f"batch must be at least 1, got {batch}")
    if num_classes < 1:
        raise UsageError(f"num_classes must be at least 1, got {num_classes}")


# ---- graph builder ---------------------------------------------------------------------------------


class _Graph:
    """Collects nodes and initializers of one model and writes each op the way its opset spells it.

    A node's output tensor takes the node's name, so names in the graph read like module paths
    ("layer2.0.conv1") and error messages downstream can name the culprit.
    """

    def __init__(self, name: str, opset: int):
        self.name = name
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self._names: set[str] = set()

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"model '{self.name}': tensor name '{name}' is used twice")
        self._names.add(name)
        return name

    def input(self, name: str, shape: Sequence[int]) -> str:
        self.inputs.append(helper.make_tensor_value_info(self._claim(name), TensorProto.FLOAT, list(shape)))
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(value), self._claim(name)))
        return name

    def op(self, op_type: str, inputs: Sequence[str], name: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op_type, list(inputs), [self._claim(name)], name=name, **attrs))
        return name

    # Ops whose form changed across opsets.

    def clip(self, x: str, lo: float, hi: float, name: str) -> str:
        if self.opset < 11:
            return self.op("Clip", [x], name, min=lo, max=hi)
        lo_name = self.const(f"{name}.min", np.array(lo, np.float32))
        hi_name = self.const(f"{name}.max", np.array(hi, np.float32))
        return self.op("Clip", [x, lo_name, hi_name], name)

    def pad(self, x: str, pads: Sequence[int], name: str) -> str:
        """Constant zero padding; ``pads`` is ONNX order: all begins, then all ends."""
        if self.opset < 11:
            return self.op("Pad", [x], name, pads=list(pads), mode="constant", value=0.0)
        pads_name = self.const(f"{name}.pads", np.array(pads, np.int64))
        return self.op("Pad", [x, pads_name], name, mode="constant")

    def dropout(self, x: str, ratio: float, name: str) -> str:
        if self.opset < 12:
            return self.op("Dropout", [x], name, ratio=ratio)
        return self.op("Dropout", [x, self.const(f"{name}.ratio", np.array(ratio, np.float32))], name)

    def unsqueeze(self, x: str, axes: Sequence[int], name: str) -> str:
        if self.opset < 13:
            return self.op("Unsqueeze", [x], name, axes=list(axes))
        return self.op("Unsqueeze", [x, self.const(f"{name}.axes", np.array(axes, np.int64))], name)

    def constant(self, value: np.ndarray, name: str) -> str:
        """A Constant node (not an initializer): the frontend has to fold it."""
        return self.op("Constant", [], name, value=numpy_helper.from_array(np.asarray(value), f"{name}.value"))

    def model(self, outputs: Sequence[tuple[str, Sequence[int]]], doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, self.name, self.inputs,
            [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)) for name, shape in outputs],
            initializer=self.initializers, doc_string=doc,
        )
        opset = helper.make_opsetid("", self.opset)
        model = helper.make_model(
            graph, opset_imports=[opset], ir_version=helper.find_min_ir_version_for([opset]),
            producer_name="weft.compiler.models", doc_string=doc,
        )
        onnx.checker.check_model(model, full_check=True)
        return model


# ---- numpy kernels: the calibration forward pass and the digits training -----------------------------


def _im2col(x: np.ndarray, k: int, stride: int, pads: Sequence[int]) -> tuple[np.ndarray, int, int]:
    """Rows of receptive fields: [N*Ho*Wo, C*k*k], column order (c, kh, kw) like a flattened OIHW weight.

    ``pads`` is (top, left, bottom, right), the order of ONNX Conv ``pads`` on 2-D images.
    """
    top, left, bottom, right = pads
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    windows = sliding_window_view(padded, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
    n, c, ho, wo = windows.shape[:4]
    return windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * ho * wo, c * k * k), ho, wo


def _col2im(dcols: np.ndarray, x_shape: Sequence[int], k: int, stride: int, pads: Sequence[int]) -> np.ndarray:
    """The adjoint of :func:`_im2col`: scatter-add receptive-field gradients back onto the image."""
    n, c, h, w = x_shape
    top, left, bottom, right = pads
    ho = (h + top + bottom - k) // stride + 1
    wo = (w + left + right - k) // stride + 1
    fields = dcols.reshape(n, ho, wo, c, k, k)
    out = np.zeros((n, c, h + top + bottom, w + left + right), dcols.dtype)
    for i in range(k):
        for j in range(k):
            out[:, :, i:i + stride * ho:stride, j:j + stride * wo:stride] += fields[..., i, j].transpose(0, 3, 1, 2)
    return out[:, :, top:top + h, left:left + w]


def _conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int, pads: Sequence[int]) -> np.ndarray:
    cols, ho, wo = _im2col(x, w.shape[2], stride, pads)
    y = cols @ w.reshape(w.shape[0], -1).T
    if b is not None:
        y += b
    return y.reshape(x.shape[0], ho, wo, w.shape[0]).transpose(0, 3, 1, 2)


def _maxpool2d(x: np.ndarray, k: int, stride: int, pad: int) -> np.ndarray:
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
    return sliding_window_view(padded, (k, k), axis=(2, 3))[:, :, ::stride, ::stride].max(axis=(4, 5))


# ---- weight initialisers (torchvision's choices) ----------------------------------------------------


def _he_conv(rng: np.random.Generator, cout: int, cin: int, k: int) -> np.ndarray:
    """Kaiming normal, mode fan_out, ReLU gain: torchvision's ResNet and VGG convolution init."""
    return (rng.standard_normal((cout, cin, k, k)) * math.sqrt(2.0 / (cout * k * k))).astype(np.float32)


def _linear(rng: np.random.Generator, cout: int, cin: int) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's default nn.Linear init: weight and bias uniform in +-1/sqrt(fan_in)."""
    bound = 1.0 / math.sqrt(cin)
    weight = rng.uniform(-bound, bound, (cout, cin)).astype(np.float32)
    return weight, rng.uniform(-bound, bound, cout).astype(np.float32)


def _he_dense(rng: np.random.Generator, cin: int, cout: int) -> np.ndarray:
    """Kaiming normal over fan_in, as a [cin, cout] MatMul operand."""
    return (rng.standard_normal((cin, cout)) * math.sqrt(2.0 / cin)).astype(np.float32)


# ---- ResNets ----------------------------------------------------------------------------------------


@dataclass
class _Flow:
    """A tensor under construction: its graph name and its value on the calibration input (float64)."""

    name: str
    value: np.ndarray


class _ResNetBuilder:
    """Emits ResNet layers into a graph while running them on a calibration input to set BN statistics."""

    def __init__(self, graph: _Graph, rng: np.random.Generator):
        self.g = graph
        self.rng = rng

    def conv(self, x: _Flow, name: str, cout: int, k: int, stride: int, group: int = 1) -> _Flow:
        cin = x.value.shape[1]
        w = _he_conv(self.rng, cout, cin // group, k)
        pad = k // 2
        # PyTorch's exporter writes `group` on every Conv; the older models here leave it at its default.
        extra = {"group": group} if group != 1 else {}
        out = self.g.op("Conv", [x.name, self.g.const(f"{name}.weight", w)], name,
                        kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, **extra)
        og, cg = cout // group, cin // group
        value = np.concatenate([_conv2d(x.value[:, j * cg:(j + 1) * cg], w[j * og:(j + 1) * og].astype(np.float64),
                                        None, stride, [pad] * 4) for j in range(group)], axis=1)
        return _Flow(out, value)

    def bn(self, x: _Flow, name: str, gamma_range: tuple[float, float] = (0.75, 1.25)) -> _Flow:
        channels = x.value.shape[1]
        mean = x.value.mean(axis=(0, 2, 3))
        var = x.value.var(axis=(0, 2, 3))
        # Perturbed measured statistics: random, yet each channel comes out with roughly unit variance.
        running_mean = mean + 0.1 * np.sqrt(var + _BN_EPS) * self.rng.standard_normal(channels)
        running_var = np.maximum(var, 1e-4) * self.rng.uniform(0.8, 1.25, channels)
        gamma = self.rng.uniform(*gamma_range, channels)
        beta = 0.1 * self.rng.standard_normal(channels)
        params = [gamma, beta, running_mean, running_var]
        names = [self.g.const(f"{name}.{p}", v.astype(np.float32))
                 for p, v in zip(("weight", "bias", "running_mean", "running_var"), params, strict=True)]
        out = self.g.op("BatchNormalization", [x.name, *names], name, epsilon=_BN_EPS)
        gamma, beta, running_mean, running_var = (v.astype(np.float32).astype(np.float64) for v in params)
        scale = gamma / np.sqrt(running_var + _BN_EPS)
        value = x.value * scale[:, None, None] + (beta - running_mean * scale)[:, None, None]
        return _Flow(out, value)

    def relu(self, x: _Flow, name: str) -> _Flow:
        return _Flow(self.g.op("Relu", [x.name], name), np.maximum(x.value, 0.0))

    def relu6(self, x: _Flow, name: str) -> _Flow:
        """nn.ReLU6, which PyTorch exports as Clip(0, 6)."""
        return _Flow(self.g.clip(x.name, 0.0, 6.0, name), np.clip(x.value, 0.0, 6.0))

    def add(self, a: _Flow, b: _Flow, name: str) -> _Flow:
        return _Flow(self.g.op("Add", [a.name, b.name], name), a.value + b.value)

    def basic_block(self, x: _Flow, name: str, cout: int, stride: int) -> _Flow:
        """torchvision's BasicBlock: conv3x3-BN-ReLU-conv3x3-BN, plus identity or 1x1/stride downsample."""
        y = self.relu(self.bn(self.conv(x, f"{name}.conv1", cout, 3, stride), f"{name}.bn1"), f"{name}.relu1")
        # A small gamma on the block's last BN keeps the residual sum from growing block after block.
        y = self.bn(self.conv(y, f"{name}.conv2", cout, 3, 1), f"{name}.bn2", gamma_range=(0.2, 0.5))
        identity = x
        if stride != 1 or x.value.shape[1] != cout:
            identity = self.bn(self.conv(x, f"{name}.downsample.0", cout, 1, stride), f"{name}.downsample.1")
        added = self.g.op("Add", [y.name, identity.name], f"{name}.add")
        return self.relu(_Flow(added, y.value + identity.value), f"{name}.relu2")

    def head(self, x: _Flow, num_classes: int) -> str:
        """GlobalAveragePool -> Flatten -> Gemm (nn.Linear) to the graph output "logits"."""
        pooled = self.g.op("GlobalAveragePool", [x.name], "avgpool")
        flat = self.g.op("Flatten", [pooled], "flatten", axis=1)
        weight, bias = _linear(self.rng, num_classes, x.value.shape[1])
        return self.g.op("Gemm", [flat, self.g.const("fc.weight", weight), self.g.const("fc.bias", bias)],
                         "logits", transB=1)


def _resnet(name: str, seed: int, batch: int, image: int, num_classes: int, opset: int,
            stem: tuple[int, int, int, bool], stages: Sequence[tuple[int, int, int]], doc: str) -> onnx.ModelProto:
    """A ResNet with BasicBlocks. stem = (width, kernel, stride, maxpool); stages = (width, blocks, stride)."""
    _check_args(opset, batch, num_classes)
    g = _Graph(name, opset)
    rng = np.random.default_rng(seed)
    # The calibration input is batch 1 whatever the model's batch, so weights depend on the seed alone.
    calibration = np.random.default_rng([seed, 0xCA1B]).standard_normal((1, 3, image, image))
    net = _ResNetBuilder(g, rng)
    x = _Flow(g.input("input", [batch, 3, image, image]), calibration)
    width, kernel, stride, maxpool = stem
    x = net.relu(net.bn(net.conv(x, "conv1", width, kernel, stride), "bn1"), "relu")
    if maxpool:
        out = g.op("MaxPool", [x.name], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
        x = _Flow(out, _maxpool2d(x.value, 3, 2, 1))
    for index, (stage_width, blocks, stage_stride) in enumerate(stages, start=1):
        for block in range(blocks):
            x = net.basic_block(x, f"layer{index}.{block}", stage_width, stage_stride if block == 0 else 1)
    logits = net.head(x, num_classes)
    return g.model([(logits, [batch, num_classes])], doc)


def resnet18(seed: int = 0, batch: int = 1, num_classes: int = 1000, opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    """torchvision's ResNet-18 topology on [batch, 3, 224, 224] "input" -> [batch, num_classes] "logits".

    conv1 7x7/2 -> BN -> ReLU -> MaxPool 3x3/2 -> 4 stages of 2 BasicBlocks (64, 128, 256, 512; 1x1/2
    downsample conv + BN on the first block of stages 2-4) -> GlobalAveragePool -> Flatten -> Gemm.
    Initializers carry torchvision's parameter names (``layer2.0.downsample.0.weight``...).
    """
    return _resnet("resnet18", seed, batch, 224, num_classes, opset, (64, 7, 2, True),
                   [(64, 2, 1), (128, 2, 2), (256, 2, 2), (512, 2, 2)],
                   f"ResNet-18 (torchvision topology), seeded He init and calibrated random BN, seed {seed}")


def small_resnet(seed: int = 0, batch: int = 1, num_classes: int = 10, opset: int = DEFAULT_OPSET,
                 widths: Sequence[int] = (16, 32, 64)) -> onnx.ModelProto:
    """A CIFAR-sized ResNet on [batch, 3, 32, 32]: a 3x3 stem, one BasicBlock per width (stride 2 and a
    1x1 downsample from the second on), GlobalAveragePool, Flatten, Gemm to "logits"."""
    stages = [(width, 1, 1 if i == 0 else 2) for i, width in enumerate(widths)]
    return _resnet("small_resnet", seed, batch, 32, num_classes, opset, (widths[0], 3, 1, False), stages,
                   f"small ResNet, widths {list(widths)}, seed {seed}")


# ---- grouped convolutions: MobileNetV2 and ResNeXt ----------------------------------------------------


def _start(name: str, seed: int, batch: int, image: int, num_classes: int, opset: int
           ) -> tuple[_Graph, _ResNetBuilder, _Flow]:
    _check_args(opset, batch, num_classes)
    g = _Graph(name, opset)
    calibration = np.random.default_rng([seed, 0xCA1B]).standard_normal((1, 3, image, image))
    return g, _ResNetBuilder(g, np.random.default_rng(seed)), _Flow(g.input("input", [batch, 3, image, image]),
                                                                     calibration)


def mobilenet_v2(seed: int = 0, batch: int = 1, num_classes: int = 10, opset: int = DEFAULT_OPSET, image: int = 32,
                 blocks: Sequence[tuple[int, int, int, int]] = ((1, 8, 1, 1), (6, 12, 2, 2), (6, 16, 2, 2)),
                 stem: int = 16, last: int = 64) -> onnx.ModelProto:
    """A small MobileNetV2 on [batch, 3, image, image]: conv3x3/2-BN-ReLU6, inverted residual blocks
    ``(t, c, n, s)`` as in the paper (1x1 expand by t -BN-ReLU6 unless t is 1, depthwise 3x3 with stride s on
    the first of n -BN-ReLU6, 1x1 project -BN, identity Add when the stride is 1 and the channels match),
    conv1x1-BN-ReLU6 to `last` channels, GlobalAveragePool, Flatten, Gemm to "logits". ReLU6 is Clip(0, 6)
    and the convolutions have no bias, as PyTorch exports torchvision's model."""
    g, net, x = _start("mobilenet_v2", seed, batch, image, num_classes, opset)
    x = net.relu6(net.bn(net.conv(x, "features.0.0", stem, 3, 2), "features.0.1"), "features.0.2")
    index = 1
    for t, c, n, s in blocks:
        for i in range(n):
            name, stride, cin = f"features.{index}.conv", s if i == 0 else 1, x.value.shape[1]
            hidden, y, k = cin * t, x, 0
            if t != 1:
                y = net.relu6(net.bn(net.conv(y, f"{name}.0.0", hidden, 1, 1), f"{name}.0.1"), f"{name}.0.2")
                k = 1
            y = net.conv(y, f"{name}.{k}.0", hidden, 3, stride, group=hidden)
            y = net.relu6(net.bn(y, f"{name}.{k}.1"), f"{name}.{k}.2")
            y = net.bn(net.conv(y, f"{name}.{k + 1}", c, 1, 1), f"{name}.{k + 2}", gamma_range=(0.2, 0.5))
            x = net.add(x, y, f"features.{index}.add") if stride == 1 and cin == c else y
            index += 1
    x = net.relu6(net.bn(net.conv(x, f"features.{index}.0", last, 1, 1), f"features.{index}.1"),
                  f"features.{index}.2")
    logits = net.head(x, num_classes)
    return g.model([(logits, [batch, num_classes])], f"small MobileNetV2, blocks {list(blocks)}, seed {seed}")


#: torchvision's MobileNetV2 (width 1.0): the inverted residual settings (t, c, n, s) of the paper's Table 2
MOBILENET_V2_BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1))


def mobilenet_v2_224(seed: int = 0, batch: int = 1, num_classes: int = 1000, opset: int = DEFAULT_OPSET,
                     image: int = 224) -> onnx.ModelProto:
    """torchvision's full-size MobileNetV2 on [batch, 3, 224, 224] "input" -> [batch, num_classes] "logits":
    :func:`mobilenet_v2`'s layers with the paper's 32-channel stem, its seven block settings
    (:data:`MOBILENET_V2_BLOCKS`, 17 inverted residuals) and the 1280-channel last convolution (the
    classifier's Dropout is gone in an exported model). `image` may be smaller for a quick test."""
    model = mobilenet_v2(seed, batch, num_classes, opset, image, MOBILENET_V2_BLOCKS, stem=32, last=1280)
    doc = f"MobileNetV2 (torchvision topology, width 1.0), seeded He init and calibrated random BN, seed {seed}"
    model.graph.name, model.graph.doc_string, model.doc_string = "mobilenet_v2_224", doc, doc
    return model


def resnext(seed: int = 0, batch: int = 1, num_classes: int = 10, opset: int = DEFAULT_OPSET, image: int = 16,
            stages: Sequence[tuple[int, int]] = ((1, 1), (1, 2)), groups: int = 32, width: int = 4) -> onnx.ModelProto:
    """A ResNeXt 32x4d on [batch, 3, image, image]: conv3x3-BN-ReLU to 64 channels, then per stage
    ``(blocks, stride)`` torchvision's Bottleneck with cardinality `groups` (1x1 -BN-ReLU, 3x3 with `groups`
    groups and the stride -BN-ReLU, 1x1 to 4x the width -BN, identity or 1x1 downsample -BN, Add, ReLU; the
    grouped width is ``groups * width``, doubled every stage), GlobalAveragePool, Flatten, Gemm to "logits"."""
    g, net, x = _start("resnext", seed, batch, image, num_classes, opset)
    x = net.relu(net.bn(net.conv(x, "conv1", 64, 3, 1), "bn1"), "relu")
    planes = groups * width
    for index, (blocks, stride) in enumerate(stages, start=1):
        for b in range(blocks):
            name, s, cout = f"layer{index}.{b}", stride if b == 0 else 1, planes * 2
            y = net.relu(net.bn(net.conv(x, f"{name}.conv1", planes, 1, 1), f"{name}.bn1"), f"{name}.relu1")
            y = net.conv(y, f"{name}.conv2", planes, 3, s, group=groups)
            y = net.relu(net.bn(y, f"{name}.bn2"), f"{name}.relu2")
            y = net.bn(net.conv(y, f"{name}.conv3", cout, 1, 1), f"{name}.bn3", gamma_range=(0.2, 0.5))
            identity = x
            if s != 1 or x.value.shape[1] != cout:
                identity = net.bn(net.conv(x, f"{name}.downsample.0", cout, 1, s), f"{name}.downsample.1")
            x = net.relu(net.add(y, identity, f"{name}.add"), f"{name}.relu3")
        planes *= 2
    logits = net.head(x, num_classes)
    return g.model([(logits, [batch, num_classes])], f"small ResNeXt {groups}x{width}d, seed {seed}")


# ---- VGG, MLP and awkward shapes ----------------------------------------------------------------------


def _conv(g: _Graph, rng: np.random.Generator, x: str, name: str, cin: int, cout: int, k: int,
          stride: int = 1, pads: Sequence[int] | None = None) -> str:
    """A biased Conv; ``pads`` (top, left, bottom, right) defaults to 'same' for odd kernels."""
    pads = [k // 2] * 4 if pads is None else list(pads)
    weight = g.const(f"{name}.weight", _he_conv(rng, cout, cin, k))
    bias = g.const(f"{name}.bias", (0.05 * rng.standard_normal(cout)).astype(np.float32))
    return g.op("Conv", [x, weight, bias], name, kernel_shape=[k, k], strides=[stride, stride], pads=pads)


def _gemm(g: _Graph, rng: np.random.Generator, x: str, name: str, cin: int, cout: int) -> str:
    weight, bias = _linear(rng, cout, cin)
    return g.op("Gemm", [x, g.const(f"{name}.weight", weight), g.const(f"{name}.bias", bias)], name, transB=1)


def vgg_small(seed: int = 0, batch: int = 1, num_classes: int = 10, opset: int = DEFAULT_OPSET,
              widths: Sequence[int] = (16, 32, 64), hidden: int = 128) -> onnx.ModelProto:
    """A VGG-style CNN on [batch, 3, 32, 32]: (conv3x3-ReLU-conv3x3-ReLU-MaxPool2) per width, Flatten,
    Gemm-ReLU-Dropout-Gemm, Softmax to "probs" (Dropout and Softmax are there to be handled at inference)."""
    _check_args(opset, batch, num_classes)
    g = _Graph("vgg_small", opset)
    rng = np.random.default_rng(seed)
    x = g.input("input", [batch, 3, 32, 32])
    cin, size = 3, 32
    for stage, width in enumerate(widths):
        for layer in range(2):
            name = f"features.{stage}.{layer}"
            x = g.op("Relu", [_conv(g, rng, x, f"{name}.conv", cin, width, 3)], f"{name}.relu")
            cin = width
        x = g.op("MaxPool", [x], f"features.{stage}.pool", kernel_shape=[2, 2], strides=[2, 2])
        size //= 2
    x = g.op("Flatten", [x], "flatten", axis=1)
    x = g.op("Relu", [_gemm(g, rng, x, "classifier.0", cin * size * size, hidden)], "classifier.0.relu")
    x = g.dropout(x, 0.5, "classifier.dropout")
    x = _gemm(g, rng, x, "classifier.1", hidden, num_classes)
    probs = g.op("Softmax", [x], "probs", axis=1)
    return g.model([(probs, [batch, num_classes])], f"VGG-style CNN, widths {list(widths)}, seed {seed}")


def mlp(seed: int = 0, batch: int = 4, in_features: int = 64, hidden: Sequence[int] = (128, 64),
        num_classes: int = 10, opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    """An MLP on [batch, in_features] "input" -> "logits": hidden layers alternate MatMul+Add and Gemm
    (both spellings exporters use), each followed by ReLU; the output layer is MatMul+Add."""
    _check_args(opset, batch, num_classes)
    g = _Graph("mlp", opset)
    rng = np.random.default_rng(seed)
    x = g.input("input", [batch, in_features])
    cin = in_features
    for index, cout in enumerate(hidden):
        name = f"layers.{index}"
        if index % 2 == 0:
            x = g.op("MatMul", [x, g.const(f"{name}.weight", _he_dense(rng, cin, cout))], f"{name}.matmul")
            bias = (0.05 * rng.standard_normal(cout)).astype(np.float32)
            x = g.op("Add", [x, g.const(f"{name}.bias", bias)], f"{name}.add")
        else:
            x = _gemm(g, rng, x, f"{name}.gemm", cin, cout)
        x = g.op("Relu", [x], f"{name}.relu")
        cin = cout
    weight, bias = _linear(rng, num_classes, cin)
    x = g.op("MatMul", [x, g.const("head.weight", np.ascontiguousarray(weight.T))], "head.matmul")
    logits = g.op("Add", [x, g.const("head.bias", bias)], "logits")
    return g.model([(logits, [batch, num_classes])], f"MLP {in_features}-{list(hidden)}-{num_classes}, seed {seed}")


def awkward_cnn(seed: int = 0, batch: int = 1, num_classes: int = 10, opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    """Shapes that do not fit the hardware's blocks, on [batch, 3, 29, 29] "input" -> "logits".

    An asymmetric Pad node (top and right), a 7x7/2 conv with asymmetric pads (3, 3, 2, 2) to 24
    channels, Clip(0, 6), three branches (1x1 conv to 40, 3x3 conv to 5, AveragePool 2x2 with
    asymmetric pads (0, 0, 1, 1)) joined by Concat (69 channels), Mul by a per-channel constant, a 3x3/2
    conv with pads (0, 0, 1, 1) to 40, a 1x1 conv, Sum of three tensors, MaxPool 3x3/2, GAP and Gemm.
    """
    _check_args(opset, batch, num_classes)
    g = _Graph("awkward_cnn", opset)
    rng = np.random.default_rng(seed)
    x = g.input("input", [batch, 3, 29, 29])
    x = g.pad(x, [0, 0, 1, 0, 0, 0, 0, 1], "pad")                                # -> 30x30
    x = g.clip(_conv(g, rng, x, "stem", 3, 24, 7, 2, (3, 3, 2, 2)), 0.0, 6.0, "stem.relu6")   # -> 15x15
    a = g.op("Relu", [_conv(g, rng, x, "branch_a", 24, 40, 1)], "branch_a.relu")
    b = g.op("Relu", [_conv(g, rng, x, "branch_b", 24, 5, 3)], "branch_b.relu")
    c = g.op("AveragePool", [x], "branch_c", kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1],
             count_include_pad=0)
    x = g.op("Concat", [a, b, c], "concat", axis=1)                              # 40 + 5 + 24 = 69
    scale = rng.uniform(0.5, 1.5, (1, 69, 1, 1)).astype(np.float32)
    x = g.op("Mul", [x, g.const("scale.value", scale)], "scale")
    y = g.op("Relu", [_conv(g, rng, x, "reduce", 69, 40, 3, 2, (0, 0, 1, 1))], "reduce.relu")  # -> 7x7
    z = _conv(g, rng, y, "expand", 40, 40, 1)
    half = g.op("Mul", [y, g.const("half.value", np.array(0.5, np.float32))], "half")
    x = g.op("Sum", [y, z, half], "sum")
    x = g.op("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])   # -> 4x4
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x], "avgpool")], "flatten", axis=1)
    logits = g.op("Gemm", [x, *(g.const(f"fc.{p}", v) for p, v in zip(("weight", "bias"), _linear(rng, num_classes, 40),
                                                                         strict=True))], "logits", transB=1)
    return g.model([(logits, [batch, num_classes])], f"awkward-shape CNN, seed {seed}")


def reshape_net(seed: int = 0, batch: int = 2, num_classes: int = 10, opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    """A CNN whose shape arithmetic must fold to constants, on [batch, 4, 6, 6] "input" -> "logits".

    Flatten is spelled the way exporters write ``x.view(x.size(0), -1)``: Shape -> Gather(0) ->
    Unsqueeze -> Concat with a Constant [-1] -> Reshape; an Identity sits on the way, and a bias comes
    from ConstantOfShape of a Constant shape.
    """
    _check_args(opset, batch, num_classes)
    g = _Graph("reshape_net", opset)
    rng = np.random.default_rng(seed)
    x = g.input("input", [batch, 4, 6, 6])
    x = g.op("Relu", [_conv(g, rng, x, "conv", 4, 8, 3)], "conv.relu")
    x = g.op("Identity", [x], "features")
    shape = g.op("Shape", [x], "view.shape")
    size0 = g.op("Gather", [shape, g.constant(np.array(0, np.int64), "view.index")], "view.size0", axis=0)
    size0 = g.unsqueeze(size0, [0], "view.size0_1d")
    target = g.op("Concat", [size0, g.constant(np.array([-1], np.int64), "view.minus_one")], "view.target", axis=0)
    x = g.op("Reshape", [x, target], "view")
    hidden = 16
    x = _gemm(g, rng, x, "fc1", 8 * 6 * 6, hidden)
    bias = g.op("ConstantOfShape", [g.constant(np.array([1, hidden], np.int64), "fc1.bias_shape")], "fc1.extra_bias",
                value=numpy_helper.from_array(np.array([0.1], np.float32), "fill"))
    x = g.op("Relu", [g.op("Add", [x, bias], "fc1.add")], "fc1.relu")
    logits = _gemm(g, rng, x, "logits", hidden, num_classes)
    return g.model([(logits, [batch, num_classes])], f"CNN with constant-folding shape ops, seed {seed}")


# ---- digits: a small CNN trained here, in numpy ------------------------------------------------------

_DIGITS_WIDTHS = (8, 16)  # conv1 3x3 1->8, conv2 3x3/2 8->16, then dense 16*4*4 -> 10
_DIGITS_CLASSES = 10


def digits_data(seed: int = 0, test_fraction: float = 0.2) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (shipped in the package, no download) as (x_train, y_train, x_test, y_test).

    Images are float32 [N, 1, 8, 8] scaled to [0, 1], labels int64; the split is a seeded permutation.
    """
    from sklearn.datasets import load_digits

    if not 0.0 < test_fraction < 1.0:
        raise UsageError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction}")
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = round(len(labels) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return images[train], labels[train], images[test], labels[test]


def _digits_init(rng: np.random.Generator) -> dict[str, np.ndarray]:
    c1, c2 = _DIGITS_WIDTHS
    fc_weight, fc_bias = _linear(rng, _DIGITS_CLASSES, c2 * 4 * 4)
    return {
        "conv1.weight": _he_conv(rng, c1, 1, 3), "conv1.bias": np.zeros(c1, np.float32),
        "conv2.weight": _he_conv(rng, c2, c1, 3), "conv2.bias": np.zeros(c2, np.float32),
        "fc.weight": fc_weight, "fc.bias": fc_bias,
    }


def _digits_loss_and_grads(p: dict[str, np.ndarray], x: np.ndarray,
                           y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    """Softmax cross-entropy of the digits CNN on one minibatch and its gradient, by hand (im2col)."""
    n = x.shape[0]
    same, down = (1, 1, 1, 1), (1, 1, 1, 1)
    w1, w2 = (p[f"{name}.weight"] for name in ("conv1", "conv2"))
    cols1, h1, wd1 = _im2col(x, 3, 1, same)
    z1 = cols1 @ w1.reshape(len(w1), -1).T + p["conv1.bias"]
    a1 = np.maximum(z1, 0.0).reshape(n, h1, wd1, -1).transpose(0, 3, 1, 2)
    cols2, h2, wd2 = _im2col(a1, 3, 2, down)
    z2 = cols2 @ w2.reshape(len(w2), -1).T + p["conv2.bias"]
    flat = np.maximum(z2, 0.0).reshape(n, h2, wd2, -1).transpose(0, 3, 1, 2).reshape(n, -1)
    logits = flat @ p["fc.weight"].T + p["fc.bias"]

    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -float(log_probs[np.arange(n), y].mean())
    dlogits = np.exp(log_probs)
    dlogits[np.arange(n), y] -= 1.0
    dlogits /= n

    grads = {"fc.weight": dlogits.T @ flat, "fc.bias": dlogits.sum(axis=0)}
    dz2 = (dlogits @ p["fc.weight"]).reshape(n, -1, h2, wd2).transpose(0, 2, 3, 1).reshape(n * h2 * wd2, -1)
    dz2 *= z2 > 0
    grads["conv2.weight"] = (dz2.T @ cols2).reshape(w2.shape)
    grads["conv2.bias"] = dz2.sum(axis=0)
    da1 = _col2im(dz2 @ w2.reshape(len(w2), -1), a1.shape, 3, 2, down)
    dz1 = da1.transpose(0, 2, 3, 1).reshape(n * h1 * wd1, -1) * (z1 > 0)
    grads["conv1.weight"] = (dz1.T @ cols1).reshape(w1.shape)
    grads["conv1.bias"] = dz1.sum(axis=0)
    return loss, grads


def train_digits_cnn(seed: int = 0, epochs: int = 15, batch: int = 1, opset: int = DEFAULT_OPSET,
                     learning_rate: float = 3e-3, batch_size: int = 32) -> onnx.ModelProto:
    """Train the small digits CNN with Adam in float32 numpy (deterministic for a seed, a few seconds) and
    export it: [batch, 1, 8, 8] "input" -> Conv 3x3 (8) -> ReLU -> Conv 3x3/2 (16) -> ReLU -> Flatten ->
    Gemm -> [batch, 10] "logits"."""
    _check_args(opset, batch)
    if epochs < 1 or batch_size < 1:
        raise UsageError(f"epochs and batch_size must be at least 1, got {epochs} and {batch_size}")
    x_train, y_train, _, _ = digits_data()
    rng = np.random.default_rng(seed)
    params = _digits_init(rng)
    moments = {name: (np.zeros_like(v), np.zeros_like(v)) for name, v in params.items()}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(y_train))
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            _, grads = _digits_loss_and_grads(params, x_train[rows], y_train[rows])
            step += 1
            for name, grad in grads.items():
                m, v = moments[name]
                m *= beta1
                m += (1 - beta1) * grad
                v *= beta2
                v += (1 - beta2) * grad * grad
                correction = math.sqrt(1 - beta2**step) / (1 - beta1**step)
                params[name] -= (learning_rate * correction * m / (np.sqrt(v) + eps)).astype(np.float32)

    g = _Graph("digits_cnn", opset)
    x = g.input("input", [batch, 1, 8, 8])
    for name, stride in (("conv1", 1), ("conv2", 2)):
        weight, bias = (g.const(f"{name}.{p}", params[f"{name}.{p}"]) for p in ("weight", "bias"))
        x = g.op("Conv", [x, weight, bias], name, kernel_shape=[3, 3], strides=[stride, stride], pads=[1, 1, 1, 1])
        x = g.op("Relu", [x], f"{name}.relu")
    x = g.op("Flatten", [x], "flatten", axis=1)
    logits = g.op("Gemm", [x, g.const("fc.weight", params["fc.weight"]), g.const("fc.bias", params["fc.bias"])],
                  "logits", transB=1)
    return g.model([(logits, [batch, _DIGITS_CLASSES])], f"digits CNN trained in numpy, seed {seed}, {epochs} epochs")


# ---- running and measuring models --------------------------------------------------------------------


def batched_runner(model: onnx.ModelProto) -> Callable[[np.ndarray], np.ndarray]:
    """A function running a one-input model on onnxruntime (CPU) over any number of rows: in chunks of
    the model's fixed batch, the last chunk padded with zeros; it returns the first output."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = session.get_inputs()
    if len(inputs) != 1:
        raise ValueError(f"model '{model.graph.name}' has {len(inputs)} inputs; batched_runner needs exactly one")
    name, batch = inputs[0].name, inputs[0].shape[0]

    def run(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float32)
        if not isinstance(batch, int):
            return session.run(None, {name: x})[0]
        outputs = []
        for start in range(0, len(x), batch):
            chunk = x[start:start + batch]
            short = batch - len(chunk)
            if short:
                chunk = np.concatenate([chunk, np.zeros((short, *chunk.shape[1:]), np.float32)])
            outputs.append(session.run(None, {name: chunk})[0][:batch - short])
        return np.concatenate(outputs)

    return run


def accuracy(model: onnx.ModelProto | Callable[[np.ndarray], np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy (a fraction) of an ONNX model (run on onnxruntime) or of a function x -> scores."""
    predict = batched_runner(model) if isinstance(model, onnx.ModelProto) else model
    scores = np.asarray(predict(x))
    if scores.shape[0] != len(y):
        raise ValueError(f"the model returned {scores.shape[0]} rows of scores for {len(y)} labels")
    return float(np.mean(scores.argmax(axis=1) == y))


# Inputs that hold settings, not learned weights: BN running statistics, Clip bounds, the Dropout ratio.
_NOT_PARAMETERS = {("BatchNormalization", 3), ("BatchNormalization", 4), ("Clip", 1), ("Clip", 2), ("Dropout", 1)}


def count_parameters(model: onnx.ModelProto) -> int:
    """Learnable parameters as PyTorch counts them: floating-point initializers, less BN running
    statistics and settings passed as inputs (Clip bounds, Dropout ratio)."""
    excluded = {node.input[i] for node in model.graph.node for i in range(len(node.input))
                if (node.op_type, i) in _NOT_PARAMETERS}
    floats = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
    return sum(math.prod(t.dims) for t in model.graph.initializer if t.name not in excluded and t.data_type in floats)


def count_macs(model: onnx.ModelProto) -> int:
    """Multiply-accumulates of the Conv, Gemm and MatMul nodes, from ONNX shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    graph = inferred.graph
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    for info in (*graph.input, *graph.value_info, *graph.output):
        dims = info.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[info.name] = [d.dim_value for d in dims]

    def shape(node: onnx.NodeProto, tensor: str) -> list[int]:
        if tensor not in shapes:
            raise ValueError(f"{node.op_type} node '{node.name}': the shape of '{tensor}' is not static")
        return shapes[tensor]

    total = 0
    for node in graph.node:
        if node.op_type == "Conv":
            total += math.prod(shape(node, node.output[0])) * math.prod(shape(node, node.input[1])[1:])
        elif node.op_type in ("Gemm", "MatMul"):
            a = shape(node, node.input[0])
            transposed = node.op_type == "Gemm" and any(at.name == "transA" and at.i for at in node.attribute)
            total += math.prod(shape(node, node.output[0])) * (a[-2] if transposed else a[-1])
    return total


# ---- registry -----------------------------------------------------------------------------------------

#: model name -> builder; every builder takes keyword options (seed, batch, opset...) and returns a model.
MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet18": resnet18,
    "small_resnet": small_resnet,
    "vgg_small": vgg_small,
    "mlp": mlp,
    "awkward_cnn": awkward_cnn,
    "mobilenet_v2": mobilenet_v2,
    "mobilenet_v2_224": mobilenet_v2_224,
    "resnext": resnext,
    "reshape_net": reshape_net,
    "digits_cnn": train_digits_cnn,
}


def save(model: onnx.ModelProto, path: str | Path) -> Path:
    """Write a model to an .onnx file (parent folders created), weights inline."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def build(name: str, path: str | Path, **options: object) -> onnx.ModelProto:
    """Build the registered model ``name`` with ``options`` and save it to ``path``: ``build("resnet18", p)``."""
    if name not in MODELS:
        raise UsageError(f"unknown model '{name}'; known models: {', '.join(MODELS)}")
    model = MODELS[name](**options)
    save(model, path)
    return model
