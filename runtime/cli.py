"""`weft run`: run a .weft artifact on a device and report its outputs and per-layer figures.

On the simulating devices (fsim, rtl) a progress bar on stderr follows the accelerator layers (quiet when
stderr is not a terminal). ``--trace`` writes a Chrome/Perfetto trace: on the rtl device, of the activity
the RTL itself recorded; elsewhere, of the timing model's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weft.core.files import write_atomic
from weft.errors import UsageError, user_file
from weft.progress import Progress
from weft.runtime.bitstreams import add_bitstream_arguments, run_bitstream
from weft.runtime.deploy import add_deploy_arguments, run_deploy
from weft.runtime.session import InferenceSession
from weft.runtime.trace import write_trace

if TYPE_CHECKING:
    from weft.progress import Progress
    from weft.runtime.devices import Device

__all__ = ["add_bitstream_arguments", "add_deploy_arguments", "add_run_arguments", "follow_layers",
           "parse_device_option", "run_bitstream", "run_deploy", "run_run"]

#: Devices that simulate the accelerator layer by layer (their ``on_layer`` hook drives the progress bar).
SIMULATING = ("fsim", "rtl")


def _input_arg(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE.npy, got '{text}'")
    return name, path


def parse_device_option(text: str) -> tuple[str, object]:
    """`--device-option KEY=VALUE` (argparse type): VALUE read as a bool (true, false), an int, a float, or
    kept as text."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with KEY a name, got '{text}'")
    if value.lower() in ("true", "false"):  # (else the text "false" would switch an option on)
        return key, value.lower() == "true"
    for kind in (int, float):
        try:
            return key, kind(value)
        except ValueError:
            pass
    return key, value


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", help="a .weft file")
    parser.add_argument("--device", default="ref",
                        help="device to run on: ref, fsim, rtl, pynq, cpu, cuda or remote:HOST:PORT")
    parser.add_argument("--device-option", action="append", type=parse_device_option, default=[], metavar="KEY=VALUE",
                        help="an option of the device (repeatable), e.g. bitstream=DIR for pynq, simulator=icarus "
                             "for rtl, threads=2 for cpu; numbers are read as numbers")
    parser.add_argument("--config", default=None,
                        help="config the device is built for (default: the artifact's); another config is refused")
    parser.add_argument("--input", action="append", type=_input_arg, default=[], metavar="NAME=FILE.npy",
                        help="an input array (repeatable); inputs not given are seeded random normal values")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--output", metavar="OUT.npz", help="write the outputs to this .npz file")
    parser.add_argument("--stats", metavar="FILE.json", help="write the run's figures (per layer) as JSON")
    parser.add_argument("--trace", metavar="TRACE.json",
                        help="write a Chrome/Perfetto trace of load, compute and store (recorded from the RTL on "
                             "--device rtl, else from the timing model)")
    parser.add_argument("--allow-nonfinite", action="store_true",
                        help="let inputs holding NaN or Inf through (refused by default)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (it shows only when stderr is a terminal)")


def follow_layers(device: Device, bar: Progress) -> None:
    """Advance `bar` after each accelerator layer `device` (fsim or rtl) runs, noting the layer and the
    cycles so far (the RTL's counts on rtl, the timing model's on fsim)."""
    previous = getattr(device, "on_layer", None)
    total = [0]

    def on_layer(layer: dict[str, Any], dram: Any, when: str) -> None:
        if previous is not None:
            previous(layer, dram, when)
        if when == "after":
            cycles = device.layer_cycles(layer)  # type: ignore[attr-defined]
            total[0] += cycles or 0
            bar.advance(note=f"{layer['name']}" + (f", {total[0]:,} cycles" if cycles is not None else ""))

    device.on_layer = on_layer  # type: ignore[attr-defined]


