"""The main demo job (`make demo`, `weft demo`): ResNet-18 from ONNX to the accelerator, end to end.

It builds the ResNet-18 ONNX model (seeded weights, nothing downloaded), compiles it for a config
(default: VTA's PYNQ design), runs it on the functional simulator and prints, per layer, where it ran, its
MACs, its instructions and DRAM traffic, and its cycles and GEMM utilization when the timing model is
present; then the share of MACs the accelerator ran, the check that every accelerator layer's output
equals the reference interpreter's to the bit, and how close the int8 result stays to float onnxruntime.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.core.accel_section import accel_section
from weft.errors import UsageError
from weft.runtime.fsim_device import new_timing_model, timing_model
from weft.runtime.report import layer_table, summary
from weft.runtime.session import InferenceSession

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["run_demo"]

#: Where the demo writes the ONNX model and the compiled artifact.
OUT_DIR = Path("build") / "demo"


def _fmt_int(value: Any) -> str:
    return "-" if value is None else f"{int(value):,}"


def _table(stats: dict[str, Any], config: AcceleratorConfig) -> list[str]:
    """Per layer; `GEMM %`: its real MACs over what the config's MACs per cycle could do in its cycles (a
    grouped layer's zero weights outside its groups do not count); `gap`: its cycles above that ideal. The
    last lines are the model's totals (see :func:`weft.runtime.report.summary`)."""
    timer = new_timing_model(config)
    rows = layer_table(stats, config, dram=timer.dram if timer is not None else None)
    layers = stats["layers"]
    width = max([len(layer["name"]) for layer in layers] + [5])
    head = (f"{'#':>3}  {'layer':<{width}}  {'op':<10} {'where':<6} {'MACs':>13} {'insns':>6} {'DRAM bytes':>11} "
            f"{'cycles':>11} {'gap':>11} {'GEMM %':>6} {'sim ms':>7}")
    lines = [head, "-" * len(head)]
    for k, (layer, row) in enumerate(zip(layers, rows, strict=True)):
        accel = layer["target"] == "accel"
        insns = layer.get("insn_count") if accel else None
        util = f"{100 * row['utilization']:.1f}" if row["utilization"] and layer["macs"] else "-"
        lines.append(
            f"{k:>3}  {layer['name']:<{width}}  {layer['op']:<10} {layer['target']:<6} {layer['macs']:>13,} "
            f"{_fmt_int(insns):>6} {_fmt_int(row['bytes']):>11} {_fmt_int(row['cycles']):>11} "
            f"{_fmt_int(row['gap']):>11} {util:>6} {layer['seconds'] * 1e3:>7.1f}")
    # `cycles` is the accelerator's time; `sim ms` the simulator's wall time on this machine, which a reader
    # would otherwise take for the layer's latency on the board.
    lines.append("cycles: accelerator clock cycles (timing model); gap: cycles above the layer's useful MACs at "
                 f"{config.macs_per_cycle} per cycle (a pool's ideal is 0)")
    lines.append("sim ms: wall time the simulator took here")
    tot = summary(rows)
    if tot["cycles"]:
        conv = tot["mean_conv_utilization"]
        rest = tot["mean_conv_utilization_after_first"]
        spatial = tot["mean_spatial_conv_utilization_after_first"]
        lines.append(f"ideal {tot['ideal_cycles']:,} cycles, gap {tot['gap']:,}: {100 * tot['utilization']:.1f}% of "
                     "the GEMM peak end to end" + (f"; mean convolution utilization {100 * conv:.1f}%" if conv else "")
                     + (f" ({100 * rest:.1f}% without the first" if rest else "")
                     + (f"; {100 * spatial:.1f}% over the {tot['spatial_convs_after_first']} after it that are not "
                        "dense layers" if rest and spatial else "")
                     + (f"; {100 * tot['conv_utilization_after_first']:.1f}% over the cycles of all after the first "
                        "together)" if rest else ""))
        roof = tot["roofline_utilization"]
        lines.append(f"roofline bound {tot['roofline_cycles']:,} cycles ({100 * roof:.1f}% of the peak): each layer at "
                     "the larger of its ideal and its DRAM traffic at the bus's rate")
    return lines


