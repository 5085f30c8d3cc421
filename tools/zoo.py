"""`weft bench zoo`: every ONNX model in a folder, compiled for the accelerator and the CPU, run and compared.

The default folder is the onnx wheel's light model zoo (``onnx/backend/test/data/light``): the graphs of
ResNet-50, SqueezeNet, ShuffleNet, Inception v1/v2, DenseNet-121, AlexNet, VGG-19 and ZFNet-512 as their
exporters wrote them, with every weight replaced by a ``ConstantOfShape`` placeholder. :func:`with_random_weights`
puts seeded random weights in their place, scaled by the role each one plays (He-normal convolution and
dense weights, unit BatchNorm statistics), so activations keep their range through deep networks as trained
weights would; the outputs are then compared with onnxruntime running the same randomized model.

Per model: its ops, compile seconds (accel and cpu), the accelerator's MAC fraction, the timing model's
cycles, the int8 output's cosine against float onnxruntime (the logits, when the model ends in Softmax),
whether fsim equals the reference interpreter to the bit on every accelerator layer, and the cpu target's
relative error.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from weft.config import load_config
from weft.errors import UsageError
from weft.runtime.session import InferenceSession

__all__ = ["bench_zoo", "format_table", "light_models_dir", "model_files", "with_logits_output", "with_random_weights",
           "zoo_row"]

#: (op, input index) -> how a placeholder weight in that position is drawn.
_ROLES: dict[tuple[str, int], str] = {
    ("Conv", 1): "he", ("Conv", 2): "bias", ("ConvTranspose", 1): "he", ("ConvTranspose", 2): "bias",
    ("Gemm", 1): "he_gemm", ("Gemm", 2): "bias", ("MatMul", 1): "he_matmul",
    ("BatchNormalization", 1): "scale", ("BatchNormalization", 2): "bias",
    ("BatchNormalization", 3): "bias", ("BatchNormalization", 4): "var",
    ("Mul", 1): "scale", ("Add", 1): "bias", ("Sum", 1): "bias",
    ("InstanceNormalization", 1): "scale", ("InstanceNormalization", 2): "bias",
    ("PRelu", 1): "slope",
}


def light_models_dir() -> Path:
    """The onnx wheel's light model zoo."""
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def model_files(folder: str | Path | None = None) -> list[Path]:
    """The ``.onnx`` files of `folder` (default: the onnx wheel's light models), sorted by name."""
    root = Path(folder) if folder is not None else light_models_dir()
    if not root.is_dir():
        raise UsageError(f"'{root}' is not a folder")
    files = sorted(root.glob("*.onnx"))
    if not files:
        raise UsageError(f"'{root}' holds no .onnx files")
    return files


def _draw(role: str, shape: tuple[int, ...], attrs: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    if role == "he":  # (O, C/group, kh, kw): fan-in C/group * kh * kw
        fan_in = int(np.prod(shape[1:])) or 1
        return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
    if role in ("he_gemm", "he_matmul"):
        fan_in = shape[1] if role == "he_gemm" and attrs.get("transB", 0) else shape[0]
        return rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))
    if role == "scale":
        return 1.0 + 0.1 * rng.standard_normal(shape)
    if role == "var":
        return rng.uniform(0.5, 1.5, shape)
    if role == "slope":
        return rng.uniform(0.0, 0.3, shape)
    return 0.05 * rng.standard_normal(shape)


