"""Bad inputs to the tools around the accelerator: tuning logs (torn or damaged lines, merges that fail),
tuning pools whose parent dies, `weft asm` on files that are not instructions or text, and LLVM cache files
that do not verify. Each names the culprit, loses nothing and overwrites nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from weft.cli import main
from weft.compiler.tune.log import TornLogWarning, TuningLog


def _rec(k: int, cycles: int | None = 100) -> dict:
    return {"workload": json.dumps({"w": k}), "config": "c", "layer": f"l{k}", "schedule": {"tile": k},
            "cycles": cycles, "measurer": "timing", "error": None, "time": 0.0}


def _lines(*recs: dict) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in recs)


def _cli_fails(capsys, argv: list[str], *fragments: str) -> str:
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, err
    return err


# ---- tuning logs -----------------------------------------------------------------------------------------


def test_torn_last_line_is_skipped_with_a_warning_and_cut_on_append(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text(_lines(_rec(0), _rec(1)) + '{"workload": "w2", "con')  # killed mid-write
    with pytest.warns(TornLogWarning, match=r"run\.jsonl:3: skipping a torn last line"):
        log = TuningLog(path)
    assert [r["layer"] for r in log.records] == ["l0", "l1"]
    log.add(_rec(3))  # resumes: the torn bytes go, the new record is a whole line
    reopened = TuningLog(path)
    assert [r["layer"] for r in reopened.records] == ["l0", "l1", "l3"]


def test_torn_last_line_of_a_log_opened_read_only_is_left_alone(tmp_path):
    path = tmp_path / "run.jsonl"
    text = _lines(_rec(0)) + '{"workl'
    path.write_text(text)
    with pytest.warns(TornLogWarning, match="run.jsonl:2"):
        merged = TuningLog.merge([path])
    assert len(merged.records) == 1 and path.read_text() == text


def test_unparseable_middle_line_is_an_error(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text(_lines(_rec(0)) + '{"workload": "w1", "con\n' + _lines(_rec(2)))
    with pytest.raises(ValueError, match=r"run\.jsonl:2: not a JSON record"):
        TuningLog(path)


def test_unparseable_complete_last_line_is_an_error(tmp_path):
    """A last line with its newline was written whole: damage, not a cut."""
    path = tmp_path / "run.jsonl"
    path.write_text(_lines(_rec(0)) + "garbage\n")
    with pytest.raises(ValueError, match=r"run\.jsonl:2: not a JSON record"):
        TuningLog(path)


def test_merge_into_with_a_bad_log_leaves_the_destination_unchanged(tmp_path, capsys):
    good, bad, dest = tmp_path / "good.jsonl", tmp_path / "bad.jsonl", tmp_path / "merged.jsonl"
    good.write_text(_lines(_rec(0)))
    bad.write_text("not json\n" + _lines(_rec(1)))
    dest.write_text("precious\n")
    _cli_fails(capsys, ["tune", "--show", str(good), str(bad), "--merge-into", str(dest)], "bad.jsonl:1")
    assert dest.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "good.jsonl", "merged.jsonl"]


def test_merge_write_that_fails_leaves_the_destination_and_no_temporary(tmp_path):
    dest = tmp_path / "merged.jsonl"
    dest.write_text(_lines(_rec(0)))
    log = TuningLog(records=[_rec(1), {**_rec(2), "schedule": object()}])  # cannot be written as JSON
    with pytest.raises(TypeError):
        log.write(dest)
    assert dest.read_text() == _lines(_rec(0)) and [p.name for p in tmp_path.iterdir()] == ["merged.jsonl"]


def test_merge_into_replaces_the_destination_whole(tmp_path, capsys):
    a, dest = tmp_path / "a.jsonl", tmp_path / "merged.jsonl"
    a.write_text(_lines(_rec(0), _rec(1)))
    dest.write_text("old\n")
    assert main(["tune", "--show", str(a), "--merge-into", str(dest)]) == 0
    capsys.readouterr()
    assert dest.read_text() == _lines(_rec(0), _rec(1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "merged.jsonl"]


_POOL_PARENT = textwrap.dedent("""
    import sys, time
    from weft.compiler.tune.parallel import PoolMeasurer

    class Slow:
        name = "slow"
        def measure(self, subject, schedule):
            time.sleep(0.01)
            return 1

    pool = PoolMeasurer(Slow, 2)
    pool.measure_pairs([("s", k) for k in range(4)])
    print(" ".join(str(p) for p in pool._pool._processes), flush=True)
    time.sleep(60)