def cycles_text(stats: dict[str, Any]) -> str:
    """The run's accelerator cycles, or why there are none: ref, cpu and cuda do not model the accelerator's
    clock (their ``stats["cycles"]`` is None)."""
    if stats["cycles"] is not None:
        return f"{stats['cycles']:,} accelerator cycles"
    return f"cycles: n/a (device {stats['device']} does not count accelerator cycles)"


def tuning_log_text(device: Device, stats: dict[str, Any], log: object) -> str:
    """Whether ``--device-option tuning_log=...`` changed anything: how many convolutions took a logged
    schedule (a log timed with another thread count or on another CPU gives none)."""
    convs = len(getattr(getattr(device, "plan", None), "convs", {}) or {})
    tuned = stats.get("tuned_convs")
    if tuned is None:
        return f"tuning log {log}: not used (device {stats['device']} takes no tuning log)"
    text = f"tuning log {log}: applied to {tuned} of {convs} convolutions"
    if not tuned:
        threads = stats.get("threads")
        text += (f" (it holds no schedule timed on this CPU with {threads} threads for these workloads; "
                 "the heuristic's tiles were used)")
    return text


def run_run(args: argparse.Namespace) -> int:
    import io

    import numpy as np

    options = dict(args.device_option)
    if args.trace and args.device == "rtl":
        options["trace"] = True
    sess = InferenceSession(args.artifact, device=args.device, config=args.config,
                            allow_nonfinite=args.allow_nonfinite, **options)
    try:
        inputs = {arg.name: arg for arg in sess.get_inputs()}
        feeds: dict[str, np.ndarray] = {}
        for name, path in args.input:
            if name not in inputs:
                raise UsageError(f"--input names '{name}', which is not a model input (inputs: {', '.join(inputs)})")
            try:
                feeds[name] = np.load(path, allow_pickle=False)
            except (ValueError, OSError) as err:
                raise UsageError(f"--input {name}: {path} is not a readable .npy file ({err})") from None
        rng = np.random.default_rng(args.seed)
        for name, arg in inputs.items():
            if name not in feeds:
                feeds[name] = rng.standard_normal(arg.shape).astype(np.float32)
                print(f"input '{name}': seeded random normal {arg.shape} (seed {args.seed})")
        layers = getattr(sess.device, "layers", None) if args.device in SIMULATING else None
        enabled = False if args.no_progress or not layers else None
        with Progress(len(layers) if layers else None, f"run on {args.device}", enabled=enabled) as bar:
            if layers:
                follow_layers(sess.device, bar)
            outputs = sess.run(None, feeds)
        names = [o.name for o in sess.get_outputs()]
        for name, value in zip(names, outputs, strict=True):
            flat = value.reshape(value.shape[0], -1) if value.ndim > 1 else value.reshape(1, -1)
            print(f"output '{name}': {list(value.shape)} {value.dtype}, argmax {flat.argmax(axis=1).tolist()}")
        stats = sess.stats
        assert stats is not None
        print(f"device {stats['device']}: {stats['macs']:,} MACs, {100 * stats['accel_mac_fraction']:.1f}% on the "
              f"accelerator, {stats['seconds'] * 1e3:.1f} ms wall time, {cycles_text(stats)}")
        if "tuning_log" in options:
            print(tuning_log_text(sess.device, stats, options["tuning_log"]))
        if args.output:
            buf = io.BytesIO()
            np.savez(buf, **dict(zip(names, outputs, strict=True)))
            with user_file(args.output, "output"):
                write_atomic(Path(args.output), buf.getvalue())
        if args.stats:
            with user_file(args.stats, "stats file"):
                write_atomic(Path(args.stats), json.dumps(stats, indent=2, default=str).encode())
        if args.trace:
            with user_file(args.trace, "trace"):
                info = write_trace(sess.artifact, args.trace, getattr(sess.device, "trace_layers", None))
            print(f"trace: {args.trace} ({info['cycles']} cycles, {info['source']})")
    finally:
        close = getattr(sess.device, "close", None)
        if close is not None:  # a simulator process, a board connection
            close()
    return 0