def with_random_weights(model: Any, seed: int = 0) -> Any:
    """A copy of `model` with each ``ConstantOfShape`` placeholder (shape given by an initializer) replaced by
    a random float32 initializer drawn for the role its first reader gives it (see the module docstring).
    Shapes computed at run time are left alone."""
    import onnx
    from onnx import numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {t.name: t for t in graph.initializer}
    readers: dict[str, tuple[str, int, dict[str, Any]]] = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name and name not in readers:
                attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
                readers[name] = (node.op_type, k, attrs)
    # An Unsqueeze between a placeholder and its Mul/Add (DenseNet's per-channel affine) passes the role on.
    for node in graph.node:
        if node.op_type == "Unsqueeze" and node.output[0] in readers:
            readers[node.input[0]] = readers[node.output[0]]
    rng = np.random.default_rng(seed)
    kept, used_shapes = [], set()
    for node in graph.node:
        shape_name = node.input[0] if node.input else ""
        if node.op_type != "ConstantOfShape" or shape_name not in inits:
            kept.append(node)
            continue
        shape = tuple(int(d) for d in numpy_helper.to_array(inits[shape_name]))
        op, k, attrs = readers.get(node.output[0], ("", 0, {}))
        role = _ROLES.get((op, k), "bias")
        array = _draw(role, shape, attrs, rng).astype(np.float32)
        graph.initializer.append(numpy_helper.from_array(array, node.output[0]))
        used_shapes.add(shape_name)
    del graph.node[:]
    graph.node.extend(kept)
    still_read = {x for n in graph.node for x in n.input}
    unused = [t for t in graph.initializer if t.name in used_shapes and t.name not in still_read]
    for t in unused:
        graph.initializer.remove(t)
    gone = {t.name for t in unused}
    inputs = [vi for vi in graph.input if vi.name not in gone]  # older IRs list initializers as inputs too
    del graph.input[:]
    graph.input.extend(inputs)
    return out


def with_logits_output(model: Any) -> tuple[Any, int]:
    """`model` with the input of a final Softmax added as a graph output, and the index of the output to
    compare: with random weights the probabilities are nearly one-hot, which any output would match."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    producers = {o: n for n in out.graph.node for o in n.output}
    last = producers.get(out.graph.output[0].name)
    if last is None or last.op_type != "Softmax":
        return out, 0
    out.graph.output.append(onnx.helper.make_tensor_value_info(last.input[0], onnx.TensorProto.FLOAT, None))
    return out, len(out.graph.output) - 1


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    want = np.asarray(want, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def _inputs(model: Any, rng: np.random.Generator, batches: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Calibration batches and one test input for each graph input (static shapes, batch 1 if dynamic)."""
    from weft.compiler.onnx_import import declared_inputs  # optional dependency: onnx

    calibration, feeds = {}, {}
    for name, (dims, _) in declared_inputs(model).items():
        shape = [d if isinstance(d, int) else 1 for d in dims]
        calibration[name] = rng.standard_normal((batches, *shape)).astype(np.float32)
        feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return calibration, feeds