""")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_pool_workers_die_with_a_killed_parent():
    parent = subprocess.Popen([sys.executable, "-c", _POOL_PARENT], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(p) for p in parent.stdout.readline().split()]
        assert len(workers) == 2 and all(_alive(p) for p in workers)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        parent.stdout.close()
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in workers if _alive(p)]
    for pid in left:  # do not leave them running if the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {left} outlived their parent"


# ---- weft asm --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [3, 17, 40])
def test_disassembling_partial_instructions_names_the_file_and_its_length(tmp_path, capsys, size):
    path = tmp_path / "prog.bin"
    path.write_bytes(bytes(size))
    _cli_fails(capsys, ["asm", "-d", str(path)], "prog.bin", f"{size} bytes", "16-byte instructions")


def test_assembling_binary_garbage_names_the_file_and_offset(tmp_path, capsys):
    path = tmp_path / "prog.s"
    path.write_bytes(b"FINISH\n\x00\x9f\xff")
    _cli_fails(capsys, ["asm", str(path)], "prog.s", "offset 8", "0x9f", "not UTF-8")


def test_assembly_error_names_the_file_and_line(tmp_path, capsys):
    path, out = tmp_path / "prog.s", tmp_path / "prog.bin"
    path.write_text("FINISH\nFROB 1\n")
    out.write_bytes(b"old")
    _cli_fails(capsys, ["asm", str(path), "-o", str(out)], "prog.s: line 2", "FROB")
    assert out.read_bytes() == b"old"


# ---- LLVM object cache -----------------------------------------------------------------------------------


def _kernel(scale: float = 2.0):
    from weft.compiler.llvm.expr import Buffer, const
    from weft.compiler.llvm.te import Kernel, compute

    a = Buffer("a", (8,))
    b = compute("b", (8,), lambda i: a[i] * const(scale, "f32") + const(1.0, "f32"))
    return Kernel("scaled_plus_one", [a], [b.out], [b])


def _run(fn) -> np.ndarray:
    x = np.arange(8, dtype=np.float32)
    y = np.empty(8, np.float32)
    fn(x, y)
    return y


@pytest.mark.parametrize("damage", ["flip_object_byte", "truncate", "raw_object_without_digest", "other_key"])
def test_cache_file_that_does_not_verify_is_recompiled_not_run(tmp_path, damage):
    from weft.compiler.llvm.jit import build, cache_info, clear_cache

    clear_cache()
    want = _run(build(_kernel(), cache_dir=tmp_path))
    (path,) = tmp_path.glob("*.o")
    good = path.read_bytes()
    if damage == "flip_object_byte":  # code bytes changed, digest kept: what a careless edit leaves
        bad = good[:-64] + bytes(b ^ 0xFF for b in good[-64:])
    elif damage == "truncate":
        bad = good[:len(good) // 2]
    elif damage == "raw_object_without_digest":  # an object as older versions cached it
        bad = good[len(b"weft-llvm-object-1\n") + 32:]
    else:  # a whole verified file of another kernel, renamed onto this key
        build(_kernel(3.0), cache_dir=tmp_path / "other")
        (other,) = (tmp_path / "other").glob("*.o")
        bad = other.read_bytes()
        other.unlink()
        (tmp_path / "other").rmdir()
    path.write_bytes(bad)
    clear_cache()  # as a new process: only the folder remains
    got = _run(build(_kernel(), cache_dir=tmp_path))
    np.testing.assert_array_equal(got, want)
    assert cache_info()["rejected"] == 1 and cache_info()["disk_hits"] == 0 and cache_info()["misses"] == 1
    assert path.read_bytes() == good  # rewritten with a verified copy
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # written atomically: no temporary left


def test_tampered_cross_object_is_recompiled(tmp_path):
    from weft.compiler.llvm.jit import cache_info, clear_cache, compile_object

    ir = "define i32 @f(i32 %x) {\n  %y = add i32 %x, 1\n  ret i32 %y\n}\n"
    clear_cache()
    obj = compile_object(ir, "host", cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.o")
    path.write_bytes(path.read_bytes()[:-8] + b"\xcc" * 8)
    clear_cache()
    assert compile_object(ir, "host", cache_dir=tmp_path) == obj
    assert cache_info()["rejected"] == 1
