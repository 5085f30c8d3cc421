"""`weft tune MODEL.onnx --trials N -o LOG`: tune the schedules of a model's accelerator layers;
`weft tune --show LOG [LOG...]`: merge logs and print the best schedule per workload."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from weft.cli_common import add_config_option, print_json
from weft.compiler.tune.host import tune_host
from weft.compiler.tune.log import TuningLog, workload_key
from weft.compiler.tune.measure import RtlMeasurer, TimingMeasurer, layers_of
from weft.compiler.tune.parallel import PoolMeasurer
from weft.compiler.tune.tuner import tune_model
from weft.config import load_config
from weft.core.errors import CalibrationWarning
from weft.errors import UsageError
from weft.progress import Waiting
from weft.runtime.cli import parse_device_option
from weft.runtime.cpu_device import default_threads
from weft.tools.board_measurer import BoardMeasurer

if TYPE_CHECKING:
    from weft.compiler.tune.measure import Measurer
    from weft.compiler.tune.tuner import LayerResult
    from weft.config import AcceleratorConfig

__all__ = ["add_tune_arguments", "run_tune"]


def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help="ONNX model to tune (omit with --show)")
    add_config_option(parser)
    parser.add_argument("--target", choices=("accel", "cpu"), default="accel",
                        help="what to tune: the accelerator layers, or the host convolutions of the model's float "
                             "graph (as `weft run --device cpu` runs it), timed on this CPU")
    parser.add_argument("--threads", type=int, default=None,
                        help="with --target cpu: threads the kernels run on (default: every core this process may "
                             "use); records are per thread count")
    parser.add_argument("--trials", type=int, default=64, help="measurements per distinct layer workload")
    parser.add_argument("--tuner", choices=("xgb", "random"), default="xgb", help="search strategy")
    parser.add_argument("--measure", choices=("timing", "rtl", "board"), default="timing",
                        help="where cycles come from: the timing model (fast), the RTL under Verilator (exact, "
                             "slow) or a PYNQ board's cycle counter (needs a board with the pynq package, or the "
                             "stand-in tests/fake_pynq on PYTHONPATH, and --device-option bitstream=PATH)")
    parser.add_argument("--device-option", action="append", type=parse_device_option, default=[], metavar="KEY=VALUE",
                        help="with --measure board: an option of the pynq device (repeatable): bitstream=PATH "
                             "(required; its manifest.json beside it), spec=REGS.json, ip_name=NAME, timeout_s=S")
    parser.add_argument("--repeat", type=int, default=1,
                        help="with --measure board: runs per schedule, the fewest cycles kept (DRAM refresh jitter)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="with --measure timing: processes measuring each batch in parallel (default: every core)")
    parser.add_argument("--no-transfer", action="store_true",
                        help="start every layer's cost model cold instead of learning from the layers tuned before "
                             "it and the log's other workloads on this config")
    parser.add_argument("--layers", help="comma-separated layer names to tune (default: all accelerator layers)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=4, help="schedules measured between cost-model fits")
    parser.add_argument("-o", "--output", help="JSON-lines log to append to (resumes from its records)")
    parser.add_argument("--show", nargs="*", metavar="LOG", help="merge these logs and print the best per workload")
    parser.add_argument("--merge-into", help="with --show: also write the merged log here")


def run_tune(args: argparse.Namespace) -> int:
    import warnings

    if args.show is not None:
        paths = list(args.show) + ([args.model] if args.model else [])
        if not paths:
            raise UsageError("--show needs at least one log")
        log = TuningLog.merge(paths)
        if args.merge_into:
            log.write(args.merge_into)
        config_hash = load_config(args.config).hash if args.config != "default" else None
        print_json(log.summary(config_hash))
        return 0
    if not args.model:
        raise UsageError("give a model to tune (or --show LOG)")
    if not args.output:
        raise UsageError("give the log to write with -o LOG")
    from weft.compiler.driver import compile_model  # optional dependency: onnx

    if args.target == "cpu":
        if args.measure != "timing" or args.jobs is not None:  # CPU time is measured here, one kernel at a time
            raise UsageError("--target cpu times kernels on this CPU, one at a time: no --measure or --jobs")
        with Waiting(f"compiling {args.model} for the host"):
            graph = compile_model(args.model, target="cpu", config=args.config).graph
        results = tune_host(graph, args.threads or default_threads(), trials=args.trials, tuner=args.tuner,
                            log=TuningLog(args.output), seed=args.seed, batch=args.batch,
                            layers=args.layers.split(",") if args.layers else None, transfer=not args.no_transfer)
        _report(results)
        return 0

    cfg = load_config(args.config)
    with warnings.catch_warnings(), Waiting(f"compiling {args.model} for config {cfg.name}"):
        warnings.simplefilter("ignore", CalibrationWarning)  # schedules and cycles do not depend on the data
        art = compile_model(args.model, config=cfg, codegen=False, seed=args.seed)
    layers = layers_of(art.graph, cfg)
    if args.layers:
        wanted = args.layers.split(",")
        unknown = sorted(set(wanted) - {x.geom.name for x in layers})
        if unknown:
            raise UsageError(f"'{unknown[0]}' is not an accelerator layer of the model")
        layers = [x for x in layers if x.geom.name in wanted]
    measurer = _measurer(args, cfg)
    workloads = len({workload_key(x.geom) for x in layers})
    print(f"tuning {len(layers)} accelerator layers ({workloads} distinct workloads), {args.trials} trials each, "
          f"measured by {measurer.name}: one progress line per workload", file=sys.stderr)
    try:
        results = tune_model(layers, cfg, measurer, trials=args.trials, tuner=args.tuner,
                             log=TuningLog(args.output), seed=args.seed, batch=args.batch,
                             transfer=not args.no_transfer)
    finally:
        close = getattr(measurer, "close", None)
        if close is not None:
            close()
    _report(results)
    return 0


def _report(results: list[LayerResult]) -> None:
    """The results as JSON on stdout (what scripts read) and one line per layer, its unit named, on stderr."""
    print_json([r.summary() for r in results])
    for r in results:
        print(r.line(), file=sys.stderr)


def _measurer(args: argparse.Namespace, cfg: AcceleratorConfig) -> Measurer:
    if args.jobs is not None and (args.jobs < 1 or args.measure != "timing"):
        raise UsageError(f"--jobs must be at least 1 and is for --measure timing (got {args.jobs} with "
                         f"--measure {args.measure})")

    if args.measure != "board":
        if args.device_option or args.repeat != 1:
            raise UsageError(f"--device-option and --repeat are for --measure board, not --measure {args.measure}")
        if args.measure == "rtl":
            return RtlMeasurer(cfg)
        jobs = args.jobs if args.jobs is not None else default_threads()
        if jobs == 1:
            return TimingMeasurer(cfg)

        return PoolMeasurer(lambda: TimingMeasurer(cfg), jobs)

    options = dict(args.device_option)
    if "bitstream" not in options:
        raise UsageError("--measure board needs the bitstream: --device-option bitstream=PATH (on a PYNQ board, "
                         "or with the stand-in tests/fake_pynq on PYTHONPATH)")
    return BoardMeasurer(cfg, repeat=args.repeat, **options)
