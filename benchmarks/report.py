"""Repeats → medians and ranges, goals scored at the median, and the tables compare.py prints and writes.

`results` maps a way to one Outcome per repeat (round): {"summary": the figures of benchmarks.summaries,
or None, "measured": bool, "attempts": [{"reasons": [...], "window": {...}}, ...]}. A way counts only if
every one of its repeats was measured; a goal only if every way it needs counts. Figures that compare
two ways (× (a), podium − (a)) are taken within each round first, then aggregated.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.summaries import LABELS
from benchmarks.workload import fmt, markdown_table

Results = dict[str, list[dict[str, Any]]]
ORDER = ("a", "f", "d", "d0", "d1", "b", "c", "a2")


def way_summaries(results: Results, key: str) -> list[dict[str, Any]] | None:
    """The summaries of every repeat of a way, or None if the way did not run or a repeat was not measured."""
    outcomes = results.get(key)
    if not outcomes or not all(o["measured"] for o in outcomes):
        return None
    return [o["summary"] for o in outcomes]


def not_measured_reason(results: Results, key: str) -> str | None:
    """Why a way is "not measured" (each failed repeat's attempts), or None if it counts."""
    outcomes = results.get(key) or []
    lines = []
    for r, o in enumerate(outcomes, 1):
        if not o["measured"]:
            tried = "; then ".join(", ".join(a["reasons"]) for a in o["attempts"])
            lines.append(f"repeat {r}: {tried}")
    return " / ".join(lines) if lines else None


def base(results: Results, r: int, field: str) -> float | None:
    """(a)'s figure in round r, averaged with (a')'s when that ran and was measured (the load drifts)."""
    vals = []
    for key in ("a", "a2"):
        outcomes = results.get(key) or []
        if r < len(outcomes) and outcomes[r]["measured"] and outcomes[r]["summary"].get(field) is not None:
            vals.append(outcomes[r]["summary"][field])
    return sum(vals) / len(vals) if vals else None


def series(results: Results, key: str, fn: Callable[[dict[str, Any], int], float | None]) -> list[float] | None:
    """fn(summary, round) for each repeat of a way; None unless every repeat gives a number."""
    summaries = way_summaries(results, key)
    if summaries is None:
        return None
    values = [fn(s, r) for r, s in enumerate(summaries)]
    return None if any(v is None for v in values) else [float(v) for v in values if v is not None]


def spread(values: list[float] | None, digits: int = 1, suffix: str = "") -> str:
    """"median (min–max)" of the repeats; the bare value for one repeat; "–" for none."""
    if not values:
        return "–"
    med = fmt(statistics.median(values), digits, suffix)
    if len(values) == 1:
        return med
    return f"{med} ({fmt(min(values), digits)}–{fmt(max(values), digits, suffix)})"


def _field(name: str) -> Callable[[dict[str, Any], int], float | None]:
    return lambda s, r: s.get(name)


# ---------------------------------------------------------------- tables

COLUMNS: list[tuple[str, Callable[[Results, str], list[float] | None], int, str]] = [
    ("process wall s", lambda res, k: series(res, k, _field("process_wall")), 1, ""),
    ("training wall s", lambda res, k: series(res, k, _field("train_wall")), 1, ""),
    ("× (a)", lambda res, k: series(res, k, lambda s, r: _ratio(s["train_wall"], base(res, r, "train_wall"))), 2,
     "×"),
    ("loop done s", lambda res, k: series(res, k, _field("loop_wall")), 1, ""),
    ("validation fn p50 s", lambda res, k: series(res, k, _field("val_p50")), 2, ""),
    ("ckpt→metrics p50 s", lambda res, k: series(res, k, _field("lat_p50")), 2, ""),
    ("ckpt→metrics p95 s", lambda res, k: series(res, k, _field("lat_p95")), 2, ""),
    ("beyond queue + validation p95 s", lambda res, k: series(res, k, _field("excess_p95")), 2, ""),
    ("callback delay p50 s", lambda res, k: series(res, k, _field("announce_p50")), 2, ""),
    ("max queue wait s", lambda res, k: series(res, k, _field("wait_max")), 1, ""),
    ("last ckpt → best chosen s", lambda res, k: series(res, k, _field("best_chosen")), 1, ""),
    ("last ckpt → promotion done s", lambda res, k: series(res, k, _field("promoted")), 1, ""),
]


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def table(results: Results) -> str:
    """The main comparison table: median (range) of every figure, or why a way is not measured."""
    rows = []
    for key in ORDER:
        if key not in results:
            continue
        if way_summaries(results, key) is None:
            rows.append([LABELS[key], "**not measured** (see below)"] + ["–"] * (len(COLUMNS) - 1))
            continue
        rows.append([LABELS[key]] + [spread(get(results, key), digits, suffix) for _, get, digits, suffix in COLUMNS])
    return markdown_table(["way"] + [c[0] for c in COLUMNS], rows)


def startup_table(results: Results) -> str:
    """Where the time outside training goes: (a) against podium warm (d0) and cold (d1), phase by phase."""
    keys = [k for k in ("a", "d0", "d1") if way_summaries(results, k) is not None]
    rows = []
    for name, field in (("start-up: process start → training starts", "startup"),
                        ("training (TorchTrainer construction + fit)", "train_wall"),
                        ("after training → process exit", "teardown"), ("**process wall**", "process_wall")):
        rows.append([name] + [spread(series(results, k, _field(field))) for k in keys])
    detail = [("CLI start → flow start", "cli_to_flow"), ("flow start → training starts", "flow_to_train"),
              ("of which connect-ray (waits for Ray and the validation warm-up)", "connect_ray"),
              ("promotion", "promote"), ("reports", "reports"), ("flow end → process exit", "flow_end_to_exit")]
    for name, field in detail:
        rows.append([f"podium: {name}"] + [
            "" if k == "a" else spread(series(results, k, lambda s, r, f=field: s["phases"].get(f)), 2)
            for k in keys])
    cli = sorted({p for k in keys if k != "a" for s in way_summaries(results, k) or [] for p in s.get("cli_phases", {})})
    for phase in cli:
        figures = {k: series(results, k, lambda s, r, p=phase: s.get("cli_phases", {}).get(p)) for k in keys if k != "a"}
        if all(not v or statistics.median(v) < 0.1 for v in figures.values()):
            continue  # a phase that took no time in any podium way (the demo data when it is not needed)
        rows.append([f"podium CLI: {phase}"] + ["" if k == "a" else spread(figures[k], 2) for k in keys])
    return markdown_table(["phase"] + [LABELS[k] + " s" for k in keys], rows)


def conditions_table(results: Results) -> str:
    """The repeats that did not go through at their first attempt (attempts, what the machine did meanwhile, the
    pinning), or one sentence when every repeat of every way did: the table stays as short as the run was clean."""
    repeats = [(key, r, o) for key in ORDER for r, o in enumerate(results.get(key) or [], 1)]
    retried = [(key, r, o) for key, r, o in repeats if not o["measured"] or len(o["attempts"]) > 1]
    if not retried:
        return f"Every repeat of every way ({len(repeats)}) was measured at its first attempt."
    rows = []
    for key, r, o in retried:
        w = (o["attempts"][-1] if o["attempts"] else {}).get("window") or {}
        rows.append([LABELS[key], str(r), str(len(o["attempts"])), "measured" if o["measured"] else "**not measured**",
                     fmt(w.get("foreign_cores"), 2),
                     f"{fmt((w.get('load_before') or [None])[0], 2)} → {fmt((w.get('load_after') or [None])[0], 2)}",
                     ", ".join(f"pid {p['pid']}" for p in w.get("pins") or []) or "–"])
    return (f"The other {len(repeats) - len(retried)} repeat(s) were measured at their first attempt.\n\n"
            + markdown_table(["way", "repeat", "attempts", "outcome", "other processes, cores (last attempt)",
                              "1-min load before → after", "train worker pinned"], rows))


# ---------------------------------------------------------------- goals

@dataclass
class Goal:
    """A stated goal: a per-round figure of some ways, met when its median is at most `limit`."""

    text: str
    ways: tuple[str, ...]
    figure: Callable[[Results, str], list[float] | None]
    limit: float
    unit: str
    digits: int = 2


def _promotion_beyond_validation(s: dict[str, Any], r: int) -> float | None:
    if s.get("promoted") is None or s.get("val_p50") is None:
        return None
    return s["promoted"] - (s.get("last_wait") or 0.0) - s["val_p50"]


OWN_CPU_BEFORE = 9.7  # podium's own CPU-s per (d) run over the whole machine when the goal was set (one round)
OWN_CPU_GOAL = OWN_CPU_BEFORE / 2

GOALS = [
    # against the machine's floor measured in the same round: training beside the same validation in a plain
    # process on the other core (f); a goal against (a) alone measured the machine, not podium
    Goal("podium's training wall, costly validation (d) ≤ 1.03× the floor (f), in the same round", ("a", "f", "d"),
         lambda res, k: _d_against_f(res), 1.03, "×"),
    Goal("last ckpt → promotion done ≤ one validation + 3 s (d; beyond the last checkpoint's queue wait)", ("d",),
         lambda res, k: series(res, "d", _promotion_beyond_validation), 3.0, " s beyond the validation", 1),
    Goal("ckpt → metrics p95 ≤ validation + 1 s within the concurrency (d; beyond queue wait + validation)", ("d",),
         lambda res, k: series(res, "d", _field("excess_p95")), 1.0, " s", 2),
    # what podium itself burns over the whole machine (/proc/stat): every process of (d) (the podium process
    # with its SQLite MLflow store, the Prefect server, Ray's processes and every actor and task podium adds)
    # less the validation function's own time, against the same for the floor (f) in the same round; half of
    # what it was when the goal was set (OWN_CPU_BEFORE)
    Goal(f"podium's own CPU-s per run over the whole machine (d − (f), validation fn taken out of both) ≤ "
         f"{OWN_CPU_GOAL:g}, half of {OWN_CPU_BEFORE:g}", ("f", "d"),
         lambda res, k: series(res, "d", lambda s, r: _own_machine_cpu_s(res, s, r, "f")), OWN_CPU_GOAL, " CPU-s", 1),
    Goal("process wall, warm, cheap validation (d0) ≤ bare TorchTrainer (a) + 3 s", ("a", "d0"),
         lambda res, k: series(res, "d0", lambda s, r: _minus(s["process_wall"], base(res, r, "process_wall"))), 3.0,
         " s over (a)", 1),
    Goal("process wall, first run in a fresh home (d1) ≤ bare TorchTrainer (a) + 8 s", ("a", "d1"),
         lambda res, k: series(res, "d1", lambda s, r: _minus(s["process_wall"], base(res, r, "process_wall"))), 8.0,
         " s over (a)", 1),
]


def _d_against_f(results: Results) -> list[float] | None:
    """(d)'s training wall over (f)'s, round by round."""
    floor = way_summaries(results, "f")
    return series(results, "d", lambda s, r: _ratio(s["train_wall"], floor[r]["train_wall"] if floor else None))


def _beyond_validation(summary: dict[str, Any]) -> float | None:
    """The whole machine's CPU seconds for one way, less its validation function's own CPU seconds (the
    thread it computes on, summed over its calls: benchmarks.workload.validation_cpu_s)."""
    machine, val = summary.get("machine_cpu_s"), summary.get("val_total_s")
    return machine - val if machine is not None and val is not None else None


def _own_machine_cpu_s(results: Results, summary: dict[str, Any], r: int, against: str) -> float | None:
    """What a podium way costs the whole machine beyond `against` in round r (the same training; the
    validation function's own time taken out of both)."""
    other = way_summaries(results, against)
    if other is None or r >= len(other):
        return None
    return _minus(_beyond_validation(summary), _beyond_validation(other[r]))


def _own_cpu_s(summary: dict[str, Any], _round: int) -> float | None:
    """The podium process's CPU seconds and its Prefect server's during the run, or None if either is unknown."""
    driver, server = summary.get("driver_cpu_s"), summary.get("server_cpu_s")
    return driver + server if driver is not None and server is not None else None


def cpu_table(results: Results) -> str:
    """Where the CPU goes, per way: the whole machine, the validation function's share, and for podium's ways
    its own process and Prefect server, and what it adds to (f) (costly validation) or (a) (cheap)."""
    rows = []
    for key in ORDER:
        if way_summaries(results, key) is None:
            continue
        against = "f" if key == "d" else "a" if key in ("d0", "d1") else None
        rows.append([LABELS[key], spread(series(results, key, _field("machine_cpu_s"))),
                     spread(series(results, key, _field("val_total_s"))),
                     spread(series(results, key, lambda s, r: _beyond_validation(s))),
                     spread(series(results, key, _own_cpu_s)),
                     (spread(series(results, key, lambda s, r: _own_machine_cpu_s(results, s, r, against)))
                      + f" over {against}") if against and way_summaries(results, against) else "–"])
    return markdown_table(["way", "whole machine CPU-s", "validation fn CPU-s", "machine − validation",
                           "podium process + Prefect server CPU-s", "podium's own (machine − validation − same of)"],
                          rows)


def _minus(x: float | None, y: float | None) -> float | None:
    return x - y if x is not None and y is not None else None


def score_goals(results: Results) -> list[tuple[str, str, str]]:
    """(goal, measured, verdict) for each goal whose ways ran; verdict: met, missed or not measured."""
    out = []
    for g in GOALS:
        if not all(w in results for w in g.ways):
            continue
        missing = [w for w in g.ways if way_summaries(results, w) is None]
        values = None if missing else g.figure(results, g.ways[-1])
        if not values:
            why = f"{', '.join(LABELS[w] for w in missing)} not measured" if missing else "no figure"
            out.append((g.text, why, "not measured"))
            continue
        med = statistics.median(values)
        text = (spread(values, g.digits, g.unit) if g.unit == "×" else spread(values, g.digits) + g.unit)
        text += f", median of {len(values)}"
        out.append((g.text, text, "met" if med <= g.limit else "missed"))
    return out


def all_good(results: Results) -> bool:
    """--check: every way measured and every goal met."""
    ways_ok = all(way_summaries(results, k) is not None for k in results)
    return ways_ok and all(v == "met" for _, _, v in score_goals(results))


def floor_line(results: Results) -> str | None:
    """What the machine itself costs training when the other core validates ((f) against (a)), and what (d)
    costs beyond that ((d) against (f)), each within its round; None unless both (f) and (d) count."""
    f = series(results, "f", lambda s, r: _ratio(s["train_wall"], base(results, r, "train_wall")))
    d = _d_against_f(results)
    if not f or not d:
        return None
    return (f"The floor: with the costly validation looping on the other core and nothing else, training took "
            f"{spread(f, 2, '×')} (a) ((f)); podium's (d) took {spread(d, 2, '×')} (f) in the same rounds.")


def goals_table(results: Results) -> str:
    """The goals as a markdown table."""
    rows = [[g, m, "met" if v == "met" else f"**{v}**"] for g, m, v in score_goals(results)]
    return markdown_table(["goal", "measured: median (range)", ""], rows)


def print_summary(results: Results, out: Callable[[str], None] = print) -> None:
    """The table, the reasons and the goals, for the terminal."""
    out(table(results))
    out(conditions_table(results))  # each attempt is also in the log as it ends
    out(cpu_table(results))
    for key in ORDER:
        why = not_measured_reason(results, key)
        if key in results and why:
            out(f"  {LABELS[key]}: not measured: {why}")
    for g, m, v in score_goals(results):
        out(f"  {g}: {m} [{v}]")
    floor = floor_line(results)
    if floor:
        out(f"  {floor}")
