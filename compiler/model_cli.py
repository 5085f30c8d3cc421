"""`weft model NAME -o NAME.onnx`: write a built-in test model, or random calibration inputs for it.

The README's commands need models and calibration data without downloading anything; this writes the
seeded models of :mod:`weft.compiler.models` and, with ``--samples N``, an ``.npz`` of N batches of seeded
standard-normal inputs in the shape of the model's inputs (one array per input, named like it: the
format ``weft compile --calibration`` reads).
"""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import numpy as np

from weft.errors import UsageError, user_file

__all__ = ["add_model_arguments", "run_model"]


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="a built-in model (see --list)")
    parser.add_argument("-o", "--output", help="the .onnx file to write (default NAME.onnx), or with --samples "
                                               "the .npz file (default NAME_samples.npz)")
    parser.add_argument("--list", action="store_true", help="list the built-in models and exit")
    parser.add_argument("--seed", type=int, default=None, help="seed of the weights (and of --samples' inputs)")
    parser.add_argument("--batch", type=int, default=None, help="the model's batch size (default: the model's own)")
    parser.add_argument("--samples", type=int, default=None, metavar="N",
                        help="write N batches of random inputs for `weft compile --calibration` instead of the model")


def _describe(builder: object) -> str:
    """The builder's docstring's first clause: up to its first ': ' or '. ', never cut mid-phrase."""
    paragraph = " ".join((inspect.getdoc(builder) or "").split("\n\n")[0].split())
    for stop in (": ", ". "):
        paragraph = paragraph.split(stop)[0]
    return paragraph.rstrip(".")


def run_model(args: argparse.Namespace) -> int:
    from weft.compiler import models  # optional dependency: onnx

    if args.list:
        for name, builder in models.MODELS.items():
            print(f"{name:14s} {_describe(builder)}")
        return 0
    if args.name is None:
        raise UsageError("name a model (weft model --list shows them)")
    if args.name not in models.MODELS:
        raise UsageError(f"unknown model '{args.name}'; known models: {', '.join(models.MODELS)}")
    options = {k: v for k, v in (("seed", args.seed), ("batch", args.batch)) if v is not None}
    model = models.MODELS[args.name](**options)
    if args.samples is None:
        path = Path(args.output or f"{args.name}.onnx")
        with user_file(path, "output"):
            models.save(model, path)
        print(f"wrote {path}")
        return 0
    if args.samples < 1:
        raise UsageError(f"--samples must be at least 1, got {args.samples}")
    rng = np.random.default_rng(args.seed or 0)
    inits = {t.name for t in model.graph.initializer}
    arrays = {}
    for value in model.graph.input:
        if value.name in inits:
            continue
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        # A stack of batches (one more leading axis): each batch has the model's input shape.
        arrays[value.name] = rng.standard_normal((args.samples, *shape)).astype(np.float32)
    path = Path(args.output or f"{args.name}_samples.npz")
    with user_file(path, "output"):
        np.savez(path, **arrays)
    print(f"wrote {path} ({args.samples} batches of {', '.join(f'{k} {v.shape[1:]}' for k, v in arrays.items())})")
    return 0
