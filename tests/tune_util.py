"""The accelerator layers the tuner tests tune: a model compiled once per process (front end only)."""

from __future__ import annotations

import warnings
from functools import lru_cache

from weft.compiler import models
from weft.compiler.driver import compile_model
from weft.compiler.tune.measure import Layer, layers_of
from weft.config import AcceleratorConfig, load_config
from weft.core.errors import CalibrationWarning


@lru_cache(maxsize=4)
def accel_layers(model: str = "small_resnet", config: str = "tiny") -> tuple[AcceleratorConfig, list[Layer]]:
    """(config, the model's accelerator layers); schedules and cycles do not depend on calibration data."""
    cfg = load_config(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        art = compile_model(getattr(models, model)(), config=cfg, codegen=False)
    return cfg, layers_of(art.graph, cfg)