def zoo_row(path: Path, config: Any, seed: int = 0, calibration_batches: int = 2, devices: Sequence[str] = (
        "ref", "fsim", "cpu")) -> dict[str, Any]:
    """Compile and run one model file (see the module docstring); failures are recorded, not raised."""
    import onnx
    import onnxruntime as ort

    from weft.compiler.driver import compile_model  # optional dependency: onnx

    row: dict[str, Any] = {"model": path.stem.removeprefix("light_")}
    model, k = with_logits_output(with_random_weights(onnx.load(str(path)), seed))
    row["ops"] = dict(Counter(n.op_type for n in model.graph.node).most_common())
    row["compared"] = "logits" if k else "output"
    calibration, feeds = _inputs(model, np.random.default_rng(seed), calibration_batches)
    ort_sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = ort_sess.run(None, feeds)[k]
    stage = "accel compile"
    try:
        start = time.perf_counter()
        art = compile_model(model, config=config, calibration=calibration)
        row["accel_compile_seconds"] = round(time.perf_counter() - start, 2)
        row["host_layers"] = sum(1 for n in art.graph.nodes if n.attrs.get("target") != "accel")
        if "ref" in devices:
            stage = "ref run"
            ref = InferenceSession(art, device="ref")
            ref_out = ref.run(None, feeds, keep_intermediates="fsim" in devices)[k]
            row["cosine_vs_float"] = round(_cosine(ref_out, want), 5)
        if "fsim" in devices:
            stage = "fsim run"
            fsim = InferenceSession(art, device="fsim")
            fsim_out = fsim.run(None, feeds, keep_intermediates="ref" in devices)[k]
            stats = fsim.stats or {}
            row["accel_mac_fraction"] = round(float(stats.get("accel_mac_fraction") or 0.0), 4)
            row["cycles"] = stats.get("cycles")
            if "ref" in devices:
                accel = [n.outputs[0] for n in art.graph.nodes if n.attrs.get("target") == "accel"]
                row["fsim_equals_ref"] = bool(np.array_equal(fsim_out, ref_out)) and all(
                    np.array_equal(fsim.intermediate(v), ref.intermediate(v)) for v in accel)
        if "cpu" in devices:
            stage = "cpu compile"
            start = time.perf_counter()
            cpu_art = compile_model(model, target="cpu", config=config)
            row["cpu_compile_seconds"] = round(time.perf_counter() - start, 2)
            stage = "cpu run"
            cpu_out = InferenceSession(cpu_art, device="cpu").run(None, feeds)[k]
            row["cpu_relative_error"] = float(f"{_relative_error(cpu_out, want):.3g}")
        row["ok"] = True
    except Exception as err:  # a model that fails is a row of the table, not the end of the benchmark
        row["ok"] = False
        row["error"] = f"{stage}: {type(err).__name__}: {err}".splitlines()[0][:300]
    return row


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table (what the README carries)."""
    head = ["model", "ops", "compile s", "accel MACs", "cycles", "cosine vs float", "fsim == ref", "cpu rel. error"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if not r.get("ok"):
            lines.append(f"| {r['model']} | {len(r.get('ops', {}))} | fails: {r.get('error', '?')} |" + " |" * 5)
            continue
        cycles = f"{r['cycles'] / 1e6:.2f} M" if r.get("cycles") else "-"
        lines.append(" | ".join([
            f"| {r['model']}", str(len(r["ops"])), f"{r['accel_compile_seconds']:.1f}",
            f"{100 * r.get('accel_mac_fraction', 0):.1f}%", cycles, f"{r.get('cosine_vs_float', float('nan')):.4f}",
            "yes" if r.get("fsim_equals_ref") else "NO", f"{r.get('cpu_relative_error', float('nan')):.1e} |"]))
    return "\n".join(lines)


def _summary(row: dict[str, Any]) -> str:
    """One line per model while the benchmark runs: the figures of its table row."""
    if not row["ok"]:
        return f"{row['model']}: {row['error']}"
    return (f"{row['model']}: cosine {row.get('cosine_vs_float')}, fsim == ref {row.get('fsim_equals_ref')}, "
            f"accel MACs {row.get('accel_mac_fraction')}, cycles {row.get('cycles')}, "
            f"cpu rel. error {row.get('cpu_relative_error')}")


def bench_zoo(config: str, path: str | None = None, model: str | None = None, seed: int = 0) -> dict[str, Any]:
    """Every model of folder `path` (default: the onnx wheel's light models; `model` picks one by name
    part) compiled for `config` and for the cpu, run on ref, fsim and cpu against onnxruntime."""
    import sys

    cfg = load_config(config)
    files = model_files(path)
    if model:
        files = [f for f in files if model in f.stem]
        if not files:
            raise UsageError(f"no model in the folder matches '{model}'")
    rows = []
    for f in files:
        start = time.perf_counter()
        rows.append(zoo_row(f, cfg, seed))
        rows[-1]["seconds"] = round(time.perf_counter() - start, 1)
        print(f"zoo: {_summary(rows[-1])} ({rows[-1]['seconds']} s)", file=sys.stderr, flush=True)
    table = format_table(rows)
    print(table, file=sys.stderr)
    return {"bench": "zoo", "config": cfg.name, "config_hash": cfg.hash, "folder": str(files[0].parent),
            "models": len(rows), "ok": sum(r["ok"] for r in rows), "rows": rows, "table": table.splitlines()}
