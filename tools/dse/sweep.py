"""One design point (compile, time, synthesize) and a sweep of many on a process pool or a Dask cluster.

A point travels to its worker as plain data (the model's bytes, the config as a dict), so the same
function runs unchanged in a local :class:`~concurrent.futures.ProcessPoolExecutor` and on a Dask
cluster's workers.
"""

from __future__ import annotations

import concurrent.futures
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import weft
from weft.config import AcceleratorConfig
from weft.core.accel_section import accel_section
from weft.core.artifact import Artifact
from weft.core.errors import CalibrationWarning, CompileError
from weft.core.files import sources_digest
from weft.errors import UsageError
from weft.hw.synth import BOARDS, cached_synthesis, default_cache, estimate_area, fits, synthesize
from weft.runtime.dram_runner import AcceleratorImage
from weft.runtime.fsim_device import ProgramTimer
from weft.sim.timing import TimingModel

__all__ = ["evaluate_point", "fsim_cycles", "program_cycles", "run_sweep", "sources_fingerprint"]


def sources_fingerprint() -> str:
    """A hash of weft's Python sources (all but its tests): a sweep's row stands for its point only while they
    are what produced it (the compiler's programs, the timing model, the hardware), so ``--resume`` keeps a row
    only under the same fingerprint."""
    root = Path(weft.__file__).parent
    packages = [d for d in sorted(root.iterdir()) if (d / "__init__.py").is_file() and d.name != "tests"]
    files = [*sorted(root.glob("*.py")), *(f for d in packages for f in sorted(d.rglob("*.py")))]
    return sources_digest(files, root)[:16]


def program_cycles(artifact: Artifact) -> list[int]:
    """The timing model's cycles of every accelerator layer of `artifact`, in program order, as the runtime
    runs them (a layer with its relayout programs; the layers of a chain, its part of the chain's program)."""
    if accel_section(artifact) is None:
        raise CompileError("the artifact has no instruction streams (section 'accel') to time")
    image = AcceleratorImage(artifact, artifact.config, "dse")
    timer = ProgramTimer(TimingModel(artifact.config), image)
    return [timer.cycles(layer) for layer in image.layers.values()]


def fsim_cycles(artifact: Artifact, seed: int = 0) -> int:
    """Cycles of one run of `artifact` on the functional simulator with the timing model, on seeded normal
    inputs: the whole model executed, every result computed, not only its instruction streams timed."""
    import numpy as np

    from weft.runtime.session import InferenceSession

    session = InferenceSession(artifact, device="fsim", timing=True)
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in session.get_inputs():
        if arg.type != "tensor(float)":
            raise CompileError(f"input '{arg.name}' is {arg.type}: the sweep feeds float tensors only")
        feeds[arg.name] = rng.standard_normal(arg.shape).astype(np.float32)
    session.run(None, feeds)
    return int(session.stats["cycles"])


