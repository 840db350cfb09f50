"""The robustness table of ``fedent reproduce --profile robust``: attack x defence x final accuracy, one compact
table instead of one table per setting (docs/security.md publishes it).

Why a module of its own: the profile's settings are (attack, defence) pairs whose per-setting tables would be two
lines each; this folds them into a grid with the clean run in the first line and the cost of each defence (its
clean accuracy and seconds per round) beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SECTION = "robustness"


def _cell(t: Mapping[str, Any], row: str, key: str = "final_acc", scale: float = 100.0, fmt: str = ".1f") -> str:
    """One number of a row, or "diverged" (the attack drove the model non-finite: the engine stopped the run),
    or "—" (not run)."""
    for r in t.get("rows", []):
        if r["row"] != row:
            continue
        ms = r.get(key)
        if ms is not None:
            return format(scale * float(ms["mean"]), fmt)
        if r.get("diverged"):
            return "diverged"
    return "—"


def attack_defence(setting: Mapping[str, Any]) -> tuple[str, str]:
    """(attack, defence) of a setting, from its ``--set`` overrides (none / mean when absent); a ``clip_norm``
    is the defence "clip" before the mean, "<rule>+clip" before another rule."""
    overrides = dict(o.split("=", 1) for o in setting["overrides"] if "=" in o)
    rule = overrides.get("robust.aggregator", "mean")
    if overrides.get("robust.clip_norm", "null") not in ("null", "None", ""):
        rule = "clip" if rule == "mean" else f"{rule}+clip"
    return overrides.get("adversary.attack", "none"), rule


def robustness_lines(data: Mapping[str, Any], sec: Mapping[str, Any]) -> list[str]:
    """The grid: one line per attack ("none" first), a column per (defence, algorithm); then each defence's
    seconds per round without attack."""
    keyed = {attack_defence(data["settings"][k]): k for k in sec["settings"]}
    attacks = list(dict.fromkeys(a for a, _ in keyed))
    defences = list(dict.fromkeys(d for _, d in keyed))
    rows = sec["rows"]  # the summary's {setting: rows}; every setting of the grid has the same rows
    algos = list(next(iter(rows.values()))) if isinstance(rows, dict) else list(rows)

    def table(a: str, d: str) -> Mapping[str, Any]:
        k = keyed.get((a, d))
        return data["tables"].get(f"{sec['key']}/{k}", {}) if k else {}

    head = " | ".join(f"{d}: {a}" for d in defences for a in algos)
    out = ["", f"Final test accuracy (%), seed(s) {', '.join(map(str, data.get('seeds', [])))}; columns: defence: "
           "algorithm; the first line is the clean run.", "",
           f"| attack | {head} |", "| --- |" + " ---: |" * (len(defences) * len(algos))]
    for a in attacks:
        out.append(f"| {a} | {' | '.join(_cell(table(a, d), alg) for d in defences for alg in algos)} |")
    walls = []
    for d in defences:
        k = keyed.get(("none", d))
        rounds = int(data["settings"][k]["train"]["rounds"]) if k else 0
        per = " / ".join(_cell(table("none", d), alg, "wall_s", 1.0 / rounds if rounds else 0.0, ".2f")
                         for alg in algos)
        walls.append(f"{d} {per}")
    out += ["", f"Wall seconds per round without attack ({' / '.join(algos)}; the whole run with its evaluations, on "
            f"the machine above, runs side by side): {'; '.join(walls)}."]
    return out
