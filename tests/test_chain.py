"""Consecutive accelerator layers as one program (weft.compiler.backend.chain): which layers chain, the
chain's program bit-exact and faster than the layers' own programs on fsim and the RTL, its figures split
by layer, the ordering through DRAM (a layer's input loads after its producer's stores), and artifacts
whose chains are malformed refused."""

from __future__ import annotations

import numpy as np
import pytest

import weft
from weft.compiler import models
from weft.compiler.backend.chain import BARRIER_NOTE
from weft.config import PRESETS
from weft.core.artifact import Artifact
from weft.core.artifact_schema import ArtifactError
from weft.isa.constants import MemId, Opcode, Unit
from weft.isa.encoding import decode_insns
from weft.sim.timing import TimingModel, part_cycles

from .test_bad_inputs_artifact import with_manifest
from .test_e2e import _compile, _shape
from .test_frontend_util import rand


@pytest.fixture(scope="module")
def resnet():
    model = models.MODELS["small_resnet"]()
    name, shape = _shape(model)
    return _compile(model, "default"), {name: rand(*shape, seed=5)}


def _chain_insns(art, head):
    meta = art.sections["accel"].meta
    layer = next(x for x in meta["layers"] if x["name"] == head)
    const = art.sections["accel"].array("const")
    start = layer["chain"]["insn_addr"] - meta["const_base"]
    words = const[start:start + layer["chain"]["insn_count"] * layer["insn_bytes"]]
    return layer, decode_insns(art.config, words)


def test_the_accelerator_layers_between_host_layers_form_one_chain(resnet):
    art, _ = resnet
    layers = art.sections["accel"].meta["layers"]
    heads = [x for x in layers if "chain" in x]
    assert len(heads) == 1 and heads[0]["chain"]["layers"] == [x["name"] for x in layers]
    assert all(x["chain_head"] == heads[0]["name"] for x in layers[1:])
    # host layers between accelerator layers end a chain: awkward_cnn's stem and branches, then a host
    # average pool and concatenation, then eight more accelerator layers (the stem's output, read back by
    # the host's pool, stays in its buffer: it may chain)
    awkward = _compile(models.MODELS["awkward_cnn"](), "tiny").sections["accel"].meta["layers"]
    names = [x["name"] for x in awkward]
    assert [x["chain"]["layers"] for x in awkward if "chain" in x] == [names[:3], names[3:]]


def test_a_chain_runs_bit_exact_faster_and_split_by_layer(resnet):
    art, feeds = resnet
    ref = weft.InferenceSession(art, device="ref").run(None, feeds)
    alone = weft.InferenceSession(art, device="fsim", chains=False)
    chained = weft.InferenceSession(art, device="fsim")
    for r, a, c in zip(ref, alone.run(None, feeds), chained.run(None, feeds), strict=True):
        np.testing.assert_array_equal(r, a)
        np.testing.assert_array_equal(r, c)
    assert chained.stats["cycles"] < alone.stats["cycles"]
    layers_a = {x["name"]: x for x in alone.stats["layers"] if x["target"] == "accel"}
    layers_c = {x["name"]: x for x in chained.stats["layers"] if x["target"] == "accel"}
    # each layer's work is its own, whichever program ran it: MACs, ALU ops and DRAM bytes per memory
    for name, a in layers_a.items():
        c = layers_c[name]
        assert (c["accel_macs"], c["alu_ops"], c["bytes"]) == (a["accel_macs"], a["alu_ops"], a["bytes"]), name
        assert c["chain"] == next(iter(layers_c))
    # the layers' cycles add up to the chain program's on the timing model
    head, insns = _chain_insns(art, next(iter(layers_c)))
    report = TimingModel(art.config).simulate(insns, head["chain"]["insn_addr"])
    parts = part_cycles(report.trace, head["chain"]["ends"])
    assert [layers_c[n]["cycles"] for n in head["chain"]["layers"]] == parts
    assert abs(sum(parts) - report.cycles) <= 4  # (the FINISH's own cycles)


def test_a_layer_loads_its_inputs_only_after_their_producers_stores(resnet):
    """The one ordering program order cannot give: through DRAM. On the timing model's trace, every load of
    an activation a layer of the chain reads starts after the last store of the layer that made it ends,
    and some loads (weights) of a layer start before the layer before has ended."""
    art, _ = resnet
    names = [x["name"] for x in art.sections["accel"].meta["layers"]]
    head, insns = _chain_insns(art, names[0])
    ends = head["chain"]["ends"]
    trace = TimingModel(art.config).simulate(insns, head["chain"]["insn_addr"]).trace
    part = np.searchsorted(ends, np.arange(len(insns)), side="right")
    meta = {x["name"]: x for x in art.sections["accel"].meta["layers"]}
    made = {meta[n]["output"]: k for k, n in enumerate(names)}
    barriers = [i for i in range(len(insns)) if insns["opcode"][i] == Opcode.LOAD and insns["x_size"][i] == 0
                and insns["mem_id"][i] == MemId.ACC]
    # one barrier a layer that reads an earlier one's output, but a shortcut shares its block's first
    # convolution's (both read the block's input)
    readers = [n for n in names[1:] if any(x in made for x in meta[n]["inputs"])]
    shortcuts = [n for n in readers if "downsample" in n]
    assert shortcuts and len(barriers) == len(readers) - len(shortcuts), BARRIER_NOTE
    ahead = 0
    for k, name in enumerate(names[1:], start=1):
        producers = [made[x] for x in meta[name]["inputs"] if x in made]
        stores = [i for i in range(len(insns)) if part[i] in producers and insns["opcode"][i] == Opcode.STORE]
        done = max(trace["end"][i] for i in stores)
        mine = np.flatnonzero(part == k)
        for i in mine:
            if insns["opcode"][i] == Opcode.LOAD and insns["mem_id"][i] in (MemId.INP, MemId.ACC_NARROW) \
                    and insns["x_size"][i] > 0:
                assert trace["start"][i] >= done, (name, i)
        before = float(trace["end"][np.flatnonzero(part == k - 1)].max())
        ahead += int(any(trace["unit"][i] == Unit.LOAD and trace["start"][i] < before for i in mine))
    assert ahead >= len(names) // 2