def evaluate_point(model: bytes, config: dict[str, Any], knobs: dict[str, float], *, area: bool = True,
                   family: str = "xc7", seed: int = 0, cached_only: bool = False,
                   fsim: bool = False) -> dict[str, Any]:
    """Compile `model` for `config`, time every accelerator layer, and (with `area`) synthesize the design.

    A point that the compiler refuses (a layer that does not fit the buffers, say) comes back with its
    error instead of figures, so one bad point never sinks a sweep. With `cached_only`, the area comes from
    the synthesis cache alone: a point never synthesized has no Yosys area and costs no Yosys run, so a sweep
    cut short is written up from what it finished. Every row with `area` also carries the geometry's
    estimate (``bram36_est``, and ``dsp_min``, a lower bound), which a point never synthesized still has.
    With `fsim`, the point also runs on the functional simulator (:func:`fsim_cycles`, ``fsim_cycles``).
    """
    from weft.compiler.driver import compile_model  # optional dependency: onnx

    cfg = AcceleratorConfig.from_dict(config)
    row: dict[str, Any] = {"config": cfg.name, "config_hash": cfg.hash, **knobs,
                           "macs_per_cycle": cfg.macs_per_cycle, "clock_mhz": cfg.clock_mhz,
                           "sources": sources_fingerprint()}
    try:
        with warnings.catch_warnings():
            # A sweep compares configs on the same seeded calibration; the warning says so once per point.
            warnings.simplefilter("ignore", CalibrationWarning)
            artifact = compile_model(model, config=cfg, seed=seed)
        layers = program_cycles(artifact)
        ran = {"fsim_cycles": fsim_cycles(artifact, seed)} if fsim else {}
    except Exception as err:  # every failure of a point is reported in its row
        row["error"] = f"{type(err).__name__}: {err}"
        return row
    cycles = sum(layers)
    # Layers an accelerator limit sent to the host add no cycles here: say how many, so no point looks faster
    # than it is.
    row.update(cycles=cycles, latency_us=cycles / cfg.clock_mhz, layers=len(layers),
               host_fallbacks=len(artifact.graph.meta.get("fallbacks", {})), **ran)
    if area:
        estimate = estimate_area(cfg)
        row.update(bram36_est=estimate["bram36"], dsp_min=estimate["dsp"])
        try:
            synth = cached_synthesis(cfg, family, default_cache()) if cached_only \
                else synthesize(cfg, family=family, cache=default_cache())
        except Exception as err:
            row["error"] = f"synth: {type(err).__name__}: {err}"
            return row
        if synth is None:
            return row
        row.update(synth["area"])
        # The Yosys run's own time, also for a cached result: what the point costs to synthesize afresh.
        row["synth_s"] = synth.get("seconds")
        row["fits"] = ",".join(b for b in sorted(BOARDS) if fits(synth["area"], BOARDS[b])["fits"])
    return row


def _local(jobs: list[tuple], workers: int | None) -> Iterator[dict[str, Any]]:
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(evaluate_point, *args, **kwargs) for args, kwargs in jobs]
        for future in concurrent.futures.as_completed(futures):
            yield future.result()


def _dask(jobs: list[tuple], address: str) -> Iterator[dict[str, Any]]:
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        raise UsageError("--scheduler needs dask[distributed] (pip install 'weft[dse]')") from None
    with Client(address) as client:
        futures = [client.submit(evaluate_point, *args, pure=False, **kwargs) for args, kwargs in jobs]
        for future in as_completed(futures):
            yield future.result()


def run_sweep(model: bytes, configs: list[tuple[dict[str, float], AcceleratorConfig]], *, area: bool = True,
              family: str = "xc7", seed: int = 0, workers: int | None = None, scheduler: str | None = None,
              on_done: Callable[[dict[str, Any]], None] | None = None,
              cached_only: bool = False, fsim: bool = False) -> list[dict[str, Any]]:
    """Evaluate every point (:func:`evaluate_point`); rows come back in the order of `configs`. `scheduler`:
    a Dask scheduler address (or a ``Client``-compatible cluster address); default: a local process pool of
    `workers`."""
    # The largest designs first: a point's Yosys time grows with its array (block 32 with batch 2 takes about
    # 15 times block 8's), and a pool that starts them last ends with one worker busy and the rest idle.
    biggest_first = sorted(configs, key=lambda point: -point[1].macs_per_cycle)
    jobs = [((model, cfg.to_dict(), knobs), {"area": area, "family": family, "seed": seed,
                                             "cached_only": cached_only, "fsim": fsim})
            for knobs, cfg in biggest_first]
    rows = []
    stream = _dask(jobs, scheduler) if scheduler else _local(jobs, workers)
    for row in stream:
        rows.append(row)
        if on_done is not None:
            on_done(row)
    order = {cfg.name: i for i, (_, cfg) in enumerate(configs)}
    return sorted(rows, key=lambda r: order[r["config"]])
