"""The tuning log: JSON lines, one measurement each, keyed by layer workload and config hash.

A record: ``{"workload": KEY, "config": HASH, "layer": NAME, "schedule": {...}, "cycles": N | null,
"measurer": "timing", "error": MSG | null, "time": UNIX}``. A workload key is the layer's geometry
without its name, so every layer of the same shape shares its records; the config hash is
:attr:`AcceleratorConfig.hash` (only hardware knobs count). Logs are appended to, merged by
concatenation (duplicates keep the lowest cycles), and resumed: a point already in the log is not measured
again.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weft.compiler.backend.schedule import LayerGeom, Schedule
from weft.core.files import write_atomic
from weft.errors import WeftError, read_input, user_file

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["LogError", "TornLogWarning", "TuningLog", "best_schedules", "record", "task_record", "workload_key"]


def workload_key(geom: LayerGeom) -> str:
    """A stable key of what a layer computes (its geometry in blocks, without its name)."""
    fields = asdict(geom)
    del fields["name"]
    if fields["groups"] == 1:  # keys of ungrouped layers stay those of logs written before grouped layers
        del fields["groups"]
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def record(geom: LayerGeom, config: AcceleratorConfig, schedule: Schedule, cycles: int | None, measurer: str,
           error: str | None = None) -> dict[str, Any]:
    return {"workload": workload_key(geom), "config": config.hash, "layer": geom.name,
            "schedule": schedule.to_dict(), "cycles": cycles, "measurer": measurer, "error": error,
            "time": time.time()}


def _as_dict(schedule: Any) -> dict[str, Any]:
    return schedule.to_dict() if hasattr(schedule, "to_dict") else dict(schedule)


def task_record(workload: str, target: str, layer: str, schedule: dict[str, Any], cost: int | None, measurer: str,
                error: str | None = None, unit: str = "cycles") -> dict[str, Any]:
    """A record of any tuning task (accelerator layer or host kernel); `unit` says what `cycles` counts."""
    rec = {"workload": workload, "config": target, "layer": layer, "schedule": schedule, "cycles": cost,
           "measurer": measurer, "error": error, "time": time.time()}
    if unit != "cycles":
        rec["unit"] = unit
    return rec


class LogError(WeftError, ValueError):
    """A tuning log that cannot be read: a damaged line or a record without its fields; names the file and
    the line."""


class TornLogWarning(UserWarning):
    """The last line of a tuning log is cut short (a run killed mid-write); it is skipped."""


def _read(path: Path) -> tuple[list[dict[str, Any]], int | None]:
    """The records of a log, and where a torn last line starts (None: the file ends cleanly). Torn: the
    last line, unparseable and without its newline. An unparseable line elsewhere is an error: records
    after it were written later, so the file was damaged, not cut short."""
    data = read_input(path, "tuning log")
    lines = data.splitlines(keepends=True)
    last = max((k for k, line in enumerate(lines) if line.strip()), default=-1)
    out: list[dict[str, Any]] = []
    offset = 0
    for k, raw in enumerate(lines):
        start, offset = offset, offset + len(raw)
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            why = err.msg if isinstance(err, json.JSONDecodeError) else "not UTF-8"
            if k == last and not raw.endswith(b"\n"):  # records are written newline last: cut mid-write
                warnings.warn(f"{path}:{k + 1}: skipping a torn last line ({why})", TornLogWarning, stacklevel=3)
                return out, start
            raise LogError(f"{path}:{k + 1}: not a JSON record ({why})") from None
        missing = [key for key in ("workload", "config", "schedule", "cycles") if key not in rec]
        if missing:
            raise LogError(f"{path}:{k + 1}: tuning record lacks '{missing[0]}'")
        out.append(rec)
    return out, None


class TuningLog:
    """Records in memory, optionally backed by a JSON-lines file that new records are appended to."""

    def __init__(self, path: str | Path | None = None, records: Iterable[dict[str, Any]] = ()) -> None:
        self.path = Path(path) if path is not None else None
        self.records: list[dict[str, Any]] = list(records)
        self._torn_at: int | None = None  # where the next append cuts off a torn last line
        if self.path is not None and self.path.exists():
            found, self._torn_at = _read(self.path)
            self.records.extend(found)

    @classmethod
    def merge(cls, paths: Iterable[str | Path]) -> TuningLog:
        out = cls()
        for p in paths:
            out.records.extend(_read(Path(p))[0])
        return out

    def add(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)
        if self.path is not None:
            with user_file(self.path, "tuning log"):
                if self._torn_at is not None:  # an append after the torn bytes would tear the new record too
                    with self.path.open("r+b") as f:
                        f.truncate(self._torn_at)
                    self._torn_at = None
                with self.path.open("a") as f:
                    f.write(json.dumps(rec, sort_keys=True) + "\n")

    def measured(self, workload: str, config_hash: str,
                 parse: Callable[[Mapping[str, Any]], Hashable] = Schedule.from_dict) -> dict[Any, int | None]:
        """Every schedule measured for a workload on a config (or host target) -> its best cycles (None: it
        failed); `parse` turns a logged schedule into a point (accelerator schedules by default)."""
        out: dict[Any, int | None] = {}
        for rec in self.records:
            if rec["workload"] != workload or rec["config"] != config_hash:
                continue
            s = parse(rec["schedule"])
            c = rec["cycles"]
            old = out.get(s)
            out[s] = c if old is None else (old if c is None else min(old, c))
        return out

    def best(self, workload: str, config_hash: str,
             parse: Callable[[Mapping[str, Any]], Hashable] = Schedule.from_dict) -> tuple[Any, int] | None:
        ok = [(c, s) for s, c in self.measured(workload, config_hash, parse).items() if c is not None]
        if not ok:
            return None
        c, s = min(ok, key=lambda cs: (cs[0], json.dumps(_as_dict(cs[1]), sort_keys=True)))
        return s, c

    def others(self, config_hash: str, exclude: set[str]) -> dict[str, dict[str, tuple[dict[str, Any], int]]]:
        """Successful records on a config (or host target) of workloads outside `exclude`: workload ->
        schedule JSON -> (schedule dict, best cycles). What a cost model learns from before a new task."""
        out: dict[str, dict[str, tuple[dict[str, Any], int]]] = {}
        for rec in self.records:
            if rec["config"] != config_hash or rec["workload"] in exclude or rec["cycles"] is None:
                continue
            by = out.setdefault(rec["workload"], {})
            key = json.dumps(rec["schedule"], sort_keys=True)
            if key not in by or rec["cycles"] < by[key][1]:
                by[key] = (rec["schedule"], rec["cycles"])
        return out

    def summary(self, config_hash: str | None = None) -> list[dict[str, Any]]:
        """One row per (workload, config): layer names seen, trials, best cycles and schedule."""
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for rec in self.records:
            if config_hash is None or rec["config"] == config_hash:
                groups.setdefault((rec["workload"], rec["config"]), []).append(rec)
        rows = []
        for (wl, ch), recs in groups.items():
            # schedules as logged (accelerator layers and host kernels alike), hashable
            best = self.best(wl, ch, lambda d: frozenset(d.items()))
            rows.append({"layers": sorted({r.get("layer") or "?" for r in recs}), "config": ch,
                         "workload": json.loads(wl), "trials": len(recs),
                         "failed": sum(r["cycles"] is None for r in recs), "unit": recs[0].get("unit", "cycles"),
                         "best_cycles": best[1] if best else None,
                         "best_schedule": dict(sorted(best[0])) if best else None})
        return rows

    def write(self, path: str | Path) -> None:
        """The records to `path`, atomically: a failure leaves the old file as it was."""
        write_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.records).encode())


def best_schedules(log: TuningLog | str | Path, geoms: Iterable[LayerGeom], config: AcceleratorConfig
                   ) -> dict[str, Schedule]:
    """Layer name -> the best logged schedule of its workload on `config` (layers without records are left out)."""
    if not isinstance(log, TuningLog):
        path = Path(log)
        if not path.is_file():
            raise LogError(f"tuning log '{path}' does not exist")
        log = TuningLog(path)
    out = {}
    for g in geoms:
        best = log.best(workload_key(g), config.hash)
        if best is not None:
            out[g.name] = best[0]
    return out
