"""`weft run`: run a .weft artifact on a device and report its outputs and per-layer figures."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from weft.runtime.bitstreams import add_bitstream_arguments, run_bitstream
from weft.runtime.deploy import add_deploy_arguments, run_deploy

__all__ = ["add_bitstream_arguments", "add_deploy_arguments", "add_run_arguments", "run_bitstream", "run_deploy",
           "run_run"]


def _input_arg(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE.npy, got '{text}'")
    return name, path


def _device_option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with KEY a name, got '{text}'")
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
    parser.add_argument("--device-option", action="append", type=_device_option, default=[], metavar="KEY=VALUE",
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
                        help="write a Chrome/Perfetto trace of load, compute and store (timing model)")


def run_run(args: argparse.Namespace) -> int:
    import io

    import numpy as np

    from weft.runtime.artifact import write_atomic
    from weft.runtime.session import InferenceSession

    options = dict(args.device_option)
    sess = InferenceSession(args.artifact, device=args.device, config=args.config, **options)
    inputs = {arg.name: arg for arg in sess.get_inputs()}
    feeds: dict[str, np.ndarray] = {}
    for name, path in args.input:
        if name not in inputs:
            raise ValueError(f"--input names '{name}', which is not a model input (inputs: {', '.join(inputs)})")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as err:
            raise ValueError(f"--input {name}: {path} is not a readable .npy file ({err})") from None
    rng = np.random.default_rng(args.seed)
    for name, arg in inputs.items():
        if name not in feeds:
            feeds[name] = rng.standard_normal(arg.shape).astype(np.float32)
            print(f"input '{name}': seeded random normal {arg.shape} (seed {args.seed})")
    outputs = sess.run(None, feeds)
    names = [o.name for o in sess.get_outputs()]
    for name, value in zip(names, outputs, strict=True):
        flat = value.reshape(value.shape[0], -1) if value.ndim > 1 else value.reshape(1, -1)
        print(f"output '{name}': {list(value.shape)} {value.dtype}, argmax {flat.argmax(axis=1).tolist()}")
    stats = sess.stats
    assert stats is not None
    print(f"device {stats['device']}: {stats['macs']:,} MACs, {100 * stats['accel_mac_fraction']:.1f}% on the "
          f"accelerator, {stats['seconds'] * 1e3:.1f} ms, cycles {stats['cycles']}")
    if args.output:
        buf = io.BytesIO()
        np.savez(buf, **dict(zip(names, outputs, strict=True)))
        write_atomic(Path(args.output), buf.getvalue())
    if args.stats:
        write_atomic(Path(args.stats), json.dumps(stats, indent=2, default=str).encode())
    if args.trace:
        from weft.runtime.trace import write_trace

        info = write_trace(sess.artifact, args.trace)
        print(f"trace: {args.trace} ({info['cycles']} cycles, timing model)")
    return 0
