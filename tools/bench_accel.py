"""Model benchmarks. Speed targets live here, not in unit tests.

* `weft bench compile`: how long a model takes to compile (front end and back end) and to run on the
  reference interpreter and on the functional simulator, whether the two agree to the bit, and how close
  the int8 outputs stay to float onnxruntime.
* `weft bench latency`: latency hiding on versus off (two virtual threads versus one, same tiles), per
  convolution layer, in cycles of the timing model; without a timing model it says so and reports what
  the instruction streams show (instructions, tokens).
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from weft.compiler.backend import generate
from weft.config import load_config
from weft.core.accel_section import AccelSection, accel_section
from weft.core.artifact import Artifact
from weft.errors import UsageError
from weft.runtime.fsim_device import timing_model
from weft.runtime.session import InferenceSession
from weft.sim.cosim import Job, run_jobs

__all__ = ["bench_compile", "bench_latency", "replay_jobs"]


def _accel(artifact: Artifact) -> AccelSection:
    section = accel_section(artifact)
    if section is None:
        raise ValueError("the artifact has no instruction streams: the benchmarks need the accelerator back end")
    return section


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _model_and_inputs(model: str, calibration_batches: int, seed: int) -> tuple[Any, dict, dict]:
    from weft.compiler import models  # optional dependency: onnx

    if model not in models.MODELS:
        raise UsageError(f"unknown model '{model}' (models: {', '.join(models.MODELS)})")
    onnx_model = models.MODELS[model]()
    inp = onnx_model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    rng = np.random.default_rng(seed)
    calibration = {inp.name: rng.standard_normal((calibration_batches, *shape)).astype(np.float32)}
    return onnx_model, calibration, {inp.name: rng.standard_normal(shape).astype(np.float32)}


def _median_run(sess: Any, feeds: dict, repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        out = sess.run(None, feeds)[0]
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def bench_compile(config: str, model: str = "resnet18", repeat: int = 3, calibration_batches: int = 4,
                  seed: int = 0) -> dict[str, Any]:
    """Compile `model` (a name from :data:`weft.compiler.models.MODELS`) for `config` with seeded random
    calibration inputs, then run it on "ref" and "fsim" `repeat` times; medians in seconds."""
    # optional dependencies: onnx (the models, the compiler's importer) and onnxruntime
    import onnxruntime as ort

    from weft.compiler.driver import compile_model  # optional dependency: onnx

    cfg = load_config(config)
    onnx_model, calibration, x = _model_and_inputs(model, calibration_batches, seed)
    compile_times, backend_times, artifact = [], [], None
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        artifact = compile_model(onnx_model, config=cfg, calibration=calibration)
        compile_times.append(time.perf_counter() - start)
        backend_times.append(_accel(artifact).compile_seconds)
    assert artifact is not None
    sess = InferenceSession(artifact, device="ref")
    ref_seconds, out = _median_run(sess, x, repeat)
    fsim = InferenceSession(artifact, device="fsim")
    fsim_seconds, fsim_out = _median_run(fsim, x, repeat)
    # Layer by layer, once: every accelerator layer's DRAM output against the reference's packed integers.
    sess.run(None, x, keep_intermediates=True)
    fsim.run(None, x, keep_intermediates=True)
    accel = [n.outputs[0] for n in artifact.graph.nodes if n.attrs.get("target") == "accel"]
    exact = all(np.array_equal(fsim.intermediate(v), sess.intermediate(v)) for v in accel)
    ort_sess = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    start = time.perf_counter()
    want = ort_sess.run(None, x)[0]
    ort_seconds = time.perf_counter() - start
    stats = sess.stats or {}
    fstats = fsim.stats or {}
    section = _accel(artifact)
    accel_macs = sum(layer.get("accel_macs", 0) for layer in fstats.get("layers", []))
    slowest = sorted(fstats.get("layers", []), key=lambda layer: -layer["seconds"])[:5]
    return {
        "model": model, "config": cfg.name, "config_hash": cfg.hash, "calibration_batches": calibration_batches,
        "macs": stats.get("macs"), "accel_mac_fraction": fstats.get("accel_mac_fraction"),
        "layers": len(artifact.graph.nodes), "accel_programs": len(section.layers),
        "instructions": sum(layer.insn_count for layer in section.layers),
        "dram_image_bytes": section.dram_bytes, "artifact_bytes": len(artifact.to_bytes()),
        "compile_seconds": statistics.median(compile_times), "backend_seconds": statistics.median(backend_times),
        "ref_seconds": ref_seconds, "ref_gmac_per_second": (stats.get("macs") or 0) / ref_seconds / 1e9,
        "fsim_seconds": fsim_seconds, "fsim_gmac_per_second": accel_macs / fsim_seconds / 1e9,
        "fsim_padded_macs": accel_macs, "fsim_equals_ref": exact,
        "fsim_equals_ref_outputs": bool(np.array_equal(out, fsim_out)), "cycles": fstats.get("cycles"),
        "onnxruntime_float_seconds": ort_seconds, "cosine_vs_onnxruntime": _cosine(fsim_out, want),
        "slowest_fsim_layers": [{k: layer[k] for k in ("name", "op", "macs", "seconds")} for layer in slowest],
    }


def replay_jobs(artifact: Any, feeds: dict, names: set[str], *, chains: bool = False) -> tuple[dict, dict, Any]:
    """Run `artifact` on fsim, keeping for each accelerator layer in `names` the DRAM image it starts from
    (a cosimulation job of its program) and the image it leaves; returns (jobs, images after, stats). With
    `chains`, a chain's first layer (:mod:`weft.compiler.backend.chain`) in `names` stands for the chain:
    its job runs the chain's program and its image after is the chain's."""
    jobs, after = {}, {}
    # a chain's last layer -> its first (whose job stands for the chain)
    last = {x["chain"]["layers"][-1]: x["name"] for x in artifact.sections["accel"].meta["layers"]
            if chains and "chain" in x}

    def keep(layer: dict[str, Any], dram: Any, when: str) -> None:
        name = layer["name"]
        if when == "after" and last.get(name) in names:
            after[last[name]] = dram.data.copy()
        if name not in names:
            return
        program = layer["chain"] if chains and "chain" in layer else layer
        if when == "before":
            jobs[name] = Job(dram=dram.data.copy(), insn_addr=program["insn_addr"],
                             insn_count=program["insn_count"], timeout_cycles=50_000_000, label=name)
        elif program is layer:
            after[name] = dram.data.copy()

    sess = InferenceSession(artifact, device="fsim", on_layer=keep, chains=chains)
    sess.run(None, feeds)
    return jobs, after, sess.stats


def bench_latency(config: str, model: str = "resnet18", repeat: int = 1, calibration_batches: int = 2,
                  seed: int = 0, rtl: str | None = None, layers: Sequence[str] | None = None,
                  dram_timing: str = "pynq") -> dict[str, Any]:
    """Per convolution layer: cycles with two virtual threads (latency hiding) and with one (same tiles).

    Cycles come from the timing model when this build has one, or with ``rtl="verilator"`` (or
    "icarus") from the generated RTL itself, each layer replayed from its DRAM image under the
    `dram_timing` DRAM model and its output checked against fsim to the bit. `layers` limits the layers
    (RTL simulation takes about a minute per ResNet-18 layer). GEMM utilization is padded MACs over
    cycles times the config's MACs per cycle; ``useful_utilization`` counts the layer's real MACs instead
    (lower for grouped layers, whose weight tiles are zero outside each group)."""
    from weft.compiler.driver import compile_model  # optional dependency: onnx

    del repeat  # one run per variant: cycles are deterministic
    cfg = load_config(config)
    onnx_model, calibration, x = _model_and_inputs(model, calibration_batches, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on = compile_model(onnx_model, config=cfg, calibration=calibration)
    off = Artifact(on.graph, on.config, on.target, meta=on.meta)
    generate(off, latency_hiding=False)
    convs = [n.name for n in on.graph.nodes if n.op == "qconv2d" and n.attrs.get("target") == "accel"]
    chosen = [name for name in convs if layers is None or name in set(layers)]
    if layers is not None and len(chosen) != len(set(layers)):
        raise UsageError(f"layers {sorted(set(layers) - set(chosen))} are not accelerator convolutions of "
                         f"{model} (they are: {', '.join(convs)})")
    source = f"rtl:{rtl}" if rtl else "timing model" if timing_model() is not None else None
    variants: dict[str, dict[str, Any]] = {}
    for key, art in (("on", on), ("off", off)):
        start = time.perf_counter()
        jobs, after, stats = replay_jobs(art, x, set(chosen) if source and source.startswith("rtl") else set())
        per_layer = {rec["name"]: rec for rec in stats["layers"]}
        cycles = {name: per_layer[name]["cycles"] for name in chosen}
        matches: dict[str, bool] = {}
        if source and source.startswith("rtl"):
            results = run_jobs(cfg, str(rtl), [jobs[name] for name in chosen], timing=dram_timing)
            for name, result in zip(chosen, results, strict=True):
                cycles[name] = result.cycles if result.error_code == 0 else None
                image = after[name]
                matches[name] = result.error_code == 0 and bool(np.array_equal(result.dram[:image.size], image))
        variants[key] = {"cycles": cycles, "matches": matches, "stats": per_layer,
                         "seconds": time.perf_counter() - start,
                         "meta": {layer.name: layer.record for layer in _accel(art).layers}}
    rows = []
    for name in chosen:
        m_on, m_off = variants["on"]["meta"][name], variants["off"]["meta"][name]
        padded = variants["on"]["stats"][name]["accel_macs"]
        row: dict[str, Any] = {
            "name": name, "macs": variants["on"]["stats"][name]["macs"], "padded_macs": padded,
            "schedule": m_on["schedule"], "insns_on": m_on["insn_count"], "insns_off": m_off["insn_count"],
            "tokens_peak_on": m_on["tokens_peak"], "tokens_peak_off": m_off["tokens_peak"],
            "cycles_on": variants["on"]["cycles"][name], "cycles_off": variants["off"]["cycles"][name],
        }
        if row["cycles_on"] and row["cycles_off"]:
            row["speedup"] = row["cycles_off"] / row["cycles_on"]
            for key in ("on", "off"):
                row[f"utilization_{key}"] = padded / (row[f"cycles_{key}"] * cfg.macs_per_cycle)
            row["useful_utilization"] = row["macs"] / (row["cycles_on"] * cfg.macs_per_cycle)
        if variants["on"]["matches"]:
            row["rtl_equals_fsim"] = variants["on"]["matches"][name] and variants["off"]["matches"][name]
        rows.append(row)
    have_cycles = bool(rows) and all(row["cycles_on"] and row["cycles_off"] for row in rows)
    result: dict[str, Any] = {
        "bench": "latency", "model": model, "config": cfg.name, "config_hash": cfg.hash,
        "cycles_from": source, "available": have_cycles,
        "dram_timing": dram_timing if source and source.startswith("rtl") else None,
        "seconds": {k: v["seconds"] for k, v in variants.items()}, "layers": rows,
    }
    if have_cycles:
        total_on = sum(row["cycles_on"] for row in rows)
        total_off = sum(row["cycles_off"] for row in rows)
        padded = sum(row["padded_macs"] for row in rows)
        result.update(conv_cycles_on=total_on, conv_cycles_off=total_off, speedup=total_off / total_on,
                      utilization_on=padded / (total_on * cfg.macs_per_cycle),
                      utilization_off=padded / (total_off * cfg.macs_per_cycle),
                      useful_utilization=sum(row["macs"] for row in rows) / (total_on * cfg.macs_per_cycle))
    elif source is None:
        result["reason"] = ("no timing model in this build (weft.sim.timing), so cycles are unknown; "
                            "bench_latency(config, model, rtl='verilator', layers=[...]) measures them on the RTL")
    else:
        result["reason"] = f"the {source} gave no cycles for some layers"
    return result
