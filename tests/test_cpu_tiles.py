"""The untuned register tiles of the host's convolution, dense and matmul kernels: derived from the target's
register file and vector width, never beyond it, and (being a blocking, not a reordering of the sums) bit
for bit the results of any other tile."""

import numpy as np
import pytest

from weft.compiler.llvm import nn
from weft.compiler.llvm.target import Target

pytest.importorskip("llvmlite")

AVX2 = Target("avx2", "x86_64-unknown-linux-gnu", "generic", "", 32, 16)
AVX512 = Target("avx512", "x86_64-unknown-linux-gnu", "generic", "", 64, 32)

# ResNet-50's and DenseNet-121's 1x1 convolutions (cin, cout, output width) and a few odd ones
SHAPES = [(64, 256, 56), (256, 64, 56), (512, 128, 28), (1024, 256, 14), (512, 2048, 7), (128, 32, 28),
          (96, 128, 56), (3, 64, 112), (2048, 1000, 1), (24, 40, 13)]


def _spec(cin: int, cout: int, ow: int, target: Target) -> nn.ConvSpec:
    bo = target.lanes(4)
    while cout % bo:
        bo //= 2
    return nn.ConvSpec(1, cin, ow, ow, cout, 1, 1, (1, 1), 1, bo)


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_conv_tiles_fit_the_register_file_and_hide_the_fma_latency(target):
    for cin, cout, ow in SHAPES:
        spec = _spec(cin, cout, ow, target)
        r, ocb = nn.conv_tiles(spec, target)
        blocks = spec.cout // spec.bo
        assert ow % r == 0 and blocks % ocb == 0
        assert r * ocb + ocb + 1 <= target.vector_registers  # accumulators, weights, the broadcast
        assert nn.ConvSchedule(r, ocb).illegal_for(spec, target) is None
        # every shape here allows a tile of 7 accumulators or more; take one (FMA latency x pipes is 8)
        enough = max(a * b for a in range(1, ow + 1) for b in range(1, blocks + 1)
                     if ow % a == 0 and blocks % b == 0 and a * b + b + 1 <= target.vector_registers)
        assert r * ocb >= min(7, enough), (cin, cout, ow, r, ocb)


def test_latency_bound_tiles_score_below_balanced_ones():
    assert nn.tile_score(1, 4) < nn.tile_score(7, 1) < nn.tile_score(4, 2)
    assert nn.tile_score(4, 2) > nn.tile_score(2, 4)  # a weight vector costs more than a broadcast
    assert nn.tile_score(4, 3) > nn.tile_score(6, 2) > nn.tile_score(4, 2)  # 12 accumulators spread the loads
    assert nn.tile_score(4, 2) > nn.tile_score(14, 1)  # 15 loads for 14 FMAs
    # a wider register file reaches tiles the narrow one cannot hold
    spec = nn.ConvSpec(1, 512, 7, 7, 2048, 1, 1, (1, 1), 16, 16)
    assert nn.conv_tiles(spec, AVX2) == (7, 1)
    assert nn.conv_tiles(spec, AVX512)[0] == 7 and nn.conv_tiles(spec, AVX512)[1] > 1


def test_register_tiles_of_matrices():
    assert nn.register_tiles(512, 64, AVX2) in {(4, 2), (2, 4)}
    assert nn.register_tiles(1, 125, AVX2) == (1, 5)  # a batch-1 dense layer: blocks side by side
    assert nn.register_tiles(7, 1, AVX2) == (7, 1)
    assert nn.register_tiles(1, 1, AVX2) == (1, 1)


def test_tiles_do_not_change_a_single_bit():
    from weft.compiler.llvm.jit import build
    from weft.compiler.llvm.target import host_target

    target = host_target()
    b = target.lanes(4)
    spec = nn.ConvSpec(1, 4 * b, 9, 9, 4 * b, 3, 3, (1, 1), b, b)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 9, 9, b)).astype(np.float32)
    w = rng.standard_normal((4, 4, 3, 3, b, b)).astype(np.float32)
    bias = rng.standard_normal((4, b)).astype(np.float32)
    outs = []
    for tiles in [(1, 4), (7, 1), (1, 1), nn.conv_tiles(spec, target)]:
        y = np.empty((1, 4, 7, 7, b), np.float32)
        build(nn.conv_kernel("c", spec, target, act="relu", tiles=tiles))(x, w, bias, y, nthreads=2)
        outs.append(y)
    assert all(np.array_equal(outs[0], y) for y in outs[1:])
    a = rng.standard_normal((8, 3 * b)).astype(np.float32)
    wd = rng.standard_normal((4, 3 * b, b)).astype(np.float32)
    dense = []
    for rows, ocb in [(1, 1), (8, 1), (None, None)]:
        y = np.empty((8, 4, b), np.float32)
        build(nn.dense_kernel("d", 8, 3 * b, 4 * b, b, target, rows=rows, ocb=ocb))(a, wd, bias, y)
        dense.append(y)
    assert all(np.array_equal(dense[0], y) for y in dense[1:])


def test_threads_split_rows_where_activations_outweigh_weights():
    """MobileNet's and ResNet's early layers split rows (a thread keeps what its core wrote), the 7x7 stage's
    weight-heavy layers split output channels (each core streams half the weights)."""
    assert nn.outer_order(nn.ConvSpec(1, 384, 14, 14, 64, 1, 1, (1, 1), 16, 16)) == "oh"
    assert nn.outer_order(nn.ConvSpec(1, 64, 58, 58, 64, 3, 3, (1, 1), 16, 16)) == "oh"
    assert nn.outer_order(nn.ConvSpec(1, 2048, 7, 7, 512, 1, 1, (1, 1), 16, 16)) == "co"
    assert nn.outer_order(nn.ConvSpec(1, 512, 9, 9, 512, 3, 3, (1, 1), 16, 16)) == "co"
    spec = nn.ConvSpec(1, 384, 14, 14, 64, 1, 1, (1, 1), 16, 16)
    assert nn.ConvSchedule.default(spec, AVX512).outer == "oh"
