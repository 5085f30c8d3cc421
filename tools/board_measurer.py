"""The board measurer: a layer's program run on a PYNQ board, its cycles read from the accelerator's counter.

:class:`BoardMeasurer` lowers the layer as the other measurers do (:func:`~weft.compiler.tune.measure.lower`,
an image of zero activations and the layer's constants) and runs it through the board's own code: the
``pynq`` device (:class:`~weft.runtime.pynq_device.PynqDevice`) and its :class:`~weft.runtime.driver.Driver`
(relocation, launch checks, AXI-Lite registers, STATUS polling, the watchdog). The device is made once,
so the bitstream's manifest and the CONFIG_HASH registers are checked once, and the overlay and its DMA
buffer stay open across the hundreds of schedules a tuning run measures.

The measurement is the 64-bit CYCLES counter, which counts from START to done in the accelerator's clock:
host-side polling does not enter it. On the stand-in (``tests/fake_pynq``) it is the functional simulator's
register model (cycles from the timing model) or the RTL simulation, so the figures equal
:class:`~weft.compiler.tune.measure.TimingMeasurer`'s or :class:`~weft.compiler.tune.measure.RtlMeasurer`'s.
One exception, as on a board: a DRAM whose bandwidth limit is a free-running pattern (the RTL's Pynq
timing: 3 beats in 4 cycles) makes a program's count depend on the pattern's phase at START by a cycle or
two; the cosimulation starts every job in one phase, a board wherever the previous run left it. Hence
``repeat``, which keeps the fewest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from weft.compiler.tune.measure import Layer, lower
from weft.errors import UsageError, WeftError
from weft.runtime.devices import create_device
from weft.runtime.driver import RunError, WatchdogError
from weft.runtime.pynq_device import PynqDevice
from weft.runtime.safety import LaunchError

if TYPE_CHECKING:
    from weft.compiler.backend.schedule import Schedule
    from weft.config import AcceleratorConfig
    from weft.runtime.driver import Driver

__all__ = ["BoardMeasurer", "BoardTimeout"]

#: The smallest DMA buffer the measurer asks for; larger ones are powers of two, so a tuning run whose
#: images grow a little from schedule to schedule allocates a handful of buffers, not one per schedule.
MIN_BUFFER_BYTES = 1 << 16


class BoardTimeout(WeftError, ValueError):
    """The accelerator did not finish a layer's program; ``report`` is the driver's watchdog report (status,
    counters, the stuck units). The driver has reset the accelerator (downloaded the bitstream again)."""

    def __init__(self, message: str, report: dict[str, Any]):
        self.report = report
        super().__init__(message)


def _buffer_bytes(nbytes: int) -> int:
    return max(MIN_BUFFER_BYTES, 1 << (nbytes - 1).bit_length())


class BoardMeasurer:
    """Cycles of a layer's program on a PYNQ board (or its stand-in).

    `device_options` are the ``pynq`` device's: ``bitstream`` (the ``.bit``, its ``manifest.json`` beside
    it; required), ``spec`` (the register spec JSON written by ``weft rtl``), ``ip_name`` and ``timeout_s``
    (the watchdog's budget per run); another option is refused, naming it. With `repeat` > 1 each schedule
    runs that many times and the smallest count is kept (DRAM refresh can delay a run on a board).

    A run that stops with an error code raises ValueError naming the layer, the schedule, the error and the
    instruction; one that does not finish raises :class:`BoardTimeout` with the watchdog's diagnosis (the
    stuck unit and the queue it waits on). Both are failed trials to the tuner, which goes on. Close the
    measurer (or use it as a context manager) to free the buffers and the overlay.
    """

    name = "board"

    def __init__(self, config: AcceleratorConfig, *, repeat: int = 1, **device_options: Any) -> None:
        if repeat < 1:
            raise UsageError(f"repeat must be at least 1, got {repeat}")
        if device_options.get("bitstream") is None:
            raise UsageError("the board measurer needs the bitstream: bitstream=PATH (the .bit, its "
                             "manifest.json beside it)")
        self.config, self.repeat = config, repeat
        # The registry's factory checks the option names against the device's and refuses others.
        try:
            device = create_device("pynq", config, **device_options)
        except ModuleNotFoundError as err:
            if err.name != "pynq":
                raise
            raise UsageError("the board measurer runs on a PYNQ board (the pynq package is not installed here); "
                             "without one, put the stand-in tests/fake_pynq on PYTHONPATH") from err
        assert isinstance(device, PynqDevice)
        self.device = device
        self.driver: Driver = device.driver

    def measure(self, layer: Layer, schedule: Schedule) -> int:
        low = lower(layer, schedule, self.config)
        image = low.plan.image(0)
        where = f"layer '{layer.geom.name}' under {schedule}"
        self.driver.ensure_buffer(_buffer_bytes(image.size))
        best: int | None = None
        for _ in range(self.repeat):
            try:
                # run_image writes the DRAM after the run into its argument: every repeat starts afresh.
                result = self.driver.run_image(image.copy(), low.insn_addr, len(low.insns))
            except RunError as err:
                raise ValueError(f"{where}: {err}") from err
            except LaunchError as err:
                raise ValueError(f"{where}: the driver refused to launch it: {err}") from err
            except WatchdogError as err:
                # The driver reset the accelerator by downloading the bitstream again: check it is still ours.
                self.driver.check_hardware()
                raise BoardTimeout(f"{where}: {err}", err.report) from err
            cycles = int(result["counters"]["cycles"])
            best = cycles if best is None else min(best, cycles)
        assert best is not None
        return best

    def close(self) -> None:
        self.device.close()

    def __enter__(self) -> BoardMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