def run_demo(config: AcceleratorConfig, seed: int = 0, model: str = "resnet18", calibration_batches: int = 2) -> int:
    """Build, compile, run and report `model` (a name of :data:`weft.compiler.models.MODELS`) on `config`.
    Returns 0 when fsim and the reference agree to the bit on every accelerator layer."""
    # optional dependencies: the compiler and the float comparison need onnx and onnxruntime
    import onnxruntime as ort

    from weft.compiler import models  # optional dependency: onnx
    from weft.compiler.driver import compile_model

    if model not in models.MODELS:
        raise UsageError(f"unknown model '{model}' (models: {', '.join(models.MODELS)})")
    c = config
    started = time.perf_counter()
    print(f"weft demo: {model} on config '{c.name}' ({c.batch}x{c.block_in}x{c.block_out} GEMM, int{c.inp_width} x "
          f"int{c.wgt_width} -> int{c.acc_width}, {c.clock_mhz:g} MHz, {c.peak_gops:.1f} GOP/s peak, hash {c.hash})")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    onnx_model = models.MODELS[model](seed=seed)
    onnx_path = models.save(onnx_model, OUT_DIR / f"{model}.onnx")
    inp = onnx_model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    rng = np.random.default_rng(seed)
    calibration = {inp.name: rng.standard_normal((calibration_batches, *shape)).astype(np.float32)}
    print(f"built {onnx_path} ({models.count_parameters(onnx_model):,} parameters, input {inp.name} {shape})")

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        artifact = compile_model(str(onnx_path), config=c, calibration=calibration)
    compile_s = time.perf_counter() - start
    backend = accel_section(artifact)
    assert backend is not None and backend.compile_seconds is not None
    art_path = artifact.save(OUT_DIR / f"{model}.{c.name}.weft")
    n_insns = sum(layer.insn_count for layer in backend.layers)
    print(f"compiled in {compile_s:.1f} s (back end {backend.compile_seconds:.1f} s): {len(backend.layers)} "
          f"accelerator programs, {n_insns:,} instructions, DRAM image {backend.dram_bytes / 2**20:.1f} MiB -> "
          f"{art_path}")

    x = {inp.name: rng.standard_normal(shape).astype(np.float32)}
    sess = InferenceSession(artifact, device="fsim")
    start = time.perf_counter()
    got = sess.run(None, x, keep_intermediates=True)[0]
    fsim_s = time.perf_counter() - start
    stats = sess.stats
    assert stats is not None
    print(f"\nfunctional simulator: {fsim_s:.2f} s\n")
    for line in _table(stats, c):
        print("  " + line)

    ref = InferenceSession(artifact, device="ref")
    ref.run(None, x, keep_intermediates=True)
    accel_nodes = [n for n in artifact.graph.nodes if n.attrs.get("target") == "accel"]
    mismatched = [n.name for n in accel_nodes
                  if not np.array_equal(sess.intermediate(n.outputs[0]), ref.intermediate(n.outputs[0]))]
    convs = [n for n in artifact.graph.nodes if n.op == "qconv2d"]
    on_accel = sum(n.attrs.get("target") == "accel" for n in convs)
    ort_sess = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = ort_sess.run(None, x)[0]
    a, b = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    top5 = set(np.argsort(-a)[:5].tolist()) & set(np.argsort(-b)[:5].tolist())

    cycles = stats["cycles"]
    print()
    print(f"accelerator MAC fraction: {100 * stats['accel_mac_fraction']:.2f}% of {stats['macs']:,} MACs "
          f"({on_accel}/{len(convs)} convolutions on the accelerator; host: "
          f"{', '.join(sorted({layer['op'] for layer in stats['layers'] if layer['target'] == 'host'})) or 'none'})")
    if cycles is None:
        reason = "no timing model in this build" if timing_model() is None else "the timing model gave none"
        print(f"cycles: unknown ({reason})")
    else:
        print(f"cycles: {cycles:,} = {cycles / (c.clock_mhz * 1e3):.2f} ms at {c.clock_mhz:g} MHz")
    print(f"fsim vs reference interpreter: {'bit-exact' if not mismatched else 'MISMATCH'} on "
          f"{len(accel_nodes) - len(mismatched)}/{len(accel_nodes)} accelerator layers"
          + (f" (differ: {', '.join(mismatched)})" if mismatched else ""))
    top1 = "agrees" if a.argmax() == b.argmax() else "differs"
    print(f"int8 on fsim vs float onnxruntime: cosine {cosine:.4f}, top-1 {top1} ({int(a.argmax())} vs "
          f"{int(b.argmax())}), top-5 overlap {len(top5)}/5")
    print(f"total {time.perf_counter() - started:.1f} s")
    return 0 if not mismatched else 1