@pytest.mark.rtl
def test_the_chain_program_runs_bit_exact_on_the_rtl():
    """The chain's program replayed on Verilator (Pynq DRAM timing) from the DRAM image fsim started it
    from leaves the image fsim's run of it left, within 10% of the timing model's cycles."""
    from weft.sim.cosim import run_jobs
    from weft.tools.bench_accel import replay_jobs

    model = models.MODELS["digits_cnn"]()
    art = _compile(model, "tiny")
    name, shape = _shape(model)
    heads = {x["name"] for x in art.sections["accel"].meta["layers"] if "chain" in x}
    assert heads
    jobs, after, stats = replay_jobs(art, {name: rand(*shape, seed=3)}, heads, chains=True)
    results = run_jobs(PRESETS["tiny"], "verilator", [jobs[h] for h in sorted(heads)], timing="pynq")
    model_cycles = {}
    for x in stats["layers"]:
        if x.get("chain"):
            model_cycles[x["chain"]] = model_cycles.get(x["chain"], 0) + x["cycles"]
    for head, result in zip(sorted(heads), results, strict=True):
        assert result.error_code == 0, (head, result.report)
        np.testing.assert_array_equal(result.dram[:after[head].size], after[head], err_msg=head)
        assert abs(result.cycles - model_cycles[head]) <= 0.1 * result.cycles, (result.cycles, model_cycles[head])


@pytest.mark.parametrize(("change", "key"), [
    (lambda layers: layers[0]["chain"]["ends"].__setitem__(0, 10 ** 9), "chain.ends"),
    (lambda layers: layers[0]["chain"]["layers"].reverse(), "chain.layers"),
    (lambda layers: layers[1].pop("chain_head"), "chain_head"),
    (lambda layers: layers[0]["chain"].__setitem__("insn_count", 10 ** 12), "chain.insn_count"),
])
def test_a_malformed_chain_is_refused_naming_its_key(resnet, change, key):
    art, _ = resnet
    bad = with_manifest(art.to_bytes(), lambda manifest: change(manifest["sections"]["accel"]["meta"]["layers"]))
    with pytest.raises(ArtifactError, match=r"key 'sections\.accel\.meta\.layers\[\d+\]\." + key.replace(".", r"\.")):
        Artifact.from_bytes(bad)


def test_weft_run_runs_layer_by_layer_with_chains_false(resnet, tmp_path):
    """`--device-option chains=false` (a bool, not the text "false") runs each layer's own program: the
    layer-by-layer cycles, the same outputs."""
    import json

    from weft.cli import main

    art, feeds = resnet
    path = tmp_path / "m.weft"
    art.save(path)
    (name, x), = feeds.items()
    np.save(tmp_path / "x.npy", x)
    cycles = {}
    for option in ("chains=true", "chains=false"):
        stats = tmp_path / f"{option}.json"
        assert main(["run", str(path), "--device", "fsim", "--input", f"{name}={tmp_path / 'x.npy'}", "--no-progress",
                     "--device-option", option, "--stats", str(stats)]) == 0
        cycles[option] = json.loads(stats.read_text())["cycles"]
    alone = weft.InferenceSession(art, device="fsim", chains=False)
    alone.run(None, feeds)
    assert cycles["chains=false"] == alone.stats["cycles"] > cycles["chains=true"]


def test_a_chain_without_its_barriers_is_a_dram_race_on_fsim(monkeypatch):
    """Without the barriers, a layer's input loads are ordered after nothing of its producer's stores: the
    functional simulator refuses the program (a DRAM data race, whichever of the two it runs first) rather
    than computing with what DRAM held before."""
    from weft.compiler.backend import chain
    from weft.sim.fsim import RaceError

    monkeypatch.setattr(chain, "_reads_activation", lambda insn: False)
    art = _compile(models.MODELS["mlp"](), "tiny")
    assert any("chain" in x for x in art.sections["accel"].meta["layers"])
    name, shape = _shape(models.MODELS["mlp"]())
    with pytest.raises(RaceError, match=r"DRAM bytes .* no token orders that (store|load) before this"):
        weft.InferenceSession(art, device="fsim").run(None, {name: rand(*shape, seed=1)})
