"""Mutation testing of the core (``make mutation``; not part of ``make test``): mutmut 3.8, one module at a time,
each against its own targeted tests, on a seeded sample of its mutants; resumable; scores -> tests/MUTATION.md.

Per module, a work directory ``.mutation/<slug>/`` (git-ignored) holds a pyproject.toml (the repo's pytest
settings plus a ``[tool.mutmut]`` section naming the one file to mutate and its tests) and links to the
packages; mutmut copies them into ``.mutation/<slug>/mutants/`` and keeps every verdict there. The driver

1. lets mutmut generate the module's mutants and map tests to functions (``mutmut run`` with a pattern that
   names no mutant: the targeted tests run once, clean);
2. draws a sample of ``--sample`` mutant names with ``random.Random(--seed)`` (all of them when fewer);
3. runs the sampled mutants that have no verdict yet (``mutmut run NAME...``), in batches, so an interrupted
   run resumes where it stopped;
4. writes the counts (killed, survived, timeout, no tests, equivalent) to ``.mutation/<slug>/summary.json``
   and the table in tests/MUTATION.md. Survivors judged equivalent are listed, with the reason, in
   ``EQUIVALENT`` below (by mutant name) and counted apart.

Usage: python tools/mutation.py [--module SLUG ...] [--sample N] [--seed S] [--budget SECONDS] [--report-only]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"
REPORT = ROOT / "tests" / "MUTATION.md"
PACKAGES = ("fedent", "fedentrpc", "server", "client", "estimator")

# slug: (file to mutate, its targeted tests)
MODULES: dict[str, tuple[str, list[str]]] = {
    "lr": ("fedent/meanfield/lr.py", ["tests/fedent/meanfield/test_lr.py",
                                      "tests/fedent/meanfield/test_scalar_fixed_point.py"]),
    "scalar_fixed_point": ("fedent/meanfield/scalar_fixed_point.py",
                           ["tests/fedent/meanfield/test_scalar_fixed_point.py"]),
    "fixed_point": ("fedent/meanfield/fixed_point.py", ["tests/fedent/meanfield/test_fixed_point.py"]),
    "strategy_fedent": ("fedent/strategies/fedent.py", ["tests/fedent/strategies/test_fedent.py"]),
    "validation": ("fedent/strategies/validation.py", ["tests/fedent/strategies/test_validation.py"]),
    "acceptance": ("fedent/rounds/acceptance.py", ["tests/fedent/rounds/test_acceptance.py",
                                                   "tests/fedent/rounds/test_engine.py",
                                                   "tests/fedent/strategies/test_validation.py"]),
    "codec": ("fedentrpc/codec.py", ["tests/fedentrpc/test_codec.py", "tests/fedentrpc/test_mappers.py"]),
    "engine": ("fedent/rounds/engine.py", ["tests/fedent/rounds/test_engine.py"]),
}

# Survivors read and judged equivalent (no test can tell them from the original), with the reason.
EQUIVALENT: dict[str, str] = {
    "fedent.meanfield.scalar_fixed_point.x__bracket__mutmut_20":
        "`f0 <= 0` for `f0 < 0` choosing the direction: f0 == 0 has already returned, so the tests agree",
    "fedent.meanfield.scalar_fixed_point.x__bracket__mutmut_37":
        "`f0 <= 0` for `f0 < 0` ordering the returned bracket: f0 == 0 has already returned",
    "fedent.meanfield.fixed_point.x_solve_fixed_point__mutmut_131":
        "drops `strict=True` from zip(part, th_t, grads): the three have the round's length by construction",
    "fedent.meanfield.scalar_fixed_point.x__illinois__mutmut_12":
        "`side = None` for `side = 0`: side is only compared with -1 and 1, which neither equals",
    "fedent.strategies.fedent.xǁFedEntǁprepare__mutmut_39":
        "`else 1.0` for `else 0.0` as the base rate when set_run_plan gave none: that happens only with phi2_rate "
        "star (\"used\" raises just below), where solve_fixed_point never reads base_lr",
    "fedent.strategies.fedent.xǁFedEntǁaggregate_sum__mutmut_11":
        "a model norm of 1.0 for 0.0 in the secure record: the norms feed only phi2_actual and the entropy, which "
        "aggregate_sum then sets to None",
    "fedentrpc.codec.x__inflate__mutmut_25":
        "`torch.empty(0, dtype=None)` for a uint8 one when nothing inflated: every tensor cut from an empty payload "
        "is empty and viewed as its own dtype, so the buffer's dtype is never seen",
    "fedentrpc.codec.x__tensor_u8__mutmut_15":
        "`t.to(None)` for `t.to(torch.uint8)` on a bool tensor: to(None) keeps it bool, and the next line's "
        "view(torch.uint8) gives the same bytes",
    "fedent.strategies.fedent.xǁFedEntǁround_payload__mutmut_96":
        "drops `strict=True` from zip(cids, perm): perm is a permutation of range(len(probes)), cids has that length",
    "fedent.rounds.engine.xǁRoundEngineǁattempt__mutmut_2":
        "`self.secure_sum = \"\"` for `= None` at the start of a try: the sum is read only in a released round "
        "under secure aggregation, where finish() has replaced it; a skipped round never reads it",
    "fedent.rounds.engine.xǁRoundEngineǁrun_round__mutmut_16":
        "`dp_info = None` for `= {}`: it is read only as `dp_info or carried(...)`, where None and {} are both falsy",
    "fedent.meanfield.lr.x_q_value__mutmut_3":
        "np.asarray(eta, dtype=None): q is c + e(eb - 2a) with b converted to float64, so an integer eta gives the "
        "same float values (all callers pass floats)",
    "fedent.meanfield.lr.x_q_value__mutmut_10":
        "np.asarray(c) without dtype: c is added to a float64 array, the sum is the same",
    "fedent.meanfield.lr.x_q_value__mutmut_15":
        "np.asarray(b, dtype=None): b is multiplied by e and added to float64 terms, the values are the same",
    "fedent.meanfield.lr.x_implicit_rhs__mutmut_3":
        "np.asarray(eta/a/b, dtype=None) in implicit_rhs: k and log(...) are float64, q_value converts, and r == 0.0 "
        "compares the same for ints, so the values are the same",
    "fedent.meanfield.lr.x_implicit_rhs__mutmut_10":
        "np.asarray(theta, dtype=None) in k: theta is multiplied by the float beta, the same value",
    "fedent.meanfield.lr.x_upper_bound__mutmut_7":
        "np.asarray(c, dtype=None) in upper_bound: c only goes through np.sqrt, which gives float64 either way",
    "fedent.meanfield.lr.x_solve_eta__mutmut_80":
        "a neutral a = 1.0 instead of 0.0 for guarded clients: their bound is set to 0, so the exact solve skips them "
        "(bound > 0 is false) and the paper form is clipped to 0, and guarded rates are forced to 0 anyway",
    "fedent.meanfield.lr.x_solve_eta__mutmut_161":
        "`guarded & ~isfinite(eta)` for `|`: guarded clients already have eta 0 (bound 0) and both variants return "
        "finite rates for the others (paper: a non-finite value is flagged guarded), so both masks zero nothing new",
    "fedent.meanfield.lr.x_paper_closed_form__mutmut_35":
        "np.where(None, 0.0, val) returns val: where 1 + log p(0) == 0 the printed denominator is +inf "
        "(phi2' > 0 divided by 0), so val = max(0, a/inf) = 0 for every finite a (guarded inputs are neutralised)",
    "fedent.meanfield.scalar_fixed_point.x_solve_online__mutmut_40":
        "np.asarray(eta_prev, dtype=None): the rates are only checked (finite, >= 0) and then multiplied by float "
        "gamma or converted by decayed_rates, so an integer array gives the same values",
    "fedent.meanfield.scalar_fixed_point.x_solve_online__mutmut_42":
        "np.asarray(eta_prev) without dtype: as x_solve_online__mutmut_40",
    "fedent.meanfield.scalar_fixed_point.x_solve_online__mutmut_63":
        "`... and False` in `phi = float(c) if isfinite(c) and c > 0 else 0.0`: that line runs only when c is not "
        "finite or c <= 0, so its condition is always false and phi is 0.0 either way",
    "fedent.meanfield.scalar_fixed_point.x_solve_online__mutmut_65":
        "float(None) in the arm of `phi = float(c) if isfinite(c) and c > 0 else 0.0` that never runs (see _63)",
    "fedent.meanfield.scalar_fixed_point.x_solve_online__mutmut_68":
        "`c >= 0` for `c > 0` in the same dead condition (see _63): at c = 0 it gives float(0) = 0.0, the same value "
        "(c = ||w||^2 is never -0.0)",
    "fedent.meanfield.fixed_point.x_solve_fixed_point__mutmut_35":
        "np.asarray(thetas, dtype=None): _validate has checked them as float64; th is only divided by a float sum "
        "and multiplied by floats, so an integer array gives the same values",
    "fedent.meanfield.fixed_point.x_solve_fixed_point__mutmut_50":
        "np.asarray(sorted client positions, dtype=None): ints give int64 as with dtype=np.int64, and an empty round "
        "(float64 then) is rejected by its size before use",
    "fedent.meanfield.fixed_point.x_solve_fixed_point__mutmut_89":
        "`ok1 = ok2 = None` initially: max_sweeps >= 1 is validated, so the first sweep sets both before any use",
    "fedent.meanfield.fixed_point.x_solve_fixed_point__mutmut_90":
        "`ok1 = ok2 = True` initially: max_sweeps >= 1 is validated, so the first sweep sets both before any use",
    "fedent.strategies.validation.x__check_model_shaped__mutmut_6":
        "zip(..., strict=None) for strict=True: the lengths were compared just before, so zip never sees unequal ones",
    "fedent.strategies.validation.x__check_model_shaped__mutmut_9":
        "zip without strict=True: the lengths were compared just before, so zip never sees unequal ones",
    "fedent.strategies.validation.x__check_model_shaped__mutmut_10":
        "zip(..., strict=False) for strict=True: the lengths were compared just before, so zip never sees unequal ones",
    "fedent.strategies.validation.x__check_scalars__mutmut_20":
        "`(spec is not None) or True`: both callers (check_probe, check_update) always pass the strategy's spec",
}

NO_MATCH = "zz_no_such_mutant_*"  # a pattern naming no mutant: generation and test mapping only


def _pyproject(target: str, tests: list[str]) -> str:
    base = (ROOT / "pyproject.toml").read_text()
    # the repo's own settings, then mutmut's: mutate one file of the copied packages, run only its tests
    return base + (
        "\n[tool.mutmut]\n"
        f"source_paths = {json.dumps(['fedent', 'fedentrpc'])}\n"
        f"only_mutate = {json.dumps([target])}\n"
        f"also_copy = {json.dumps(['server', 'client', 'estimator', 'fedentrpc', 'fedent'])}\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "mutmut_compat", "-x", "-q"]\n'
        "use_git_change_detection = false\n"
        # torch (and grpc) are not fork-safe: a worker forked from the process that ran the tests hangs
        'process_isolation = "forkserver"\n'
        # a mutant's wall limit is (its tests' measured time + constant) * multiplier (mutmut 3.8): with the
        # default constant of 1 s, a worker on a loaded machine (pytest's start alone takes seconds) was stopped
        # as a "timeout" before its tests ran, and counted as detected; 20 s covers that and still ends a loop
        'timeout_constant = 20.0\n'
        'timeout_multiplier = 5.0\n'
        # The fork server only collects (imports torch, conftest and the test modules, runs nothing), so each
        # worker forked from it starts its tests at once: with no warm-up every mutant paid pytest's start and the
        # imports, ~20 s a mutant under load
        'forkserver_warmup = "collect"\n'
    )


def _workdir(slug: str) -> Path:
    target, tests = MODULES[slug]
    d = WORK / slug
    d.mkdir(parents=True, exist_ok=True)
    (d / "pyproject.toml").write_text(_pyproject(target, tests))
    for name in (*PACKAGES, "tests"):
        link = d / name
        if not link.exists():
            link.symlink_to(ROOT / name)
    return d


def _mutmut(d: Path, *args: str, timeout: float) -> int:
    mutmut = Path(sys.executable).with_name("mutmut")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools"),  # mutmut_compat, the pytest plugin
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    # not niced: on a shared, loaded machine a niced run starves and its mutants time out
    cmd = [str(mutmut), "run", "--max-children", "2", *args]
    # its own process group, so that the budget's end stops the fork server and its workers too
    proc = subprocess.Popen(cmd, cwd=d, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return -1


def _verdicts(d: Path, target: str) -> dict[str, int | None]:
    meta = d / "mutants" / (target + ".meta")
    if not meta.exists():
        return {}
    data = json.loads(meta.read_text())
    return dict(data.get("exit_code_by_key", {}))


# mutmut's exit codes (mutmut/stats.py, status_by_exit_code); anything else is "suspicious"
_STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 36: "timeout",
           -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", -11: "segfault", -9: "segfault",
           37: "caught by type check"}


def _status(code: int | None) -> str:
    return "not checked" if code is None else _STATUS.get(code, "suspicious")


def measure(slug: str, sample: int, seed: int, deadline: float) -> dict[str, object]:
    target, tests = MODULES[slug]
    d = _workdir(slug)
    if not _verdicts(d, target):
        _mutmut(d, NO_MATCH, timeout=max(60.0, deadline - time.time()))
    names = sorted(_verdicts(d, target))
    chosen = sorted(random.Random(seed).sample(names, min(sample, len(names))))
    # Every mutmut run first re-runs the covering tests clean (and one forced failure), so the sampled mutants go
    # in one run: mutmut saves each verdict as it comes, and a run cut short by the budget resumes where it
    # stopped. A mutant that crashed its worker has no verdict; the loop gives it one more run.
    for _ in range(3):
        # no verdict yet, or "no tests" from a run before new tests were mapped (rerunning one is instant)
        todo = [n for n in chosen if _verdicts(d, target).get(n) in (None, 33)]
        if not todo or time.time() >= deadline:
            break
        _mutmut(d, *todo, timeout=max(30.0, deadline - time.time()))
    got = _verdicts(d, target)
    counts: dict[str, int] = {}
    survivors, equivalent = [], []
    for n in chosen:
        st = _status(got.get(n))
        if st == "survived" and n in EQUIVALENT:
            st = "equivalent"
            equivalent.append(n)
        elif st == "survived":
            survivors.append(n)
        counts[st] = counts.get(st, 0) + 1
    summary = {"module": target, "tests": tests, "mutants": len(names), "sample": len(chosen), "seed": seed,
               "counts": counts, "survivors": survivors, "equivalent": equivalent}
    (d / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def report() -> None:
    rows = []
    for slug in MODULES:
        p = WORK / slug / "summary.json"
        if p.exists():
            rows.append(json.loads(p.read_text()))
    lines = ["| module | mutants | sampled | checked | killed | survived | equivalent | timeout | no tests | "
             "score (killed / checked non-equivalent) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["counts"]
        killed, surv, eq = c.get("killed", 0), c.get("survived", 0), c.get("equivalent", 0)
        timeout = c.get("timeout", 0) + c.get("segfault", 0)
        checked = r["sample"] - c.get("not checked", 0)
        killed_all = killed + timeout  # a timeout is a detected mutant (the tests did not pass)
        denom = checked - eq - c.get("no tests", 0)
        score = f"{100 * killed_all / denom:.0f}%" if denom else "-"
        lines.append(f"| `{r['module']}` | {r['mutants']} | {r['sample']} | {checked} | {killed} | {surv} | {eq} | "
                     f"{timeout} | {c.get('no tests', 0)} | {score} |")
    text = REPORT.read_text() if REPORT.exists() else ""
    start, end = "<!-- mutation:table -->", "<!-- /mutation:table -->"
    table = "\n".join(lines)
    if start in text and end in text:
        text = text[: text.index(start) + len(start)] + "\n" + table + "\n" + text[text.index(end):]
    else:
        text += f"\n{start}\n{table}\n{end}\n"
    REPORT.write_text(text)
    for r in rows:
        if r["survivors"]:
            print(f"{r['module']}: survivors {' '.join(r['survivors'])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", action="append", choices=sorted(MODULES))
    ap.add_argument("--sample", type=int, default=150)
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--budget", type=float, default=900.0, help="seconds per module (resume to go on)")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    if not args.report_only:
        for slug in args.module or list(MODULES):
            s = measure(slug, args.sample, args.seed, time.time() + args.budget)
            print(json.dumps({k: s[k] for k in ("module", "mutants", "sample", "counts")}))
    report()


if __name__ == "__main__":
    main()
