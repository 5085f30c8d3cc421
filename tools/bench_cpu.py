"""`weft bench cpu`: weft's generated host code against onnxruntime, in the same run, on the same threads.

The model runs batch 1 on the "cpu" device and on onnxruntime's CPU provider with
``intra_op_num_threads`` equal to weft's thread count, in alternating blocks of runs (each runtime in its
steady state: onnxruntime's threads spin for a while after a run and would slow a run of weft started
right after it; alternating blocks still spread load from other processes over both), and the medians,
the best runs and their ratios are reported. Two single operators
follow, as GFLOP/s against the machine's measured peak: the 3x3 convolution 56x56x64 -> 64 of ResNet's
first stage, and a 512x512x512 matrix product (x @ W with W a constant, as in a dense layer).

The peak is measured, not looked up: a generated kernel of independent fused multiply-adds on registers
(one load per 14 FMAs), run on the same threads; the best of many short calls, since load from other
processes can only lower it. Operator figures give the median and the best run; the fraction of peak
compares best with best.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from weft.compiler.llvm import nn
from weft.compiler.llvm.jit import build
from weft.compiler.llvm.layout import Layout
from weft.compiler.llvm.peak import call_times, measure_peak
from weft.compiler.llvm.target import host_target
from weft.compiler.tune.host import CpuTimeMeasurer, host_tasks, tuned_schedules
from weft.compiler.tune.log import TuningLog
from weft.compiler.tune.tuner import tune_tasks
from weft.core.float_ops import conv2d
from weft.errors import UsageError
from weft.runtime.cpu_device import default_threads
from weft.runtime.session import InferenceSession

__all__ = ["bench_cpu", "bench_cpu_tune"]

#: the goal: weft's latency at most onnxruntime's (same run, same threads)
GOAL_RATIO = 1.0


def _bench_conv(threads: int, repeat: int) -> dict[str, Any]:
    target = host_target()
    b = target.lanes(4)
    spec = nn.ConvSpec(1, 64, 58, 58, 64, 3, 3, (1, 1), b, b)  # 56x56 padded by 1
    fn = build(nn.conv_kernel("conv", spec, target, act="relu"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 64, 58, 58)).astype(np.float32)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32) * 0.05
    bias = rng.standard_normal(64).astype(np.float32)
    xb, wb = Layout(b).to_numpy(x), nn.pack_conv_weights(w, b, b)
    y = np.empty((1, 64 // b, 56, 56, b), np.float32)
    fn(xb, wb, bias.reshape(-1, b), y, nthreads=threads)
    want = np.maximum(conv2d(x, w, bias, (1, 1), (0, 0, 0, 0)), 0)
    err = float(np.abs(Layout(b).from_numpy(y) - want).max() / np.abs(want).max())
    times = call_times(lambda: fn(xb, wb, bias.reshape(-1, b), y, nthreads=threads), repeat)
    return _op_figures("1x64x56x56 -> 64, 3x3, pad 1", spec.flops, times, err)


def _op_figures(shape: str, flops: int, times: list[float], err: float) -> dict[str, Any]:
    sec, best = statistics.median(times), min(times)
    return {"shape": shape, "gflop": flops / 1e9, "ms": sec * 1e3, "gflops": flops / sec / 1e9,
            "best_ms": best * 1e3, "best_gflops": flops / best / 1e9, "max_rel_err": err}


def _bench_matmul(threads: int, repeat: int) -> dict[str, Any]:
    target = host_target()
    n = 512
    bo = target.lanes(4)
    fn = build(nn.dense_kernel("matmul", n, n, n, bo, target))
    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, n)).astype(np.float32)
    w = rng.standard_normal((n, n)).astype(np.float32)  # y = a @ w.T, w constant (packed once)
    wp, zero = nn.pack_dense_weights(w, bo), np.zeros((n // bo, bo), np.float32)
    y = np.empty((n, n // bo, bo), np.float32)
    fn(a, wp, zero, y, nthreads=threads)
    want = a @ w.T
    err = float(np.abs(y.reshape(n, n) - want).max() / np.abs(want).max())
    times = call_times(lambda: fn(a, wp, zero, y, nthreads=threads), repeat)
    return _op_figures("512x512 @ 512x512", 2 * n**3, times, err)


def _load_model(model: str) -> tuple[Any, int]:
    """A built-in model by name, or an .onnx file (placeholder weights of the onnx wheel's light models
    drawn at random, as the zoo does), and the index of the output to compare: the logits before a final
    Softmax (random weights make the probabilities one-hot, which would hide any error). A name that is
    neither raises UsageError listing the names."""
    from weft.compiler import models  # optional dependency: onnx
    from weft.compiler.onnx_import import load_model
    from weft.tools.zoo import with_logits_output, with_random_weights

    if model in models.MODELS:
        return with_logits_output(models.MODELS[model]())
    if model.endswith(".onnx") or Path(model).is_file():
        return with_logits_output(with_random_weights(load_model(model)))
    raise UsageError(f"unknown model '{model}': neither an .onnx file nor a built-in model "
                     f"({', '.join(models.MODELS)})")


def _random_inputs(onnx_model: Any, seed: int) -> dict[str, np.ndarray]:
    """A random float32 input for each graph input, batch 1: a symbolic leading dimension becomes 1, any
    other symbolic dimension is refused naming the input (the benchmark runs static shapes)."""
    from weft.compiler.onnx_import import declared_inputs

    rng = np.random.default_rng(seed)
    feeds = {}
    for name, (dims, dtype) in declared_inputs(onnx_model).items():
        if dtype != "float32":
            raise UsageError(f"graph input '{name}' is {dtype}; the cpu benchmark feeds float32 inputs")
        unknown = [axis for axis, d in enumerate(dims) if not isinstance(d, int) and axis > 0]
        if unknown:
            raise UsageError(f"graph input '{name}' has symbolic dimensions {unknown} ({dims}); export the model "
                             "with static shapes (batch may stay symbolic)")
        feeds[name] = rng.standard_normal([d if isinstance(d, int) else 1 for d in dims]).astype(np.float32)
    return feeds


def _machine(threads: int, peak: float) -> dict[str, Any]:
    """What the figures were measured on: the CPU's model name, LLVM's name for it, its vector width, the
    threads and the measured peak (GFLOP/s figures are shares of it)."""
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    target = host_target()
    return {"cpu": name, "llvm_cpu": target.cpu, "vector_bits": 8 * target.vector_bytes, "cores": os.cpu_count(),
            "threads": threads, "peak_gflops": peak}


def _ort_session(onnx_model: Any, threads: int) -> Any:
    """onnxruntime's CPU provider on `threads` threads, one operator at a time (as weft runs)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(onnx_model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def bench_cpu(config: str, model: str = "resnet18", repeat: int = 20, threads: int | None = None,
              seed: int = 0) -> dict[str, Any]:
    """Latency of `model` (a built-in name or an .onnx file; batch 1) on weft's "cpu" device and on
    onnxruntime, same threads; then the conv and matmul operator figures against the measured peak, and
    each of the slowest layers' GFLOP/s as a share of that peak. Times are medians in milliseconds."""
    from weft.compiler.driver import compile_model

    threads = threads or default_threads()
    repeat = max(1, repeat)
    onnx_model, k = _load_model(model)
    start = time.perf_counter()
    artifact = compile_model(onnx_model, target="cpu", config=config)
    sess = InferenceSession(artifact, device="cpu", threads=threads)
    compile_seconds = time.perf_counter() - start
    ort_sess = _ort_session(onnx_model, threads)
    x = _random_inputs(onnx_model, seed)
    got, want = sess.run(None, x)[k], ort_sess.run(None, x)[k]
    err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    weft_t, ort_t = [], []
    rounds = 3
    for _ in range(rounds):  # blocks, alternating: each runtime in its steady state, load hits both alike
        for runner, times in ((lambda: sess.run(None, x), weft_t), (lambda: ort_sess.run(None, x), ort_t)):
            time.sleep(0.05)  # let the other runtime's spinning threads park
            times += call_times(runner, max(1, repeat // rounds), warmup=2)
    weft_ms, ort_ms = statistics.median(weft_t) * 1e3, statistics.median(ort_t) * 1e3
    best_ratio = min(weft_t) / min(ort_t)
    stats = sess.stats or {}
    macs = stats.get("macs") or 0
    layers = stats.get("layers", [])
    slowest = sorted(layers, key=lambda layer: -layer["seconds"])[:8]
    by_op: dict[str, float] = {}
    for layer in layers:  # where weft's time goes, by op (the last run)
        by_op[layer["op"]] = by_op.get(layer["op"], 0.0) + layer["seconds"] * 1e3
    peak = measure_peak(threads)
    conv = _bench_conv(threads, repeat)
    matmul = _bench_matmul(threads, repeat)
    for figures in (conv, matmul):  # best against best: both as an otherwise idle machine would give them
        figures["fraction_of_peak"] = figures["best_gflops"] / peak
    return {
        "model": model, "batch": 1, "threads": threads, "repeat": repeat,
        "weft_ms": weft_ms, "onnxruntime_ms": ort_ms, "ratio": weft_ms / ort_ms,
        "weft_best_ms": min(weft_t) * 1e3, "onnxruntime_best_ms": min(ort_t) * 1e3, "best_ratio": best_ratio,
        "goal_ratio": GOAL_RATIO, "meets_goal": weft_ms / ort_ms <= GOAL_RATIO,
        "weft_gflops": 2 * macs / (weft_ms / 1e3) / 1e9, "onnxruntime_gflops": 2 * macs / (ort_ms / 1e3) / 1e9,
        "max_rel_err_vs_onnxruntime": err, "compile_seconds": compile_seconds,
        "kernels": stats.get("kernels"), "ms_by_op": by_op, "peak_gflops": peak, "conv3x3": conv,
        "matmul512": matmul,
        "slowest_layers": [_layer_figures(layer, peak) for layer in slowest],
        "machine": _machine(threads, peak),
    }


def _layer_figures(layer: dict[str, Any], peak: float) -> dict[str, Any]:
    """One layer of the last run: its time, GFLOP/s and that rate's share of the machine's measured peak.
    The FLOPs are the direct convolution's: a Winograd layer does fewer, so its share may pass 1."""
    gflops = 2 * layer["macs"] / max(layer["seconds"], 1e-12) / 1e9
    return {"name": layer["name"], "op": layer["op"], "algorithm": layer.get("algorithm"),
            "ms": layer["seconds"] * 1e3, "gflops": gflops, "fraction_of_peak": gflops / peak}


def bench_cpu_tune(config: str, model: str = "resnet18", repeat: int = 30, threads: int | None = None,
                   trials: int = 24, seed: int = 0, log: str | None = None) -> dict[str, Any]:
    """Tune the model's distinct host convolutions against CPU time (`trials` per workload, xgb with
    transfer between workloads; `log`: a JSON-lines log to resume from and append to), then per workload
    the heuristic's schedule against the tuned one, and the whole model (batch 1) untuned, tuned and on
    onnxruntime, all on `threads` threads.

    The machine is shared, so each comparison alternates its contenders in blocks: per workload, three
    rounds of (default, tuned) measurements, each the fastest of its samples, keeping each contender's
    fastest; for the model, six rounds of (untuned, tuned, onnxruntime) blocks of runs, each block
    started when the measurer's probe finds the machine quiet (or after 2 s of waiting), reporting
    medians and best runs in milliseconds."""
    from weft.compiler.driver import compile_model

    threads = threads or default_threads()
    onnx_model, k = _load_model(model)
    artifact = compile_model(onnx_model, target="cpu", config=config)
    tasks = host_tasks(artifact.graph, threads)
    tuning_log = TuningLog(log)
    measurer = CpuTimeMeasurer()
    start = time.perf_counter()
    results = tune_tasks(tasks, measurer, trials=trials, log=tuning_log, seed=seed, batch=8)  # type: ignore[arg-type]
    tune_seconds = time.perf_counter() - start
    best = tuned_schedules(tuning_log, threads)
    workloads = []
    for r in results:
        task = next(t for t in tasks if t.workload == r.workload)
        default, tuned = task.defaults()[0], best.get(r.workload, task.defaults()[0])
        ns: dict[str, list[int]] = {"default": [], "tuned": []}
        for _ in range(3):
            for name, s in (("default", default), ("tuned", tuned)):
                ns[name].append(measurer.measure(task.subject, s))
        d, t = min(ns["default"]), min(ns["tuned"])
        workloads.append({"layers": [x.name for x in tasks if x.workload == r.workload], "space": r.space,
                          "trials": len(r.history), "default_ns": d, "tuned_ns": t, "speedup": d / t,
                          "default": default.to_dict(), "tuned": tuned.to_dict()})
    conv_default = sum(w["default_ns"] * len(w["layers"]) for w in workloads) / 1e6
    conv_tuned = sum(w["tuned_ns"] * len(w["layers"]) for w in workloads) / 1e6

    x = _random_inputs(onnx_model, seed)
    plain = InferenceSession(artifact, device="cpu", threads=threads)
    tuned_sess = InferenceSession(artifact, device="cpu", threads=threads, tuning_log=tuning_log)
    ort_sess = _ort_session(onnx_model, threads)
    want = ort_sess.run(None, x)[k]
    errors = {}
    for name, sess in (("untuned", plain), ("tuned", tuned_sess)):
        got = sess.run(None, x)[k]
        errors[name] = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    runners = {"untuned": lambda: plain.run(None, x), "tuned": lambda: tuned_sess.run(None, x),
               "onnxruntime": lambda: ort_sess.run(None, x)}
    times: dict[str, list[float]] = {k: [] for k in runners}
    rounds, waited = 6, 0.0
    for _ in range(rounds):
        for name, fn in runners.items():
            time.sleep(0.05)  # let onnxruntime's spinning threads park
            start = time.perf_counter()
            while measurer.is_busy(threads) and time.perf_counter() - start < 2.0:
                time.sleep(0.1)
            waited += time.perf_counter() - start
            times[name] += call_times(fn, max(1, repeat // rounds), warmup=2)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    best_ms = {k: min(v) * 1e3 for k, v in times.items()}
    return {
        "model": model, "batch": 1, "threads": threads, "trials_per_workload": trials,
        "workloads": len(workloads), "conv_layers": len(tasks), "tune_seconds": tune_seconds,
        "measurements": sum(w["trials"] for w in workloads), "target": tasks[0].target if tasks else None,
        "per_workload": workloads,
        "conv_ms_default": conv_default, "conv_ms_tuned": conv_tuned, "conv_speedup": conv_default / conv_tuned,
        "untuned_ms": ms["untuned"], "tuned_ms": ms["tuned"], "onnxruntime_ms": ms["onnxruntime"],
        "untuned_best_ms": best_ms["untuned"], "tuned_best_ms": best_ms["tuned"],
        "onnxruntime_best_ms": best_ms["onnxruntime"],
        "speedup": ms["untuned"] / ms["tuned"], "best_speedup": best_ms["untuned"] / best_ms["tuned"],
        "ratio_untuned": ms["untuned"] / ms["onnxruntime"], "ratio_tuned": ms["tuned"] / ms["onnxruntime"],
        "best_ratio_tuned": best_ms["tuned"] / best_ms["onnxruntime"], "goal_ratio": GOAL_RATIO,
        "tuned_convs": (tuned_sess.stats or {}).get("tuned_convs"),
        # measurements retried because the probe found the machine busy, and those never found it quiet
        "busy_retries": measurer.busy_retries, "busy_measurements": measurer.busy,
        "model_wait_seconds": waited,
        "max_rel_err_vs_onnxruntime": errors,
    }
