"""Every register's slack after place and route, from the SDF nextpnr writes (its routed delays).

nextpnr's report names one path per clock: the worst. Whether a design is near closure or far from it, and
where, shows in how many register bits fail and on which paths; nextpnr's Fmax alone moves by several MHz
between placement seeds of one netlist. :func:`slack_summary` times every path of the routed design from
the SDF's cell and interconnect delays (the worst corner of each triple), counts the endpoints (register and
RAM inputs) that miss the clock and groups them by their worst path's first and last register.

Pure Python (no Amaranth): it reads a file nextpnr wrote.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

__all__ = ["parse_sdf", "signal_of", "slack_summary"]

SdfTree = list[Any]


def _tokens(text: str) -> Iterator[str]:
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in " \t\r\n":
            i += 1
        elif ch in "()":
            yield ch
            i += 1
        elif ch == '"':
            j = text.index('"', i + 1)
            yield text[i + 1:j]
            i = j + 1
        else:
            out = []
            while i < n and text[i] not in " \t\r\n()":
                if text[i] == "\\" and i + 1 < n:  # an escaped character of a name
                    i += 1
                out.append(text[i])
                i += 1
            yield "".join(out)


def parse_sdf(text: str) -> SdfTree:
    """An SDF file as nested lists of strings."""
    stack: list[SdfTree] = [[]]
    for token in _tokens(text):
        if token == "(":
            stack.append([])
        elif token == ")":
            if len(stack) < 2:
                raise ValueError("SDF: unbalanced ')'")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(token)
    if len(stack) != 1 or not stack[0] or stack[0][0][:1] != ["DELAYFILE"]:
        raise ValueError("SDF: not a DELAYFILE")
    return stack[0][0]


def _worst(values: list[Any]) -> float:
    """The largest figure of (min:typ:max) triples."""
    return max((float(part) for v in values if isinstance(v, list) and v for part in v[0].split(":") if part),
               default=0.0)


def _graph(tree: SdfTree) -> tuple[dict[str, list[tuple[str, float]]], dict[str, float], dict[str, float]]:
    """Timing arcs (node -> [(node, delay)]), launch points (clock-to-output) and setup checks, in ps."""
    arcs: dict[str, list[tuple[str, float]]] = defaultdict(list)
    launch: dict[str, float] = {}
    setup: dict[str, float] = {}
    for cell in tree[1:]:
        if not isinstance(cell, list) or cell[:1] != ["CELL"]:
            continue
        inst = next((item[1] if len(item) > 1 else "" for item in cell[1:] if item[:1] == ["INSTANCE"]), "")
        for item in cell[1:]:
            if item[:1] == ["DELAY"]:
                for kind in item[1:]:
                    for arc in kind[1:]:
                        if arc[:1] == ["IOPATH"]:
                            src, dst = arc[1], arc[2]
                            if isinstance(src, list) or src.startswith("CLK"):  # a clock's edge to an output
                                node = f"{inst}/{dst}"
                                launch[node] = max(launch.get(node, 0.0), _worst(arc[3:]))
                            else:
                                arcs[f"{inst}/{src}"].append((f"{inst}/{dst}", _worst(arc[3:])))
                        elif arc[:1] == ["INTERCONNECT"]:
                            arcs[arc[1]].append((arc[2], _worst(arc[3:])))
            elif item[:1] == ["TIMINGCHECK"]:
                for check in item[1:]:
                    if check[:1] in (["SETUP"], ["SETUPHOLD"]):
                        port = check[1][-1] if isinstance(check[1], list) else check[1]
                        node = f"{inst}/{port}"
                        setup[node] = max(setup.get(node, 0.0), _worst(check[3:4]))
    return arcs, launch, setup


# nextpnr names a net or a cell after the signal it carries plus the cells Yosys mapped it through.
_MAPPED = re.compile(r"_(?:TRELLIS|LUT4|CCU2C|MULT18X18D|ALU54B|DP16KD|DPR16X4|PFUMX|L6MUX)|"
                     r"\$(?:CCU2|RAMW|DPRAM|nextpnr)|\[")


def signal_of(name: str) -> str:
    """The signal a nextpnr net or cell name starts with (what precedes the mapped cells' suffixes)."""
    return _MAPPED.split(name)[0]


def _signal(node: str) -> str:
    cell = node.rsplit("/", 1)[0]
    return re.sub(r"\$\d+", "", signal_of(cell)) or cell


def slack_summary(text: str, period_ps: float, *, groups: int = 10) -> dict[str, Any]:
    """Slack of every endpoint of a routed design at a clock period: how many fail, the worst slack, and the
    failing endpoints grouped by their worst path's first and last signal (the worst groups first)."""
    arcs, launch, setup = _graph(parse_sdf(text))
    indegree: dict[str, int] = defaultdict(int)
    for outs in arcs.values():
        for node, _ in outs:
            indegree[node] += 1
    nodes = set(arcs) | set(indegree) | set(launch)
    order = [node for node in nodes if not indegree[node]]
    arrival = {node: launch[node] for node in order if node in launch}
    came_from: dict[str, str] = {}
    for node in order:  # grows as nodes lose their last unvisited input (Kahn's order)
        for succ, delay in arcs.get(node, ()):
            if node in arrival and arrival[node] + delay > arrival.get(succ, -1.0):
                arrival[succ], came_from[succ] = arrival[node] + delay, node
            indegree[succ] -= 1
            if not indegree[succ]:
                order.append(succ)
                if succ in launch and succ not in arrival:
                    arrival[succ] = launch[succ]
    slacks = sorted((period_ps - time - arrival[node], node) for node, time in setup.items() if node in arrival)
    failing = [(slack, node) for slack, node in slacks if slack < 0]
    grouped: dict[tuple[str, str], list[float]] = defaultdict(list)
    worst_node: dict[tuple[str, str], str] = {}
    for slack, node in failing:  # (worst first)
        key = _signal(_first(node, came_from)), _signal(node)
        grouped[key].append(slack)
        worst_node.setdefault(key, node)
    worst_groups = sorted(grouped.items(), key=lambda kv: min(kv[1]))[:groups]
    return {
        "period_ns": period_ps / 1000, "endpoints": len(slacks), "failing": len(failing),
        "worst_slack_ns": round(slacks[0][0] / 1000, 3) if slacks else None,
        "unordered_nodes": len(nodes) - len(order),  # on combinational loops: not timed
        "groups": [{"from": a, "to": b, "failing": len(v), "worst_slack_ns": round(min(v) / 1000, 3),
                    "path": _hops(worst_node[a, b], came_from, arrival)}
                   for (a, b), v in worst_groups],
    }


def _first(node: str, came_from: dict[str, str]) -> str:
    while node in came_from:
        node = came_from[node]
    return node


def _hops(node: str, came_from: dict[str, str], arrival: dict[str, float]) -> list[dict[str, Any]]:
    """A path's signals from its start to `node`, each with the time (ns) the path leaves it: where the
    path's delay goes (a hop's share is the next one's time less its own)."""
    chain = [node]
    while chain[-1] in came_from:
        chain.append(came_from[chain[-1]])
    hops: list[dict[str, Any]] = []
    for n in reversed(chain):
        signal = _signal(n)
        if hops and hops[-1]["signal"] == signal:
            hops[-1]["ns"] = round(arrival[n] / 1000, 3)
        else:
            hops.append({"signal": signal, "ns": round(arrival[n] / 1000, 3)})
    return hops
