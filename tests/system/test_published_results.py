"""A published results page is what its kept run logs generate (issue 29, item 5: every number in the docs traces
to a logged run in the repository): each page's tables are regenerated from its results/run-logs.tar.gz, and the
sha256 the page states is the archive's."""

from __future__ import annotations

import hashlib
import re
import shutil
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fedent.cli import main
from fedent.experiments.reproduce_report import BEGIN, END

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Page:
    profile: str
    rows: str
    runs: int  # run directories in the archive: rows x seeds, over its settings
    setting: str  # the settings the archive holds, comma-separated
    extra: tuple[str, ...] = ()
    folder: str | None = None  # under docs/; None: the profile's name ("": docs/results.md itself)
    seeds: str = "0,1,2"
    archive: str | None = None  # its run logs under docs/, where another page's archive holds them

    @property
    def page(self) -> Path:
        return ROOT / "docs" / (self.profile if self.folder is None else self.folder) / "results.md"

    @property
    def logs(self) -> Path:
        return ROOT / "docs" / self.archive if self.archive else self.page.parent / "results" / "run-logs.tar.gz"


PAGES = [
    Page("mnist", "fedavg,fedent,fedadam,fedprox,feddyn,fedent-shuffled,fedent-fixed,fedent-cap-none", 24,
         "mnist-pathological", ("--set", "data.root=data/mnist")),
    Page("mnist", "fedavg,fedent,fedadam,feddyn,fedcos,fednorm,fedavg-replay-mean,fedavg-replay,fedavg-lr9,fedent-lr9,"
                  "fedadam-lr3,feddyn-lr9-alpha0.01,fedprox,fedprox-lr9-mu0.0001,fedcos-lr9,fednorm-lr9,fedadam-lr9,"
                  "fedent-lr9-gamma0.999,fedadam-lr9-tau0.0001", 57, "mnist-pathological",
         ("--set", "data.root=data/mnist"),
         folder="mnist-cpu"),
    Page("medium", "fedent,fedavg,fedent-first,fedavg-replay-mean,fedavg-lr5,fedavg-lr10", 18, "pathological"),
    Page("cpu", "fedavg,fedavg-lr2,fedavg-lr5,fedavg-lr10,fedent,fedent-first,fedavg-replay-mean,fedadam,feddyn", 27,
         "pathological", ("--only", "controls"), folder=""),
    Page("cpu", "fedavg,fedprox,fedadam,feddyn,fedcos,fednorm,fedent,fedavg-replay-mean", 40, "pathological",
         ("--only", "main,controls", "--settings", "pathological", "--tuned",
          "pathological=docs/cpu-tuned/results/tuned.json"), folder="cpu-tuned", seeds="0,1,2,3,4"),
    # the archive: 3 seeds of the pathological and the EMNIST-L (α = 1.0 and α = 0.5) twins
    Page("full", "fedavg,fedent", 39, "pathological,emnist-dir1.0,emnist-dir0.5",
         ("--settings", "pathological,emnist-dir1.0,emnist-dir0.5", "--set", "train.local_eval=0"), folder="full-cpu"),
    # seed 0 alone, the counterpart of the `full` page's H100 seed 0 on two settings, from the same archive
    Page("full", "fedavg,fedent", 39, "pathological,emnist-dir1.0,emnist-dir0.5",
         ("--settings", "pathological,emnist-dir1.0,emnist-dir0.5", "--set", "train.local_eval=0"),
         folder="full-cpu/seed0",
         seeds="0", archive="full-cpu/results/run-logs.tar.gz"),
    # the pathological twin's round-mean replay control (3 seeds) beside FedAvg and FedEnt, from the same archive
    Page("full", "fedavg,fedent,fedavg-replay-mean", 21, "pathological",
         ("--settings", "pathological", "--set", "train.local_eval=0"), folder="full-cpu/replay",
         archive="full-cpu/results/run-logs.tar.gz"),
    # the pathological twin's shuffled-rates and uncapped controls (3 seeds each) beside FedAvg and FedEnt
    Page("full", "fedavg,fedent,fedent-shuffled,fedent-cap-none", 21, "pathological",
         ("--settings", "pathological", "--set", "train.local_eval=0"), folder="full-cpu/controls",
         archive="full-cpu/results/run-logs.tar.gz"),
    # the pathological twin's FedAvg and FedEnt at the rate their validation searches chose (3 seeds each)
    Page("full", "fedavg,fedent,fedavg-lr9,fedent-lr9", 21, "pathological",
         ("--settings", "pathological", "--set", "train.local_eval=0"), folder="full-cpu/tuned",
         archive="full-cpu/results/run-logs.tar.gz"),
    # the EMNIST-L twin's (α = 1.0) FedAvg and FedEnt at the rate their validation searches chose (3 seeds each)
    Page("full", "fedavg,fedent,fedavg-lr2,fedent-lr2", 12, "emnist-dir1.0",
         ("--settings", "emnist-dir1.0", "--set", "train.local_eval=0"), folder="full-cpu/tuned-emnist",
         archive="full-cpu/results/run-logs.tar.gz"),
]


def _generated(text: str) -> str:
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    # the commit that wrote it, "(uncommitted changes)" included: the rest of that line stays compared
    return re.sub(r"\(report written at .*\)$", "(report written at …)", block, flags=re.M)


def _id(p: Page) -> str:
    return p.profile if p.folder is None else p.folder or "results"


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_the_page_states_its_archives_checksum(page: Page) -> None:
    digest = hashlib.sha256(page.logs.read_bytes()).hexdigest()
    assert digest in page.page.read_text(encoding="utf-8").replace("\n  ", "")


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_the_page_is_what_its_run_logs_generate(tmp_path: Path, page: Page, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # a page's command names files relative to the repository (its tuned.json)
    out, docs = tmp_path / "results" / page.profile, tmp_path / "docs"
    out.mkdir(parents=True)
    docs.mkdir()
    with tarfile.open(page.logs) as tar:
        tar.extractall(out, filter="data")
    assert sum(len(list((out / "runs" / s).iterdir())) for s in page.setting.split(",")) == page.runs
    shutil.copyfile(page.page, docs / "results.md")
    rc = main(["reproduce", "--profile", page.profile, "--seeds", page.seeds, "--rows", page.rows, *page.extra,
               "--out", str(out), "--config-dir", str(ROOT / "configs"), "--report-only", "--publish", str(docs)])
    assert rc == 0
    assert _generated((docs / "results.md").read_text(encoding="utf-8")) == _generated(page.page.read_text("utf-8"))


# archives built by `python -m fedent.experiments.archive_runs` (the older ones were packed by hand)
REBUILDABLE = ["full-cpu/results/run-logs.tar.gz", "full-cpu/results/fedent-knobs-tune-3seeds-logs.tar.gz",
               "full-cpu/results/emnist-fedent-beta-tune-logs.tar.gz",
               "full-cpu/results/emnist-fedent-knobs-tune-logs.tar.gz"]


@pytest.mark.parametrize("archive", REBUILDABLE)
def test_the_archive_is_rebuilt_byte_for_byte_from_its_unpacked_logs(tmp_path: Path, archive: str) -> None:
    """The page quotes the archive's sha256; unpacked and archived again it gives the same bytes, so the quoted
    checksum names these logs and nothing the packing machine added."""
    from fedent.experiments import archive_runs

    kept = ROOT / "docs" / archive
    with tarfile.open(kept) as tar:
        tar.extractall(tmp_path / "out", filter="data")
    again = archive_runs.archive(tmp_path / "out", tmp_path / "again.tar.gz")
    assert again.left_out == ()
    assert again.sha256 == hashlib.sha256(kept.read_bytes()).hexdigest()


PHI2_LOGS = ROOT / "docs" / "results" / "phi2-offline-logs.tar.gz"


def test_the_offline_phi2_table_is_what_its_kept_runs_score(tmp_path: Path) -> None:
    """docs/results.md's small check of Algorithm 1's φ2(t+1) (one offline and one online run, 12 rounds) is
    scored from the two runs kept in docs/results/phi2-offline-logs.tar.gz, and the page states its checksum."""
    from fedent import runlog
    from fedent.experiments.mechanism import phi2_scores

    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert hashlib.sha256(PHI2_LOGS.read_bytes()).hexdigest() in page.replace("\n", "")
    with tarfile.open(PHI2_LOGS) as tar:
        tar.extractall(tmp_path, filter="data")
    scores = {name: phi2_scores([runlog.read_metrics(tmp_path / name / "metrics.jsonl")]) for name in
              ("offline", "online")}
    off, on = scores["offline"], scores["online"]
    assert off is not None and on is not None
    logged, used, online = off["offline"]["logged"], off["offline"]["used"], on["online"]["logged"]
    assert off["offline"]["rounds"] == 12 and logged["n"] == 12
    # the page's rows: median error, the guess's, rounds closer than the guess and with the change's sign right
    guess = f"{100 * off['offline']['naive_err']:.2f}%"
    rows = [f"| offline | as Algorithm 1 predicted it | {100 * logged['err']:.2f}% | {guess} "
            f"| {round(logged['closer'] * 12)} of 12",
            f"| offline | re-solved online at the rate used | {100 * used['err']:.3f}% | "
            f"{guess} | {round(used['closer'] * 12)} of 12",
            f"| online | as logged | {100 * online['err']:.3f}% | {100 * on['online']['naive_err']:.2f}% | "
            f"{round(online['closer'] * 12)} of 12"]
    for row in rows:
        assert row in page, row
    assert round(logged["sign"] * logged["sign_n"]) == 1 and logged["sign_n"] == 12  # "sign wrong in 11 of 12"


def _phi2_cell(score: dict[str, Any], guess: float, first: bool = False) -> str:
    lo, hi = score["closer_ci"]
    k = round(score["closer"] * score["n"])
    sign = round(score["sign"] * score["sign_n"])
    level = "95% " if first else ""  # the table's first row names the level once
    return (f"{100 * score['err']:.2f}% | {100 * guess:.2f}% | {k} of {score['n']} ({level}{100 * lo:.0f}–"
            f"{100 * hi:.0f}%) | {sign} of {score['sign_n']} ({100 * score['sign_ci'][0]:.0f}–"
            f"{100 * score['sign_ci'][1]:.0f}%) |")


def _phi2_rows(offline: str, online: str, o: dict[str, Any], n: dict[str, Any]) -> list[str]:
    """The φ2 table's three rows: the offline runs' prediction as made and re-solved online, the online runs'."""
    return [f"| {offline} | as Algorithm 1 predicted it | {_phi2_cell(o['logged'], o['naive_err'], True)}",
            f"| {offline} | re-solved online at the rate used | {_phi2_cell(o['used'], o['naive_err'])}",
            f"| {online} | as logged | {_phi2_cell(n['logged'], n['naive_err'])}"]


def _offline_twin_of(offline: Path, online: Path) -> dict[str, Any]:
    """Checks the offline FedEnt run is the online run's problem with only the estimator changed (algorithm options,
    model, partition and its md5, rounds, sampling, local training, seed); returns Algorithm 1's report."""
    import json

    import yaml

    cfg = yaml.safe_load((offline / "config.yaml").read_text(encoding="utf-8"))
    ref = yaml.safe_load((online / "config.yaml").read_text(encoding="utf-8"))
    assert cfg["algorithm"]["estimator"] == "offline" and ref["algorithm"]["estimator"] == "online"
    assert {k: v for k, v in cfg["algorithm"].items() if k != "estimator"} == \
        {k: v for k, v in ref["algorithm"].items() if k != "estimator"}
    assert cfg["model"] == ref["model"] and cfg["data"]["partition"] == ref["data"]["partition"]
    for key in ("rounds", "fraction", "local_epochs", "batch_size", "lr", "seed"):
        assert cfg["train"][key] == ref["train"][key], key
    assert (json.loads((offline / "partition.json").read_text(encoding="utf-8"))["md5"] ==
            json.loads((online / "partition.json").read_text(encoding="utf-8"))["md5"])
    report: dict[str, Any] = json.loads((offline / "estimator.json").read_text(encoding="utf-8"))["report"]
    return report


def test_the_full_scale_offline_phi2_table_is_what_its_kept_run_scores(tmp_path: Path) -> None:
    """docs/results.md's full-scale check of Algorithm 1 (real MNIST, seed 0): the offline run kept in
    docs/results/phi2-offline-mnist-logs.tar.gz and the H100's online FedEnt run of the same seed (the real-MNIST
    archive) give the page's φ2 table, rates, cap shares and accuracies; the run is the row's problem with only the
    estimator changed, Algorithm 1 converged as the page says, and the page states the archive's checksum."""
    import statistics

    from fedent import runlog
    from fedent.experiments.mechanism import phi2_scores, solve_stats

    logs = ROOT / "docs" / "results" / "phi2-offline-mnist-logs.tar.gz"
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert hashlib.sha256(logs.read_bytes()).hexdigest() in page.replace("\n", "")
    text = page.replace("\n", " ")
    with tarfile.open(logs) as tar:
        tar.extractall(tmp_path, filter="data")
    with tarfile.open(ROOT / "docs" / "mnist" / "results" / "run-logs.tar.gz") as tar:
        tar.extractall(tmp_path / "h100", filter="data")
    offline, online = tmp_path / "offline", tmp_path / "h100" / "runs" / "mnist-pathological" / "fedent-s0"
    report = _offline_twin_of(offline, online)
    assert report["stop_reason"] == "converged" and report["eps1"] == report["eps2"] == 0.001
    assert f"after {report['sweeps']} sweeps and {report['gradient_evaluations']:,} client gradient" in text

    recs = {name: runlog.read_metrics(run / "metrics.jsonl") for name, run in (("off", offline), ("on", online))}
    assert [r["clients"] for r in recs["off"]] == [r["clients"] for r in recs["on"]]  # the same participants
    off, on = phi2_scores([recs["off"]]), phi2_scores([recs["on"]])
    assert off is not None and on is not None
    o, n = off["offline"], on["online"]
    assert o["rounds"] == n["rounds"] == 50

    for row in _phi2_rows("offline (CPU)", "online (H100)", o, n):
        assert row in page, row
    wrong = o["logged"]["sign_n"] - round(o["logged"]["sign"] * o["logged"]["sign_n"])
    assert f"sign wrong in {wrong} of 50 rounds" in text

    # the mechanism table's definitions (η* at the cap U = min(B, η_max); θ-weighted mean used rate)
    stats = {k: solve_stats([v]) for k, v in recs.items()}
    assert stats["off"] is not None and stats["on"] is not None and stats["off"]["solves"] == 1000
    shares = {k: (v["at_bound"], v["zero"]) for k, v in stats.items() if v is not None}
    said = [f"cap in {100 * shares['off'][0]:.0f}% of its 1,000 solves and at 0 in {100 * shares['off'][1]:.0f}% "
            f"(online: {100 * shares['on'][0]:.0f}% and {100 * shares['on'][1]:.0f}%)",
            f"from {stats['off']['rate_first']:.4f} to {stats['off']['rate_last']:.4f} (online: "
            f"{stats['on']['rate_first']:.4f} to {stats['on']['rate_last']:.4f})",
            f"ended at {100 * recs['off'][-1]['test_acc']:.2f}% after round 50, end point "
            f"{100 * statistics.fmean(r['test_acc'] for r in recs['off'][-5:]):.2f}%, against the online run's "
            f"{100 * recs['on'][-1]['test_acc']:.2f}% and "
            f"{100 * statistics.fmean(r['test_acc'] for r in recs['on'][-5:]):.2f}%"]
    gaps = [100 * abs(a["test_acc"] - b["test_acc"]) for a, b in zip(recs["off"], recs["on"], strict=True)]
    said.append(f"differ by up to {max(gaps):.2f} points in an early round and by at most {max(gaps[-10:]):.2f} in "
                f"the last 10")
    assert gaps.index(max(gaps)) < 10  # "an early round"
    for phrase in said:
        assert phrase in text, phrase


def test_the_offline_phi2_table_over_three_seeds_is_what_the_kept_runs_score(tmp_path: Path) -> None:
    """docs/results.md: Algorithm 1 on real MNIST, seeds 1 and 2 added to seed 0 (two archives), each offline run the
    row's problem with only the estimator changed against the H100's online run of its seed; the pooled φ2 table,
    each seed's wrong signs and the paired end points and finals are what the runs give."""

    import yaml

    from fedent import runlog
    from fedent.experiments import paired as P
    from fedent.experiments.mechanism import phi2_scores

    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    text = page.replace("\n", " ")
    archives = [ROOT / "docs" / "results" / n for n in ("phi2-offline-mnist-logs.tar.gz",
                                                        "phi2-offline-mnist-s1-s2-logs.tar.gz")]
    for archive in archives:
        assert hashlib.sha256(archive.read_bytes()).hexdigest() in page.replace("\n", "")
        with tarfile.open(archive) as tar:
            tar.extractall(tmp_path, filter="data")
    with tarfile.open(ROOT / "docs" / "mnist" / "results" / "run-logs.tar.gz") as tar:
        tar.extractall(tmp_path / "h100", filter="data")
    offline = {0: tmp_path / "offline", 1: tmp_path / "offline-s1", 2: tmp_path / "offline-s2"}
    off, on = {}, {}
    for seed, run in offline.items():
        online = tmp_path / "h100" / "runs" / "mnist-pathological" / f"fedent-s{seed}"
        assert _offline_twin_of(run, online)["stop_reason"] == "converged"
        assert yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))["train"]["seed"] == seed
        off[seed], on[seed] = (runlog.read_metrics(r / "metrics.jsonl") for r in (run, online))
        assert [r["clients"] for r in off[seed]] == [r["clients"] for r in on[seed]]  # the same participants
        one = phi2_scores([off[seed]])
        assert one is not None
        logged = one["offline"]["logged"]
        assert logged["sign_n"] - round(logged["sign"] * logged["sign_n"]) == 49  # "wrong in 49 of 50 ... each"
    pooled_off, pooled_on = phi2_scores(list(off.values())), phi2_scores(list(on.values()))
    assert pooled_off is not None and pooled_on is not None
    o, n = pooled_off["offline"], pooled_on["online"]
    assert o["rounds"] == n["rounds"] == 150

    for row in _phi2_rows("offline (CPU), seeds 0–2", "online (H100), seeds 0–2", o, n):
        assert row in page, row
    end = P.paired({s: P.tail_mean(r) for s, r in off.items()}, {s: P.tail_mean(r) for s, r in on.items()})
    final = P.paired({s: r[-1]["test_acc"] for s, r in off.items()}, {s: r[-1]["test_acc"] for s, r in on.items()})
    def said(p: P.Paired | None) -> str:  # the page's minus signs
        return P.fmt(p).split(" (n")[0].replace("-", "−")

    assert f"end points are {said(end)} points from the online runs'" in text
    assert f"final accuracies {said(final)}." in text


def test_the_old_commits_rerun_of_fedavg_x10_gives_the_kept_runs_accuracies(tmp_path: Path) -> None:
    """docs/results.md: commit cc08eb1, rerun on this box, gives the same six test accuracies as today's code for
    FedAvg × 10, seed 2 (so the first study's collapse was the old machine's arithmetic); both runs' logs are kept."""
    from fedent import runlog

    old_logs = ROOT / "docs" / "results" / "cc08eb1-fedavg-lr10-s2.tar.gz"
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert hashlib.sha256(old_logs.read_bytes()).hexdigest() in page.replace("\n", "")
    run = Path("runs/pathological/fedavg-lr10-s2/metrics.jsonl")
    accs = []
    for name, archive in (("old", old_logs), ("new", ROOT / "docs" / "results" / "run-logs.tar.gz")):
        with tarfile.open(archive) as tar:
            tar.extractall(tmp_path / name, filter="data")
        recs = runlog.read_metrics(tmp_path / name / run)
        accs.append([r["test_acc"] for r in recs if r.get("test_acc") is not None])
    assert len(accs[0]) == 6 and accs[0] == accs[1]
    assert f"{100 * accs[0][-1]:.1f}%" == "27.4%" and "ends it at 27.4%" in page


def test_cpu_fedavg_tracks_the_h100_run_over_the_first_ten_rounds_as_the_page_says(tmp_path: Path) -> None:
    """docs/mnist-cpu/results.md compares rows trained on this CPU with rows trained on an H100; its check of the
    machine effect (FedAvg, seed 0, 10 rounds on the CPU against the first 10 of the H100 run) is recomputed from
    the two kept runs."""
    from fedent import runlog

    page = (ROOT / "docs" / "mnist-cpu" / "results.md").read_text(encoding="utf-8")
    prefix = ROOT / "docs" / "mnist-cpu" / "results" / "fedavg-cpu-prefix.tar.gz"
    assert hashlib.sha256(prefix.read_bytes()).hexdigest() in page.replace("\n", "")
    run = Path("runs/mnist-pathological/fedavg-s0/metrics.jsonl")
    acc = []
    for name, archive in (("cpu", prefix), ("h100", ROOT / "docs" / "mnist" / "results" / "run-logs.tar.gz")):
        with tarfile.open(archive) as tar:
            tar.extractall(tmp_path / name, filter="data")
        acc.append({r["round"]: r["test_acc"] for r in runlog.read_metrics(tmp_path / name / run)
                    if r.get("test_acc") is not None})
    cpu, h100 = acc
    assert sorted(cpu) == list(range(1, 11))
    gap = max(abs(cpu[r] - h100[r]) for r in cpu)
    assert f"at most {100 * gap:.2f} points" in page


def test_fedcos_tracks_fedavg_on_real_mnist_as_the_pages_say(tmp_path: Path) -> None:
    """docs/mnist-cpu/results.md and docs/results.md: FedCos (CPU) stays within the stated points of FedAvg (H100)
    in every round of the 3 seeds, recomputed from the page's kept runs."""
    from fedent import runlog

    with tarfile.open(ROOT / "docs" / "mnist-cpu" / "results" / "run-logs.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    gap = 0.0
    for seed in (0, 1, 2):
        acc = [{r["round"]: r["test_acc"] for r in runlog.read_metrics(
            tmp_path / "runs" / "mnist-pathological" / f"{row}-s{seed}" / "metrics.jsonl") if r.get("test_acc")}
            for row in ("fedcos", "fedavg")]
        assert sorted(acc[0]) == sorted(acc[1]) == list(range(1, 51))
        gap = max(gap, *(abs(acc[0][r] - acc[1][r]) for r in acc[0]))
    said = f"within {100 * gap:.2f} points of FedAvg"
    for page in (ROOT / "docs" / "mnist-cpu" / "results.md", ROOT / "docs" / "results.md"):
        assert said in page.read_text(encoding="utf-8").replace("\n  ", " "), page


def test_the_round_mean_replay_pairs_on_real_mnist_are_what_the_pages_say(tmp_path: Path) -> None:
    """docs/mnist-cpu/results.md and docs/results.md: FedAvg at FedEnt's round-mean rate against FedEnt, FedAvg and
    the per-client replay (same CPU), the per-client replay against FedEnt (H100), and the rows at validation-tuned
    values against each other and their untuned rows: paired end points recomputed from the page's kept runs
    (``pair_runs``, as the pages' command prints them)."""
    from fedent.experiments import paired
    from fedent.experiments.pair_runs import pair

    with tarfile.open(ROOT / "docs" / "mnist-cpu" / "results" / "run-logs.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    setting = tmp_path / "runs" / "mnist-pathological"
    for row, against in (("fedavg-replay-mean", "fedent"), ("fedavg-replay-mean", "fedavg"),
                         ("fedavg-replay-mean", "fedavg-replay"), ("fedavg-replay", "fedent"),
                         # FedAvg at its validation-tuned rate (the tuning: the test below)
                         ("fedavg-lr9", "fedent"), ("fedavg-lr9", "fedavg-replay"),
                         ("fedavg-lr9", "fedavg-replay-mean"),
                         # FedEnt at its validation-tuned base rate
                         ("fedent-lr9", "fedavg-lr9"), ("fedent-lr9", "fedent"), ("fedent-lr9", "fedavg"),
                         ("fedent-lr9", "fedavg-replay"),
                         # FedAdam and FedDyn at their validation-searched values
                         ("fedadam-lr3", "fedent-lr9"), ("fedadam-lr3", "fedavg-lr9"), ("fedadam-lr3", "fedadam"),
                         ("feddyn-lr9-alpha0.01", "fedent-lr9"), ("feddyn-lr9-alpha0.01", "fedavg-lr9"),
                         ("feddyn-lr9-alpha0.01", "feddyn"), ("fedadam-lr3", "feddyn-lr9-alpha0.01"),
                         # FedProx at its validation-searched values
                         ("fedprox-lr9-mu0.0001", "fedent-lr9"), ("fedprox-lr9-mu0.0001", "fedavg-lr9"),
                         ("fedprox-lr9-mu0.0001", "fedprox"),
                         # FedCos at its validation-searched rate
                         ("fedcos-lr9", "fedent-lr9"), ("fedcos-lr9", "fedavg-lr9"), ("fedcos-lr9", "fedcos"),
                         ("fedcos-lr9", "fedent"),
                         # FedNorm at its validation-searched rate
                         ("fednorm-lr9", "fedent-lr9"), ("fednorm-lr9", "fedavg-lr9"), ("fednorm-lr9", "fednorm"),
                         ("fednorm-lr9", "fedent"),
                         # FedAdam at the point its two-seed search chose
                         ("fedadam-lr9", "fedadam-lr3"), ("fedadam-lr9", "fedent-lr9"), ("fedadam-lr9", "fedavg-lr9"),
                         ("fedadam-lr9", "fedadam"), ("fedadam-lr9", "feddyn-lr9-alpha0.01"),
                         # FedEnt at the gamma two of three tuning seeds chose
                         ("fedent-lr9-gamma0.999", "fedent-lr9"), ("fedent-lr9-gamma0.999", "fedavg-lr9"),
                         ("fedent-lr9-gamma0.999", "fedent"), ("fedent-lr9-gamma0.999", "fedadam-lr9"),
                         ("fedent-lr9-gamma0.999", "feddyn-lr9-alpha0.01"),
                         # FedAdam at the τ its search chose (rate and server rate as fedadam-lr9)
                         ("fedadam-lr9-tau0.0001", "fedadam-lr9"), ("fedadam-lr9-tau0.0001", "fedent-lr9"),
                         ("fedadam-lr9-tau0.0001", "fedavg-lr9"), ("fedadam-lr9-tau0.0001", "fedadam"),
                         ("fedadam-lr9-tau0.0001", "feddyn-lr9-alpha0.01")):
        got = pair(setting, row, against)
        assert got is not None and got.n == 3
        said = paired.fmt(got).split(" (n")[0].replace("-", "−")  # e.g. "+0.12 [−0.06, +0.29]"
        for page in (ROOT / "docs" / "mnist-cpu" / "results.md", ROOT / "docs" / "results.md"):
            assert said in page.read_text(encoding="utf-8").replace("\n  ", " "), (page, said)


def test_the_cpu_rows_of_the_real_mnist_table_are_the_generated_pages(tmp_path: Path) -> None:
    """docs/results.md's real-MNIST table copies each CPU row (named by its label) from docs/mnist-cpu/results.md's
    generated tables: final (mean ± std), end point and Δ against FedEnt, as that page's regenerated block prints
    them (the block itself: ``test_the_page_is_what_its_run_logs_generate``)."""
    generated = _generated((ROOT / "docs" / "mnist-cpu" / "results.md").read_text(encoding="utf-8"))
    rows: dict[str, list[list[str]]] = {}  # label -> its rows in the block: the accuracy table's, then the paired one's
    for line in generated.splitlines():
        if line.startswith("| "):
            row = [c.strip() for c in line.strip().strip("|").split("|")]
            rows.setdefault(row[0].split(" (")[0], []).append(row)
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    table = text.split("## Real MNIST, Table IV's pathological row", 1)[1].split("\n\n| row |", 1)[1].split("\n\n")[0]
    checked = []
    for line in table.splitlines():
        row = [c.strip() for c in line.strip().strip("|").split("|")]
        label = re.search(r"\(`([a-z0-9.-]+)`[^)]*; CPU", row[0])
        if label is None:
            continue
        main, paired_row = rows[label[1]][:2]
        said = [c.replace("\u2212", "-") for c in row[1:4]]
        assert said == [main[1], paired_row[1], paired_row[2].split(" (n")[0]], label[1]
        checked.append(label[1])
    assert {"fedavg-lr9", "fedent-lr9", "fedadam-lr3", "fedadam-lr9", "fednorm-lr9",
            "fedent-lr9-gamma0.999", "fedadam-lr9-tau0.0001"} <= set(checked), checked


SEARCH_PAGES = {"mnist-cpu": "results.md", "full-cpu": "tuning.md"}  # folder -> the page that records its searches


def _tuning_archive(name: str, into: Path, folder: str = "mnist-cpu") -> list[tuple[Path, str]]:
    """docs/FOLDER/results/NAME unpacked into ``into``, after checking the folder's search page states its sha256;
    the two pages that quote it (that page and docs/results.md), as (path, text with the bullets' continuation lines
    joined)."""
    archive = ROOT / "docs" / folder / "results" / name
    pages = [(p, p.read_text(encoding="utf-8").replace("\n  ", " ")) for p in
             (ROOT / "docs" / folder / SEARCH_PAGES[folder], ROOT / "docs" / "results.md")]
    if folder == "full-cpu":  # tuning.md's paragraphs wrap anywhere, not only in bullets
        pages[0] = (pages[0][0], re.sub(r"\s*\n\s*", " ", pages[0][1]))
    assert hashlib.sha256(archive.read_bytes()).hexdigest() in pages[0][1].replace("\n", "")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return pages


def _point_run(values: dict[str, float], seed: int) -> str:
    """A tuning run's directory name: every knob's value at that point, by key, then the seed."""
    return "_".join(f"{k.split('.')[-1]}{v:g}" for k, v in sorted(values.items())) + f"-s{seed}"


def _a_sealed_search_point(run: Path, algorithm: str, lr: float, score: float | None, row: Mapping[str, Any],
                           also: tuple[str, ...] = ()) -> str:
    """One point of a rate search, checked against its kept run: that algorithm at that rate on the row's problem
    (the validation split and the data root aside; train keys ``also`` too), the test set sealed, and its score (the
    mean validation accuracy of the last 5 of 50 rounds) or its divergence on a non-finite model. Returns the point
    as the pages quote it: "0.09 (97.69%)" or "0.27 (diverged in round 1)"."""
    import json
    import statistics

    import yaml

    from fedent import runlog

    cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    status = json.loads((run / "status.json").read_text(encoding="utf-8"))
    assert (cfg["algorithm"]["name"], cfg["train"]["lr"]) == (algorithm, lr)
    assert cfg["train"]["evaluate_test"] is False and cfg["data"]["validation_fraction"] == 0.1
    assert status["state"]["evaluation"] == "sealed"
    for part in ("data", "model"):
        want = {k: v for k, v in row[part].items() if k not in ("root", "validation_fraction")}
        assert {k: cfg[part][k] for k in want} == want, part
    for key in ("rounds", "fraction", "local_epochs", "batch_size", "seed", *also):  # tf32 is a no-op on CPU
        assert cfg["train"][key] == row["train"][key], key
    if score is None:
        assert status["phase"] == "failed" and "not finite" in status["state"]["error"]
        return f"{lr:g} (diverged in round {status['round']})"
    recs = runlog.read_metrics(run / "metrics.jsonl")
    assert len(recs) == 50 and all(r["test_acc"] is None for r in recs)  # the test set was never evaluated
    assert statistics.fmean(r["val_acc"] for r in recs[-5:]) == pytest.approx(score, abs=1e-12)
    return f"{lr:g} ({100 * score:.2f}%)"


@dataclass(frozen=True)
class TunedRow:
    """A rate ``fedent tune`` chose on the real-MNIST row (docs/mnist-cpu/results/*tune*-logs.tar.gz) and the profile
    row that tests it: FedAvg's rate, FedEnt's base rate η_i(−1) (``--knobs train.lr``: β and γ held at 0.99), and
    the baselines' rates, each other knob held at the value its search held while searching the rate."""

    algorithm: str
    row: str
    held: tuple[tuple[str, float], ...] = ()  # knobs not tuned, at the config's value: named in each run's dir

    def run_name(self, lr: float, seed: int = 0) -> str:
        return _point_run({**dict(self.held), "train.lr": lr}, seed)


TUNED_ROWS = [TunedRow("fedavg", "fedavg-lr9"),
              TunedRow("fedent", "fedent-lr9", (("algorithm.beta", 0.99), ("algorithm.gamma", 0.99)))]


@pytest.mark.parametrize("tuned_row", TUNED_ROWS, ids=lambda t: t.algorithm)
def test_a_rate_tuned_on_real_mnist_is_the_rate_its_row_tests(tmp_path: Path, tuned_row: TunedRow) -> None:
    """docs/mnist-cpu/results.md and docs/results.md: ``fedent tune`` chose the rate on a validation split of the
    real-MNIST row with the test set sealed, and the row is that rate, trained on the same problem. Each tried
    rate's score is recomputed from its kept run (mean validation accuracy of the last 5 rounds), the bracket is
    recomputed, the knobs not tuned stayed at the config's value in every run, the diverged run failed on a
    non-finite model, and the row's test runs started after the tuning ended."""
    import json

    import yaml

    from fedent.experiments.plan import build_plan
    from fedent.experiments.profiles import get_profile

    algorithm = tuned_row.algorithm
    pages = _tuning_archive("tune-logs.tar.gz", tmp_path / "tune")
    tuned = json.loads((tmp_path / "tune" / "tuned.json").read_text(encoding="utf-8"))
    assert tuned["seeds"] == [0] and tuned["validation_fraction"] == 0.1 and tuned["tail_k"] == 5
    knob, *held = tuned["algorithms"][algorithm]["knobs"]
    assert [(k["key"], k["tuned"], k["tried"]) for k in held] == [(k, False, []) for k, _ in tuned_row.held]
    assert all(tuned["algorithms"][algorithm]["chosen"][k] == v for k, v in tuned_row.held)
    tried = sorted(knob["tried"])
    assert knob["key"] == "train.lr" and knob["tuned"] and tuned["algorithms"][algorithm]["runs"] == len(tried) == 4
    runs = tmp_path / "tune" / "runs" / algorithm
    assert {d.name for d in runs.iterdir()} == {tuned_row.run_name(lr) for lr, _ in tried}  # no other run kept

    plan = build_plan(get_profile("mnist"), [0], tmp_path / "plan", ROOT / "configs", rows=[tuned_row.row])
    (row,) = plan.runs
    said, ended = [], 0.0
    for lr, score in tried:
        run = runs / tuned_row.run_name(lr)
        status = json.loads((run / "status.json").read_text(encoding="utf-8"))
        ended = max(ended, status["updated_at"])
        cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
        assert all(cfg["algorithm"][k.split(".")[-1]] == v for k, v in tuned_row.held)
        said.append(_a_sealed_search_point(run, algorithm, lr, score, row.config))
    finite = [s for _, s in tried if s is not None]
    at = [s for _, s in tried].index(max(finite))
    assert 0 < at < len(tried) - 1  # bracketed: a tried value on each side, each worse or diverged
    best = tried[at][0]
    assert tuned["algorithms"][algorithm]["chosen"]["train.lr"] == best == knob["best"] == pytest.approx(0.09)
    assert row.config["train"]["lr"] == pytest.approx(best)
    for page, text in pages:
        assert ", ".join(said) in text, (page, said)

    with tarfile.open(ROOT / "docs" / "mnist-cpu" / "results" / "run-logs.tar.gz") as tar:
        tar.extractall(tmp_path / "study", filter="data")
    for seed in (0, 1, 2):  # the test set was read after the rate was chosen, at that rate
        run = tmp_path / "study" / "runs" / "mnist-pathological" / f"{tuned_row.row}-s{seed}"
        status = json.loads((run / "status.json").read_text(encoding="utf-8"))
        assert status["started_at"] > ended
        assert yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))["train"]["lr"] == best


@dataclass(frozen=True)
class SeedSearch:
    """A search run again on more tuning seeds, 0 and 1 unless ``seeds`` says otherwise (archive ``archive``), the runs
    of the seeds ``read`` (seed 0's by default) read back from the first search's archive ``first``. ``searched``: the
    knobs searched after the rate (each at the values chosen before it); the knobs of ``row.held`` not in it stayed at
    the config's value (``--knobs train.lr``). ``rates``: an earlier search of the rate alone whose runs of the seed
    ``rates_seed`` (1 by default) were read back too. ``fresh``: seed-0 runs the first search never trained (an
    extension of the grid that only the seeds' mean asked for). ``seeds``: the tuning seeds of this search; ``read``:
    those whose runs (every knob's) came from ``first``. ``named``: knobs (of ``row.held``) this search adds after
    the first search's: each read-back run was copied in under a name with that knob at its config value (the
    earlier run's files unchanged), and every point away from that value is trained by this search, on every seed.
    ``folder``: where the archives and the page recording the search live (docs/mnist-cpu: the real-MNIST row;
    docs/full-cpu: the pathological twin)."""

    row: TunedRow
    archive: str
    first: str
    searched: tuple[str, ...] = ()
    rates: str | None = None
    fresh: tuple[str, ...] = ()
    seeds: tuple[int, ...] = (0, 1)
    read: tuple[int, ...] = (0,)
    rates_seed: int = 1
    named: tuple[str, ...] = ()
    folder: str = "mnist-cpu"


def _chosen(scores: dict[float, float]) -> float:
    """The value a search chooses: the highest score, ties the smaller value; scores under 1e-9 apart are one (the
    same validation predictions right, summed from other rounds' accuracies, differ in the last bits)."""
    top = max(scores.values())
    return min(v for v, x in scores.items() if x > top - 1e-9)


def _listed(items: list[str]) -> str:
    """Items as the pages list them: "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


FEDDYN_ROW = TunedRow("feddyn", "feddyn-lr9-alpha0.01", (("algorithm.alpha", 0.001),))
FEDADAM_ROW = TunedRow("fedadam", "fedadam-lr3", (("algorithm.server_lr", 0.01),))
FEDPROX_ROW = TunedRow("fedprox", "fedprox-lr9-mu0.0001", (("algorithm.mu", 0.01),))
FEDADAM_TAU_ROW = TunedRow("fedadam", "fedadam-lr9", (("algorithm.server_lr", 0.01), ("algorithm.tau", 0.001)))
FEDNORM_BETA_ROW = TunedRow("fednorm", "fednorm-lr9", (("algorithm.beta", 0.99),))
FEDNORM_GAMMA_ROW = TunedRow("fednorm", "fednorm-lr9", (("algorithm.beta", 0.99), ("algorithm.gamma", 0.99)))
FEDADAM_BETAS_ROW = TunedRow("fedadam", "fedadam-lr9-tau0.0001",
                             (("algorithm.server_lr", 0.01), ("algorithm.tau", 0.001), ("algorithm.beta1", 0.9),
                              ("algorithm.beta2", 0.99)))
SEED_SEARCHES = [SeedSearch(TUNED_ROWS[0], "fedavg-tune-2seeds-logs.tar.gz", "tune-logs.tar.gz"),
                 SeedSearch(TUNED_ROWS[1], "fedent-tune-2seeds-logs.tar.gz", "tune-logs.tar.gz"),
                 SeedSearch(TunedRow("fedcos", "fedcos-lr9"), "cosnorm-tune-2seeds-logs.tar.gz",
                            "cosnorm-tune-logs.tar.gz"),
                 SeedSearch(TunedRow("fednorm", "fednorm-lr9"), "cosnorm-tune-2seeds-logs.tar.gz",
                            "cosnorm-tune-logs.tar.gz"),
                 SeedSearch(FEDDYN_ROW, "dynprox-tune-2seeds-logs.tar.gz", "baselines-tune-logs.tar.gz"),
                 SeedSearch(FEDPROX_ROW, "dynprox-tune-2seeds-logs.tar.gz", "fedprox-tune-logs.tar.gz"),
                 SeedSearch(FEDDYN_ROW, "feddyn-tune-2seeds-logs.tar.gz", "baselines-tune-logs.tar.gz",
                            ("algorithm.alpha",), "dynprox-tune-2seeds-logs.tar.gz"),
                 SeedSearch(FEDADAM_ROW, "fedadam-tune-2seeds-logs.tar.gz", "baselines-tune-logs.tar.gz",
                            fresh=("server_lr0.01_lr0.27-s0",)),
                 SeedSearch(TUNED_ROWS[1], "fedent-knobs-tune-2seeds-logs.tar.gz", "fedent-tune-logs.tar.gz",
                            ("algorithm.beta", "algorithm.gamma"), "fedent-tune-2seeds-logs.tar.gz"),
                 SeedSearch(FEDADAM_ROW, "fedadam-knobs-tune-2seeds-logs.tar.gz", "baselines-tune-logs.tar.gz",
                            ("algorithm.server_lr",), "fedadam-tune-2seeds-logs.tar.gz",
                            ("server_lr0.01_lr0.27-s0", "server_lr0.001_lr0.09-s0", "server_lr0.1_lr0.09-s0")),
                 SeedSearch(FEDPROX_ROW, "fedprox-tune-2seeds-logs.tar.gz", "fedprox-tune-logs.tar.gz",
                            ("algorithm.mu",), "dynprox-tune-2seeds-logs.tar.gz"),
                 SeedSearch(FEDADAM_ROW, "fedadam-tune-3seeds-logs.tar.gz", "fedadam-tune-2seeds-logs.tar.gz",
                            seeds=(0, 1, 2), read=(0, 1)),
                 SeedSearch(FEDDYN_ROW, "dynent-tune-3seeds-logs.tar.gz", "feddyn-tune-2seeds-logs.tar.gz",
                            ("algorithm.alpha",), seeds=(0, 1, 2), read=(0, 1)),
                 SeedSearch(TUNED_ROWS[1], "dynent-tune-3seeds-logs.tar.gz", "fedent-knobs-tune-2seeds-logs.tar.gz",
                            ("algorithm.beta", "algorithm.gamma"), seeds=(0, 1, 2), read=(0, 1)),
                 SeedSearch(FEDADAM_ROW, "fedadam-knobs-tune-3seeds-logs.tar.gz",
                            "fedadam-knobs-tune-2seeds-logs.tar.gz", ("algorithm.server_lr",),
                            "fedadam-tune-3seeds-logs.tar.gz", seeds=(0, 1, 2), read=(0, 1), rates_seed=2),
                 *(SeedSearch(row, "avgcosnorm-tune-3seeds-logs.tar.gz", first, seeds=(0, 1, 2), read=(0, 1))
                   for row, first in ((TUNED_ROWS[0], "fedavg-tune-2seeds-logs.tar.gz"),
                                      (TunedRow("fedcos", "fedcos-lr9"), "cosnorm-tune-2seeds-logs.tar.gz"),
                                      (TunedRow("fednorm", "fednorm-lr9"), "cosnorm-tune-2seeds-logs.tar.gz"))),
                 SeedSearch(FEDPROX_ROW, "fedprox-tune-3seeds-logs.tar.gz", "fedprox-tune-2seeds-logs.tar.gz",
                            ("algorithm.mu",), seeds=(0, 1, 2), read=(0, 1)),
                 SeedSearch(FEDADAM_TAU_ROW, "fedadam-tau-tune-3seeds-logs.tar.gz",
                            "fedadam-knobs-tune-3seeds-logs.tar.gz",
                            ("algorithm.server_lr", "algorithm.tau"), seeds=(0, 1, 2), read=(0, 1, 2),
                            named=("algorithm.tau",)),
                 SeedSearch(FEDNORM_BETA_ROW, "fednorm-beta-tune-3seeds-logs.tar.gz",
                            "avgcosnorm-tune-3seeds-logs.tar.gz", ("algorithm.beta",), seeds=(0, 1, 2),
                            read=(0, 1, 2), named=("algorithm.beta",)),
                 SeedSearch(FEDNORM_GAMMA_ROW, "fednorm-knobs-tune-3seeds-logs.tar.gz",
                            "fednorm-beta-tune-3seeds-logs.tar.gz", ("algorithm.beta", "algorithm.gamma"),
                            seeds=(0, 1, 2), read=(0, 1, 2), named=("algorithm.gamma",)),
                 SeedSearch(FEDADAM_BETAS_ROW, "fedadam-betas-tune-3seeds-logs.tar.gz",
                            "fedadam-tau-tune-3seeds-logs.tar.gz",
                            ("algorithm.server_lr", "algorithm.tau", "algorithm.beta1", "algorithm.beta2"),
                            seeds=(0, 1, 2), read=(0, 1, 2), named=("algorithm.beta1", "algorithm.beta2")),
                 # the pathological twin (docs/full-cpu/tuning.md): FedAvg's rate and FedEnt's base rate on seeds 0, 1,
                 # then FedEnt's base rate, β and γ on seeds 0, 1 (seed 1's base-rate runs: the rate search's), then
                 # FedEnt's base rate on seeds 0, 1, 2, then FedAvg's rate on seeds 0, 1, 2
                 SeedSearch(TunedRow("fedavg", "fedavg-lr9"), "tune-2seeds-logs.tar.gz", "tune-logs.tar.gz",
                            folder="full-cpu"),
                 SeedSearch(TUNED_ROWS[1], "tune-2seeds-logs.tar.gz", "fedent-tune-logs.tar.gz", folder="full-cpu"),
                 SeedSearch(TUNED_ROWS[1], "fedent-knobs-tune-2seeds-logs.tar.gz", "fedent-knobs-tune-logs.tar.gz",
                            ("algorithm.beta", "algorithm.gamma"), "tune-2seeds-logs.tar.gz", folder="full-cpu"),
                 SeedSearch(TUNED_ROWS[1], "fedent-tune-3seeds-logs.tar.gz", "tune-2seeds-logs.tar.gz",
                            seeds=(0, 1, 2), read=(0, 1), folder="full-cpu"),
                 SeedSearch(TunedRow("fedavg", "fedavg-lr9"), "fedavg-tune-3seeds-logs.tar.gz",
                            "tune-2seeds-logs.tar.gz", seeds=(0, 1, 2), read=(0, 1), folder="full-cpu"),
                 # then FedEnt's base rate, β and γ on seeds 0, 1, 2 (seed 2's base-rate runs: its rate search's)
                 SeedSearch(TUNED_ROWS[1], "fedent-knobs-tune-3seeds-logs.tar.gz",
                            "fedent-knobs-tune-2seeds-logs.tar.gz", ("algorithm.beta", "algorithm.gamma"),
                            "fedent-tune-3seeds-logs.tar.gz", seeds=(0, 1, 2), read=(0, 1), rates_seed=2,
                            folder="full-cpu")]


# docs/results.md's "Tuning at a glance": each searched knob of the real-MNIST row -> the archive of its latest search.
GLANCE = {("fedavg", "train.lr"): "avgcosnorm-tune-3seeds-logs.tar.gz",
          **{("fedent", k): "dynent-tune-3seeds-logs.tar.gz"
             for k in ("train.lr", "algorithm.beta", "algorithm.gamma")},
          **{("fedadam", k): "fedadam-betas-tune-3seeds-logs.tar.gz"
             for k in ("train.lr", "algorithm.server_lr", "algorithm.tau", "algorithm.beta1", "algorithm.beta2")},
          **{("feddyn", k): "dynent-tune-3seeds-logs.tar.gz" for k in ("train.lr", "algorithm.alpha")},
          **{("fedprox", k): "fedprox-tune-3seeds-logs.tar.gz" for k in ("train.lr", "algorithm.mu")},
          ("fedcos", "train.lr"): "avgcosnorm-tune-3seeds-logs.tar.gz",
          **{("fednorm", k): "fednorm-knobs-tune-3seeds-logs.tar.gz"
             for k in ("train.lr", "algorithm.beta", "algorithm.gamma")}}


def test_the_tuning_at_a_glance_table_is_each_knobs_latest_search(tmp_path: Path) -> None:
    """docs/results.md's "Tuning at a glance": one row per searched knob, each from the search with the most tuning
    seeds in SEED_SEARCHES (so a newer search cannot leave the table stale), its values tried, number of seeds, each
    seed's own choice (ties: the smaller value) and the mean's choice recomputed from that search's tuned.json."""
    import json

    names = {"fedavg": "FedAvg", "fedent": "FedEnt", "fedadam": "FedAdam", "feddyn": "FedDyn", "fedprox": "FedProx",
             "fedcos": "FedCos", "fednorm": "FedNorm"}
    knob_names = {"algorithm.beta": "β", "algorithm.gamma": "γ", "algorithm.server_lr": "server rate",
                  "algorithm.alpha": "α", "algorithm.mu": "μ", "algorithm.tau": "τ",
                  "algorithm.beta1": "β1", "algorithm.beta2": "β2"}
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    table = text.split("**Tuning at a glance**", 1)[1].split("\n\n| algorithm |", 1)[1].split("\n\n")[0]
    assert len(table.splitlines()) == 2 + len(GLANCE)  # the header, its rule, one row per knob: none untested
    for (algorithm, key), archive in GLANCE.items():
        searches = [srch for srch in SEED_SEARCHES if srch.row.algorithm == algorithm and srch.folder == "mnist-cpu"
                    and key in ("train.lr", *srch.searched)]
        assert archive in [srch.archive for srch in searches if len(srch.seeds) == max(len(x.seeds) for x in searches)]
        _tuning_archive(archive, tmp_path / archive)
        tuned = json.loads((tmp_path / archive / "tuned.json").read_text(encoding="utf-8"))
        knob = next(k for k in tuned["algorithms"][algorithm]["knobs"] if k["key"] == key)
        per_seed = [(v, scores) for v, scores in knob["per_seed"]]
        alone = []
        for j in range(len(tuned["seeds"])):
            ok = {v: sc[j] for v, sc in per_seed if sc[j] is not None}
            alone.append(_chosen(ok))
        label = knob_names.get(key, "base rate" if algorithm == "fedent" else "rate")
        row = (f"| {names[algorithm]} | {label} | {', '.join(f'{v:g}' for v, _ in per_seed)} | {len(alone)} | "
               f"{', '.join(f'{c:g}' for c in alone)} | {knob['best']:g} |")
        assert row in table, row


@pytest.mark.parametrize("search", SEED_SEARCHES,
                         ids=[("twin-" if s.folder == "full-cpu" else "")
                              + f"{s.row.algorithm}-{'-'.join(k.split('.')[-1] for k in ('lr', *s.searched))}"
                              + ("" if len(s.seeds) == 2 else f"-{len(s.seeds)}seeds") for s in SEED_SEARCHES])
def test_a_search_run_again_on_more_tuning_seeds_is_what_its_kept_runs_score(tmp_path: Path,
                                                                             search: SeedSearch) -> None:
    """docs/mnist-cpu/results.md (ninth pass: FedAvg's rate; tenth: FedEnt's base rate, β and γ held at 0.99;
    thirteenth: FedCos's and FedNorm's rates, and FedDyn's and FedProx's at the α and μ their first searches held while
    searching the rate; fourteenth: FedDyn's rate and α, FedAdam's rate and server rate, FedEnt's base rate, β and γ;
    fifteenth: FedProx's rate and μ, and FedAdam's rate on seeds 0, 1 and 2; sixteenth: FedDyn's rate and α, FedEnt's
    base rate, β and γ, and FedAdam's rate and server rate, each on seeds 0, 1 and 2; seventeenth: FedAvg's, FedCos's
    and FedNorm's rates, and FedProx's rate and μ, on seeds 0, 1 and 2; eighteenth: FedAdam's rate, server rate and τ,
    its earlier runs copied in under names with τ; nineteenth: FedNorm's rate and β, its earlier runs copied in under
    names with β, then its rate, β and γ, those runs copied in under names with γ; twentieth: FedAdam's rate, server
    rate, τ, β1 and β2, its τ search's runs copied in under names with β1 and β2), docs/full-cpu/tuning.md (FedAvg's
    rate and FedEnt's base rate on the pathological twin, then FedEnt's base rate, β and γ) and docs/results.md: a
    search run again on tuning seeds 0 and 1 (or 0, 1 and 2) of the real-MNIST row's (or the twin's) validation
    split. The runs of the seeds
    ``read`` are the first search's (archive ``first``), read back, not trained again (but ``fresh``); every seed's
    score is recomputed from its run, the mean decides each knob in turn (a later knob searched at the values chosen
    before it), and tune.md's per-seed table and each seed's own choice are what the runs give; the pages quote those
    scores and choices."""
    import json
    import statistics

    import yaml

    from fedent import runlog

    tuned_row = search.row
    algorithm = tuned_row.algorithm
    pages = _tuning_archive(search.archive, tmp_path / "two", search.folder)
    read_back = {seed: tmp_path / "one" for seed in search.read}  # seed -> where its earlier runs were trained
    with tarfile.open(ROOT / "docs" / search.folder / "results" / search.first) as tar:
        tar.extractall(tmp_path / "one", filter="data")
    if search.rates is not None:
        with tarfile.open(ROOT / "docs" / search.folder / "results" / search.rates) as tar:
            tar.extractall(tmp_path / "rates", filter="data")
        read_back[search.rates_seed] = tmp_path / "rates"
    tuned = json.loads((tmp_path / "two" / "tuned.json").read_text(encoding="utf-8"))
    assert tuned["seeds"] == list(search.seeds) and tuned["validation_fraction"] == 0.1 and tuned["tail_k"] == 5
    knobs = tuned["algorithms"][algorithm]["knobs"]
    assert [k["key"] for k in knobs] == ["train.lr", *(k for k, _ in tuned_row.held)]
    assert [k["key"] for k in knobs if k["tuned"]] == ["train.lr", *search.searched]
    assert all(k["tried"] == [] for k in knobs if not k["tuned"])
    md = (tmp_path / "two" / "tune.md").read_text(encoding="utf-8")
    runs = tmp_path / "two" / "runs" / algorithm
    row = _row_config(tuned_row.row, tmp_path / "plan", search.folder)
    at = dict(tuned_row.held)  # every knob's value while the next is searched: the config's until chosen
    kept, compared = set(), set()  # compared: the seeds whose runs were checked against an earlier archive's
    for knob in (k for k in knobs if k["tuned"]):
        per_seed = {v: scores for v, scores in knob["per_seed"]}
        for v, scores in per_seed.items():
            point = {**at, knob["key"]: v}
            for seed, score in zip(search.seeds, scores, strict=True):
                run = runs / _point_run(point, seed)
                kept.add(run.name)
                cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
                assert (cfg["train"]["seed"], cfg["train"]["evaluate_test"]) == (seed, False)
                assert cfg["data"]["validation_fraction"] == 0.1 and cfg["algorithm"]["name"] == algorithm
                assert all(cfg[k.split(".")[0]][k.split(".")[1]] == x for k, x in point.items()), point
                for key in ("rounds", "fraction", "local_epochs", "batch_size"):
                    assert cfg["train"][key] == row["train"][key], key
                earlier = {k: x for k, x in point.items() if k not in search.named}  # the first search's name
                first = read_back.get(seed, tmp_path / "none") / "runs" / algorithm / _point_run(earlier, seed)
                if any(point[k] != dict(tuned_row.held)[k] for k in search.named):
                    pass  # a point the first search could not name: trained by this search
                elif run.name in search.fresh:  # trained by this search: the first one never tried that point
                    assert seed in search.read and not first.exists()
                elif seed in search.read or (seed in read_back and knob["key"] == "train.lr"):  # read back
                    assert (first / "status.json").exists()
                    _assert_read_back(run, first)
                    compared.add(seed)
                if score is None:
                    status = json.loads((run / "status.json").read_text(encoding="utf-8"))
                    assert status["phase"] == "failed" and "not finite" in status["state"]["error"]
                    continue
                recs = runlog.read_metrics(run / "metrics.jsonl")
                assert [r["round"] for r in recs] == list(range(1, 51)) and all(r["test_acc"] is None for r in recs)
                assert statistics.fmean(r["val_acc"] for r in recs[-5:]) == pytest.approx(score, abs=1e-12)
        means = {v: None if None in sc else statistics.fmean(sc) for v, sc in per_seed.items()}
        assert {v: s for v, s in knob["tried"]} == pytest.approx(means)
        finite = {v: m for v, m in means.items() if m is not None}
        best = _chosen(finite)
        assert tuned["algorithms"][algorithm]["chosen"][knob["key"]] == best == knob["best"]
        alone = [_chosen({v: x for v, sc in per_seed.items() if (x := sc[j]) is not None})
                 for j in range(len(search.seeds))]
        chooses = " | ".join(f"**{c:g}**" for c in alone)
        assert f"| {algorithm} | {knob['key']} | alone chooses | {chooses} | **{best:g}** |" in md
        every = {2: "both seeds", 3: "all three seeds", 4: "all four seeds"}[len(search.seeds)]
        said = ", ".join(f"{v:g} (" + (f"diverged on {every}" if all(x is None for x in sc) else
                                       _listed([f"{100 * x:.2f}%" if x is not None else "diverged" for x in sc])) + ")"
                         for v, sc in sorted(per_seed.items()))
        for page, text in pages:
            assert said in text, (page, said)
            chose = f"each seed alone chooses {_listed([f'{c:g}' for c in alone])}"
            assert re.search(re.escape(chose) + r"(?![\d.])", text), (page, chose)  # not "0.9" inside "0.99"
        at[knob["key"]] = best
    assert {d.name for d in runs.iterdir()} == kept  # no other run kept
    assert compared == set(read_back)  # every archive said to hold earlier runs held some
    assert set(search.fresh) <= kept


def test_fedent_against_fedavg_at_the_rate_both_two_seed_searches_chose_is_what_the_page_says(tmp_path: Path) -> None:
    """docs/mnist-cpu/results.md (tenth pass) and docs/results.md compare the two searches at 0.09, seed by seed: the
    gaps are recomputed from both archives' tuned.json (each score is itself recomputed from its run above)."""
    import json

    scores = {}
    for algorithm in ("fedavg", "fedent"):
        pages = _tuning_archive(f"{algorithm}-tune-2seeds-logs.tar.gz", tmp_path / algorithm)
        tuned = json.loads((tmp_path / algorithm / "tuned.json").read_text(encoding="utf-8"))
        scores[algorithm] = dict(tuned["algorithms"][algorithm]["knobs"][0]["per_seed"])[0.09]
    pairs = zip(scores["fedent"], scores["fedavg"], strict=True)
    gap = [f"{100 * (e - a):+.2f}".replace("-", "\u2212") for e, a in pairs]
    drop = {k: f"{100 * (v[0] - v[1]):.2f}" for k, v in scores.items()}
    mnist_cpu, results = (text for _, text in pages)
    assert f"({gap[0]} on seed 0, {gap[1]} on seed 1: two seeds, no interval)" in mnist_cpu
    assert f"{drop['fedent']} points below the first for FedEnt and {drop['fedavg']} for FedAvg" in mnist_cpu
    assert f"at 0.09 FedEnt is {gap[0]} and {gap[1]} points from FedAvg on seeds 0 and 1, no interval" in results


def _point_dir(values: dict[str, float]) -> str:
    """A tuning point's run directory (``fedent tune``'s naming: the knobs' last names and values, sorted)."""
    return "_".join(f"{k.split('.')[-1]}{v:.6g}" for k, v in sorted(values.items())) + "-s0"


def _row_config(row: str, out: Path, folder: str = "mnist-cpu", setting: str = "pathological") -> dict[str, Any]:
    """The config of ``row``, seed 0, that a search of FOLDER tunes for: the mnist profile's (the real-MNIST row) or
    the `full` profile's on a twin (docs/full-cpu; the pathological unless ``setting`` names another)."""
    from fedent.experiments.plan import build_plan
    from fedent.experiments.profiles import get_profile

    if folder == "full-cpu":
        plan = build_plan(get_profile("full"), [0], out, ROOT / "configs", rows=[row], settings=[setting],
                          overrides=["train.local_eval=0"])
    else:
        plan = build_plan(get_profile("mnist"), [0], out, ROOT / "configs", rows=[row])
    (spec,) = plan.runs
    return dict(spec.config)


def _check_search(runs: Path, knobs: list[dict[str, Any]], chosen: dict[str, float], row: Mapping[str, Any]
                  ) -> tuple[dict[str, float], set[str], dict[str, str]]:
    """One algorithm's coordinate search as tuned.json records it (``knobs``, in order; ``chosen``: the config's value
    of each knob before it is tuned): every point's run is the one its values name and trained those values on the
    validation split with the test set sealed, on the problem of ``row`` (a profile row's config: data, model,
    rounds, sampling, local training; the validation split and data root aside); each score is recomputed from its
    run (mean validation accuracy of the last 5 of 50 rounds), a diverged point failed on a non-finite model, and
    each knob's best is the best finite score, bracketed exactly when tuned.json says so. Returns the values chosen,
    the run directories, and each knob's tried values as the pages quote them ("0.01 (97.35%), 0.27 (diverged in
    round 1)")."""
    import json
    import statistics

    import yaml

    from fedent import runlog

    chosen, names, texts = dict(chosen), set(), {}
    for knob in knobs:
        said = []
        for value, score in knob["tried"]:
            point = {**chosen, knob["key"]: value}
            run = runs / _point_dir(point)
            names.add(run.name)
            cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
            status = json.loads((run / "status.json").read_text(encoding="utf-8"))
            for key, want in point.items():
                part, name = key.split(".")
                assert cfg[part][name] == want, (run.name, key)
            assert cfg["train"]["evaluate_test"] is False and cfg["data"]["validation_fraction"] == 0.1
            assert status["state"]["evaluation"] == "sealed"
            for part in ("data", "model"):
                want = {k: v for k, v in row[part].items() if k not in ("root", "validation_fraction")}
                assert {k: cfg[part][k] for k in want} == want, (run.name, part)
            for key in ("rounds", "fraction", "local_epochs", "batch_size", "seed"):  # tf32: a no-op on CPU
                assert cfg["train"][key] == row["train"][key], (run.name, key)
            if score is None:
                assert status["phase"] == "failed" and "not finite" in status["state"]["error"]
                said.append(f"{value:g} (diverged in round {status['round']})")
                continue
            recs = runlog.read_metrics(run / "metrics.jsonl")
            assert len(recs) == 50 and all(r["test_acc"] is None for r in recs)  # the test set was never evaluated
            assert statistics.fmean(r["val_acc"] for r in recs[-5:]) == pytest.approx(score, abs=1e-12)
            said.append(f"{value:g} ({100 * score:.2f}%)")
        scores = [s for _, s in knob["tried"]]
        at = scores.index(max(s for s in scores if s is not None))
        assert knob["tuned"] and knob["best"] == knob["tried"][at][0]
        assert knob["bracketed"] == (0 < at < len(scores) - 1)
        chosen[knob["key"]] = knob["best"]
        texts[knob["key"]] = ", ".join(said)
    return chosen, names, texts


def _fedent_search(name: str, first: str, into: Path, folder: str = "mnist-cpu"
                   ) -> tuple[list[tuple[Path, str]], dict[str, Any], dict[str, Any]]:
    """A FedEnt-only search of seed 0 (archive NAME) and the earlier search it read runs back from (FIRST), both
    unpacked under ``into`` ("tune", "first"): the pages quoting NAME, its FedEnt entry and FIRST's tuned.json."""
    import json

    pages = _tuning_archive(name, into / "tune", folder)
    _tuning_archive(first, into / "first", folder)
    tuned = json.loads((into / "tune" / "tuned.json").read_text(encoding="utf-8"))
    earlier = json.loads((into / "first" / "tuned.json").read_text(encoding="utf-8"))
    assert list(tuned["algorithms"]) == ["fedent"]
    assert tuned["seeds"] == [0] and tuned["validation_fraction"] == 0.1 and tuned["tail_k"] == 5
    return pages, tuned["algorithms"]["fedent"], earlier


def test_fedents_full_search_on_real_mnist_is_what_its_kept_runs_score(tmp_path: Path) -> None:
    """docs/mnist-cpu/results.md and docs/results.md: FedEnt's knobs searched in turn on the real-MNIST row (base rate,
    then β at the chosen rate, then γ at both chosen), seed 0, validation split, test set sealed. Every point's run
    is the one its values name, each score is recomputed from its run, each knob's best is the best finite score,
    bracketed where tuned.json says so (else at the domain's edge), the base rate's points are the first search's
    runs with the same scores, no other run is kept, the pages quote every tried β and γ value, and the mechanism
    (η* and the logged rates over every solve of each β run) and score gaps the page gives are the runs'."""
    import statistics

    from fedent import runlog

    pages, fedent, first = _fedent_search("fedent-tune-logs.tar.gz", "tune-logs.tar.gz", tmp_path)
    knobs = fedent["knobs"]
    assert [(k["key"], k["tuned"]) for k in knobs] == [(k, True) for k in ("train.lr", "algorithm.beta",
                                                                              "algorithm.gamma")]
    assert knobs[0]["tried"] == first["algorithms"]["fedent"]["knobs"][0]["tried"]  # the same runs, read back

    runs = tmp_path / "tune" / "runs" / "fedent"
    # the paper's values until their knob is tuned
    chosen, names, texts = _check_search(runs, knobs, {"algorithm.beta": 0.99, "algorithm.gamma": 0.99},
                                         _row_config("fedent", tmp_path / "plan"))
    for knob in knobs:
        if not knob["bracketed"]:  # at an edge: the next step would leave (0, 1)
            assert "domain" in knob["why"] and knob["best"] == 0.9, knob
    assert fedent["chosen"] == chosen and fedent["runs"] == len(names)
    assert {d.name for d in runs.iterdir()} == names  # no other run kept
    for page, text in pages:
        for key in ("algorithm.beta", "algorithm.gamma"):
            assert texts[key] in text, (page, key, texts[key])

    # the mechanism the page gives for β (every solve of each β run) and the score gaps it quotes
    def solves(beta: float) -> tuple[list[float], list[float]]:
        recs = runlog.read_metrics(runs / _point_dir({"train.lr": 0.09, "algorithm.beta": beta,
                                                       "algorithm.gamma": 0.99}) / "metrics.jsonl")
        got = [c for r in recs for c in r["fedent"]["clients"]]
        return [c["eta_star"] for c in got], [c["eta"] for c in got]

    cap = {b: (statistics.median(solves(b)[0]), sum(e >= 1.0 for e in solves(b)[0]) / len(solves(b)[0]))
           for b in (0.9, 0.99, 0.999)}
    rates = {b: (min(solves(b)[1]), max(solves(b)[1])) for b in (0.9, 0.99, 0.999)}
    said = [f"at β = 0.9 η*'s median was {cap[0.9][0]:.4f} and never at the cap (logged rates "
            f"{rates[0.9][0]:.3f}–{rates[0.9][1]:.3f}",
            f"at 0.99 {cap[0.99][0]:.4f} and at the cap in {100 * cap[0.99][1]:.1f}% (rates "
            f"{rates[0.99][0]:.3f}–{rates[0.99][1]:.3f})",
            f"in {100 * cap[0.999][1]:.1f}% of its {len(solves(0.999)[0])} solves (rates up to {rates[0.999][1]:.3f}"]
    assert cap[0.9][1] == 0
    scores = {(k["key"], v): sc for k in knobs for v, sc in k["tried"]}
    best = scores["algorithm.gamma", 0.99]
    gaps = sorted(100 * (best - scores["algorithm.gamma", g]) for g in (0.999, 0.9999))
    said += [f"it scored {100 * (best - scores['algorithm.beta', 0.9]):.2f} points lower",
             f"scores {gaps[0]:.2f}–{gaps[1]:.2f} points"]
    text = pages[0][1].replace("\n", " ")
    for phrase in said:
        assert phrase in text, phrase


@dataclass(frozen=True)
class BaselineSearch:
    """A baseline's search on the real-MNIST row: the archive under docs/mnist-cpu/results/ that keeps it, each knob
    after the rate at the config's (the paper's) value until its turn, and the name the pages give it."""

    archive: str
    held: dict[str, float]
    name: str


BASELINE_SEARCHES = {"feddyn": BaselineSearch("baselines-tune-logs.tar.gz", {"algorithm.alpha": 0.001}, "FedDyn"),
                     "fedadam": BaselineSearch("baselines-tune-logs.tar.gz", {"algorithm.server_lr": 0.01},
                                               "FedAdam"),
                     "fedprox": BaselineSearch("fedprox-tune-logs.tar.gz", {"algorithm.mu": 0.01}, "FedProx"),
                     "fedcos": BaselineSearch("cosnorm-tune-logs.tar.gz", {}, "FedCos"),
                     "fednorm": BaselineSearch("cosnorm-tune-logs.tar.gz", {}, "FedNorm")}


def _baseline_searches(into: Path) -> tuple[list[tuple[Path, str]], dict[str, Path]]:
    """Each archive of BASELINE_SEARCHES unpacked under ``into`` (after checking the page states its sha256): the
    pages that quote them, as ``_tuning_archive`` gives them, and each algorithm's unpacked search."""
    pages: list[tuple[Path, str]] = []
    searches: dict[str, Path] = {}
    for archive in sorted({s.archive for s in BASELINE_SEARCHES.values()}):
        pages = _tuning_archive(archive, into / archive.split(".")[0])
        searches |= {a: into / archive.split(".")[0] for a, s in BASELINE_SEARCHES.items() if s.archive == archive}
    return pages, searches


def test_the_baselines_searches_on_real_mnist_are_what_their_kept_runs_score(tmp_path: Path) -> None:
    """docs/mnist-cpu/results.md and docs/results.md: FedDyn's, FedAdam's and FedProx's knobs searched in turn on the
    real-MNIST row (rate, then FedDyn's α, FedAdam's server rate or FedProx's μ at the chosen rate), and FedCos's and
    FedNorm's rate (their only knob `fedent tune` searches; FedNorm's β and γ held at the config's), seed 0, the
    validation split, test set sealed, by the same search as FedAvg's and FedEnt's. Every point's run is the one its
    values name, on the row's problem; scores, choices and brackets are recomputed from the runs; each archive holds
    its algorithms' runs and no other; the pages quote every tried value, and the gaps they give to the tuned
    FedAvg's and FedEnt's validation scores (the other two archives) are the kept scores'."""
    import json

    pages, searches = _baseline_searches(tmp_path)
    _tuning_archive("tune-logs.tar.gz", tmp_path / "avg")
    _tuning_archive("fedent-tune-logs.tar.gz", tmp_path / "ent")
    best = {}
    for into in sorted(set(searches.values())):
        tuned = json.loads((into / "tuned.json").read_text(encoding="utf-8"))
        mine = sorted(a for a, d in searches.items() if d == into)
        assert sorted(tuned["algorithms"]) == mine
        assert tuned["seeds"] == [0] and tuned["validation_fraction"] == 0.1 and tuned["tail_k"] == 5
        assert {d.name for d in (into / "runs").iterdir()} == set(mine)
        for algorithm in mine:
            search = BASELINE_SEARCHES[algorithm]
            got = tuned["algorithms"][algorithm]
            knobs = got["knobs"]
            assert [k["key"] for k in knobs] == ["train.lr", *search.held]  # every knob, the rate first
            runs = into / "runs" / algorithm
            chosen, names, texts = _check_search(runs, knobs, search.held,
                                                 _row_config(algorithm, tmp_path / "plan"))
            assert got["chosen"] == chosen and got["runs"] == len(names)
            assert {d.name for d in runs.iterdir()} == names  # no other run kept
            for knob in knobs:
                assert knob["bracketed"], knob  # each optimum has a worse (or diverged) value on either side
            for page, text in pages:
                for key, said in texts.items():
                    assert said in text, (page, algorithm, key, said)
            best[search.name] = max(s for k in knobs for _, s in k["tried"] if s is not None)
    avg = json.loads((tmp_path / "avg" / "tuned.json").read_text(encoding="utf-8"))["algorithms"]["fedavg"]
    ent = json.loads((tmp_path / "ent" / "tuned.json").read_text(encoding="utf-8"))["algorithms"]["fedent"]
    best["FedAvg"] = max(s for _, s in avg["knobs"][0]["tried"] if s is not None)
    best["FedEnt"] = max(s for k in ent["knobs"] for _, s in k["tried"] if s is not None)
    phrases = [f"FedAdam {100 * best['FedAdam']:.2f}%, FedDyn {100 * best['FedDyn']:.2f}%, FedAvg "
                f"{100 * best['FedAvg']:.2f}%, FedEnt {100 * best['FedEnt']:.2f}%",
                f"FedAdam +{100 * (best['FedAdam'] - best['FedEnt']):.2f} and FedDyn "
                f"+{100 * (best['FedDyn'] - best['FedEnt']):.2f} points above FedEnt",
                f"FedProx {100 * best['FedProx']:.2f}% ({100 * (best['FedProx'] - best['FedAvg']):+.2f} points from "
                f"FedAvg's, {100 * (best['FedProx'] - best['FedEnt']):+.2f} from FedEnt's)".replace("-", "−"),
                *(f"{name} {100 * best[name]:.2f}% ({100 * (best[name] - best['FedAvg']):+.2f} points from FedAvg's, "
                  f"{100 * (best[name] - best['FedEnt']):+.2f} from FedEnt's)".replace("-", "−")
                  for name in ("FedCos", "FedNorm"))]
    for page, text in pages:
        for phrase in phrases:
            assert phrase in text.replace("\n", " "), (page, phrase)


# The profile rows that read the baselines' chosen values on the test set, 3 seeds (docs/mnist-cpu's run logs).
BASELINE_ROWS = {"fedadam": "fedadam-lr3", "feddyn": "feddyn-lr9-alpha0.01", "fedprox": "fedprox-lr9-mu0.0001",
                 "fedcos": "fedcos-lr9", "fednorm": "fednorm-lr9"}
# Rows at the point a later search chose where that differs from the first search's (row -> its algorithm, that
# search's archive): FedAdam's rate on two tuning seeds, then its τ (searched after the rate and server rate).
LATER_SEARCH_ROWS = {"fedadam-lr9": ("fedadam", "fedadam-knobs-tune-2seeds-logs.tar.gz"),
                     "fedadam-lr9-tau0.0001": ("fedadam", "fedadam-tau-tune-3seeds-logs.tar.gz")}
# Rows at the value most tuning seeds alone chose for one knob where their mean chose another (row -> its algorithm,
# the search's archive, the knob): the value the seeds' mean leaves undecided, tested too.
SEED_MAJORITY_ROWS = {"fedent-lr9-gamma0.999": ("fedent", "dynent-tune-3seeds-logs.tar.gz", "algorithm.gamma")}


def _seed_majority(knob: dict[str, Any]) -> float:
    """The value most tuning seeds alone choose among a knob's tried values (tuned.json's ``per_seed``)."""
    per_seed = [(v, scores) for v, scores in knob["per_seed"]]
    choices = []
    for j in range(len(per_seed[0][1])):
        ok = {v: scores[j] for v, scores in per_seed if scores[j] is not None}
        choices.append(_chosen(ok))
    return max(set(choices), key=choices.count)


def test_the_baselines_test_rows_train_their_searches_choices_and_started_after_them(tmp_path: Path) -> None:
    """docs/mnist-cpu/results.md: each baseline's test-set row is the values its search chose (every knob of tuned.json,
    on the row's problem; ``fedadam-lr9``: the two-seed search's; ``fedadam-lr9-tau0.0001``: the τ search's;
    ``fedent-lr9-gamma0.999``: γ at the value two of three
    tuning seeds chose, not their mean's), each of its 3 runs trained at them to round 50, and
    every process that trained its rounds started after that algorithm's last tuning run ended: status.json's start for
    the last process, the provenance's ``started_at`` for each earlier one that records it, and for an earlier one that
    predates ``started_at`` (runs resumed across sessions) the commit time of the code it ran, which it cannot have run
    before; the page names those processes with their rounds and commits."""
    import json
    import subprocess

    import yaml

    from fedent import runlog

    def committed(commit: str) -> float:
        out = subprocess.run(["git", "show", "-s", "--format=%ct", commit], cwd=ROOT, capture_output=True,
                             text=True, check=True)
        return float(out.stdout.strip())

    pages, searches = _baseline_searches(tmp_path)
    with tarfile.open(ROOT / "docs" / "mnist-cpu" / "results" / "run-logs.tar.gz") as tar:
        tar.extractall(tmp_path / "study", filter="data")
    page = pages[0][1].replace("\n", " ")

    def end(label: str, seed: int) -> float:
        recs = runlog.read_metrics(tmp_path / "study" / "runs" / "mnist-pathological" / f"{label}-s{seed}" /
                                   "metrics.jsonl")
        return 100 * sum(r["test_acc"] for r in recs[-5:]) / 5

    rows = [(algorithm, label, searches[algorithm], "") for algorithm, label in BASELINE_ROWS.items()]
    for label, (algorithm, archive) in LATER_SEARCH_ROWS.items():
        _tuning_archive(archive, tmp_path / label)
        rows.append((algorithm, label, tmp_path / label, ""))
    for label, (algorithm, archive, knob) in SEED_MAJORITY_ROWS.items():
        _tuning_archive(archive, tmp_path / label)
        rows.append((algorithm, label, tmp_path / label, knob))
    leads: dict[str, str] = {}
    for algorithm, label, search, by_seeds in rows:
        tuned = json.loads((search / "tuned.json").read_text(encoding="utf-8"))
        chosen = dict(tuned["algorithms"][algorithm]["chosen"])
        if by_seeds:  # that knob at the seeds' majority, which is not the mean's choice
            majority = _seed_majority(next(k for k in tuned["algorithms"][algorithm]["knobs"] if k["key"] == by_seeds))
            assert majority != chosen[by_seeds], (label, majority)
            chosen[by_seeds] = majority
        ended = max(json.loads(s.read_text(encoding="utf-8"))["updated_at"]
                    for s in (search / "runs" / algorithm).glob("*/status.json"))
        tuning = yaml.safe_load(next((search / "runs" / algorithm).glob("*/config.yaml")).read_text(encoding="utf-8"))
        unrecorded = []
        for seed in (0, 1, 2):
            run = tmp_path / "study" / "runs" / "mnist-pathological" / f"{label}-s{seed}"
            cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
            for key, value in chosen.items():
                part, name = key.split(".")
                assert cfg[part][name] == pytest.approx(value), (run.name, key)
            assert cfg["train"]["seed"] == seed and cfg["train"]["rounds"] == 50
            for key in ("beta1", "beta2", "tau"):  # FedAdam's knobs its search did not tune: as in the search
                if f"algorithm.{key}" not in chosen:
                    assert cfg["algorithm"].get(key) == tuning["algorithm"].get(key), (run.name, key)
            assert cfg["model"] == tuning["model"] and cfg["data"]["partition"] == tuning["data"]["partition"]
            assert [r["round"] for r in runlog.read_metrics(run / "metrics.jsonl")] == list(range(1, 51))
            status = json.loads((run / "status.json").read_text(encoding="utf-8"))
            assert status["phase"] == "done" and status["started_at"] > ended, run.name
            prov = json.loads((run / "provenance.json").read_text(encoding="utf-8"))
            earlier = prov.get("earlier", [])
            # the processes' rounds tile 1..50: each earlier one up to the next's first round
            firsts = [e["rounds"][0] for e in earlier] + [prov.get("from_round", 1)]
            assert firsts[0] == 1 and all(e["rounds"][1] + 1 == nxt
                                          for e, nxt in zip(earlier, firsts[1:], strict=True))
            for e in earlier:
                if "started_at" in e:
                    assert e["started_at"] > ended, (run.name, e["rounds"])
                else:
                    assert committed(e["commit"]) > ended, (run.name, e["rounds"], e["commit"])
                    unrecorded.append("rounds {}–{} at {}".format(*e["rounds"], e["commit"][:7]))
        if unrecorded:
            said = f"`{label}`: {', '.join(unrecorded)} (seeds 0, 1, 2)"
            assert len(unrecorded) == 3 and said in page, said
        leads[label] = ", ".join(f"{end(label, seed) - end('fedent-lr9', seed):+.2f}" for seed in (0, 1, 2))
    # the per-seed leads over the tuned FedEnt the page quotes (end point: mean test accuracy of the last 5 rounds)
    assert f"is {leads['fedadam-lr3']} (FedAdam) and {leads['feddyn-lr9-alpha0.01']} (FedDyn) on seeds 0, 1, 2" in page
    for name, label in (("FedProx", "fedprox-lr9-mu0.0001"), ("FedCos", "fedcos-lr9"), ("FedNorm", "fednorm-lr9"),
                        ("`fedadam-lr9`", "fedadam-lr9"), ("`fedent-lr9-gamma0.999`", "fedent-lr9-gamma0.999"),
                        ("`fedadam-lr9-tau0.0001`", "fedadam-lr9-tau0.0001")):
        said = f"{name}'s end point against `fedent-lr9` is {leads[label].replace('-', '−')} on seeds 0, 1, 2"
        assert said in page, leads


def _mechanism_rows(page: Path, heading: str | None = None) -> dict[str, dict[str, str]]:
    """Each run's cells by column name (``η* = 0``, ``mean η, first round``, ``max η``, ...) from a page's
    generated mechanism tables; with ``heading`` (a setting's bold line), that setting's alone."""
    block = _generated(page.read_text(encoding="utf-8"))
    if heading is not None:
        block = block.split(heading, 1)[1].split("\n**", 1)[0]
    rows: dict[str, dict[str, str]] = {}
    for table in block.split("| run | solves |")[1:]:
        header = ["run", "solves", *(c.strip() for c in table.split("\n", 1)[0].strip().strip("|").split("|"))]
        for line in table.split("\n")[2:]:
            if not line.startswith("| "):
                break
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def test_the_rates_first_and_last_round_means_quoted_in_prose_are_a_mechanism_table_row() -> None:
    """Every "A in round 1 and/to B in round 50" the real-MNIST discussions quote is one run's θ-weighted mean rate in
    its first and last round, as a generated mechanism table prints it (a sentence once quoted a run's largest rate
    as its last round's mean)."""
    rows = {**_mechanism_rows(ROOT / "docs" / "mnist" / "results.md"),
            **_mechanism_rows(ROOT / "docs" / "mnist-cpu" / "results.md")}
    pairs = {(r["mean η, first round"], r["mean η, last round"]) for r in rows.values()}
    quoted = []
    for page in (ROOT / "docs" / "results.md", ROOT / "docs" / "mnist-cpu" / "results.md"):
        text = re.sub(r"\s*\n\s*", " ", page.read_text(encoding="utf-8"))
        for m in re.finditer(r"(\d\.\d+) in round 1 (?:and|to) (\d\.\d+) in round 50", text):
            assert (m[1], m[2]) in pairs, (page.name, m[0], sorted(pairs))
            quoted.append(m[0])
    assert len(quoted) >= 5, quoted  # fedent, fedent-lr9 and fedent-lr9-gamma0.999, on both pages


def _main_rows(page: Path, heading: str) -> dict[str, list[str]]:
    """Each row's cells in the page's first generated table after ``heading`` (a setting's bold line) whose header
    starts with ``| row |``: the accuracy table; ``_paired_rows`` takes the one after it."""
    block = _generated(page.read_text(encoding="utf-8")).split(heading, 1)[1]
    return _table_after(block, 1)


def _paired_rows(page: Path, heading: str) -> dict[str, list[str]]:
    return _table_after(_generated(page.read_text(encoding="utf-8")).split(heading, 1)[1], 2)


def _table_after(block: str, nth: int) -> dict[str, list[str]]:
    table = block.split("\n| row |", nth)[nth].split("\n\n", 1)[0]
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip().strip("|").split("|")]
                                          for line in table.splitlines()[2:])}


def test_the_cpu_twin_replicates_the_unkept_h100_seed_as_its_page_says() -> None:
    """docs/full-cpu/seed0/results.md: seed 0 of the pathological twin retrained on the CPU (logs kept) against the
    `full` page's H100 seed 0 (logs lost): the finals within 0.02 points, FedEnt's mechanism row and the end points
    as quoted, both pages' figures quoted as their tables print them."""
    heading = "**MNIST-CNN, pathological, 20% of 100**"
    cpu_page, h100_page = ROOT / "docs" / "full-cpu" / "seed0" / "results.md", ROOT / "docs" / "full" / "results.md"
    cpu, h100 = _main_rows(cpu_page, heading), _main_rows(h100_page, heading)
    text = re.sub(r"\s*\n\s*", " ", cpu_page.read_text(encoding="utf-8"))
    final = {row: (float(cpu[row][1].split()[0]), float(h100[row][1].split()[0])) for row in ("fedavg", "fedent")}
    assert all(abs(a - b) <= 0.02 for a, b in final.values()), final
    (avg_cpu, avg_h100), (ent_cpu, ent_h100) = final["fedavg"], final["fedent"]
    assert (f"ended FedAvg at {avg_h100:.2f}% and FedEnt at {ent_h100:.2f}%; here, in float32 on another machine, "
            f"{avg_cpu:.2f}% and {ent_cpu:.2f}%") in text
    assert "agrees with them to 0.02 points" in text

    m_cpu, m_h100 = (_mechanism_rows(page, heading)["fedent"] for page in (cpu_page, h100_page))
    zero, cap, first, last, top = "η* = 0", "η* at cap", "mean η, first round", "mean η, last round", "max η"
    assert m_cpu["solves"] == m_h100["solves"] == "1000"
    assert (f"η* = 0 in {m_cpu[zero]} of the 1,000 solves (H100 {m_h100[zero]}), at the cap in {m_cpu[cap]} "
            f"({m_h100[cap]})") in text
    assert (m_cpu[first], m_cpu[last]) == (m_h100[first], m_h100[last])  # the θ-weighted mean rates: the same
    assert f"{m_cpu[first]} in round 1 and {m_cpu[last]} in round 50 (the same on the H100)" in text
    assert f"the largest rate {m_cpu[top]} ({m_h100[top]})" in text
    paired = _paired_rows(cpu_page, heading)
    ends = {row: paired[row][1].split()[0] for row in ("fedavg", "fedent")}
    delta = paired["fedavg"][2].split()[0].replace("-", "−")
    said = f"end point (the mean of the last 5 rounds) {ends['fedent']}% against {ends['fedavg']}%, {delta} points"
    assert said in text
    to_target = {row: cpu[row][3].split()[0] for row in ("fedavg", "fedent")}
    assert f"({float(to_target['fedent']):.0f} against {float(to_target['fedavg']):.0f})" in text


@dataclass(frozen=True)
class ThreeSeeds:
    """One setting of docs/full-cpu/results.md as its tables and kept logs give it (FedAvg against FedEnt)."""

    text: str  # the page's prose, lines joined
    seed0: str  # the seed-0 page's prose, lines joined
    main: dict[str, list[str]]
    paired: dict[str, list[str]]
    mechanism: dict[str, str]
    ends: dict[str, str]  # end points as the paired table prints them
    interval: str  # FedAvg − FedEnt, "mean [lo, hi]", as printed
    diffs: list[float]  # FedAvg − FedEnt per seed (points), read from the archive's logs


def _joined(path: Path) -> str:
    return re.sub(r"\s*\n\s*", " ", path.read_text(encoding="utf-8"))


def _three_seeds(tmp_path: Path, heading: str, setting: str) -> ThreeSeeds:
    from fedent.experiments import pair_runs

    page = ROOT / "docs" / "full-cpu" / "results.md"
    paired = _paired_rows(page, heading)
    assert "seeds 0, 1, 2;" in _generated(page.read_text(encoding="utf-8")).split(heading, 1)[1].split("\n", 1)[0]
    delta = paired["fedavg"][2]
    assert delta.endswith("(n = 3)"), delta
    with tarfile.open(page.parent / "results" / "run-logs.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    runs = tmp_path / "runs" / setting
    avg, ent = (pair_runs.end_points(pair_runs.runs_of(runs, r), 5) for r in ("fedavg", "fedent"))
    return ThreeSeeds(_joined(page), _joined(page.parent / "seed0" / "results.md"), _main_rows(page, heading), paired,
                      _mechanism_rows(page, heading)["fedent"],
                      {row: paired[row][1].split()[0] for row in ("fedavg", "fedent")}, delta.removesuffix(" (n = 3)"),
                      [100 * (avg[s] - ent[s]) for s in (0, 1, 2)])  # type: ignore[operator]


def test_the_cpu_twins_three_seeds_say_what_their_tables_and_logs_show(tmp_path: Path) -> None:
    """docs/full-cpu/results.md (3 seeds of the pathological twin, FedAvg and FedEnt at the paper's values): the
    paired end points and their interval, each seed's difference ("on each of the 3 seeds", read from the kept logs),
    the finals, rounds to target and the pooled mechanism figures as the page's tables print them; the seed-0 page
    quotes the same interval."""
    t = _three_seeds(tmp_path, "**MNIST-CNN, pathological, 20% of 100**", "pathological")
    text, paired, m = t.text, t.paired, t.mechanism
    interval = t.interval.replace("-", "−")
    assert (f"end point (the mean of the last 5 rounds) {t.ends['fedent']}% against {t.ends['fedavg']}%, "
            f"{interval.split(' [')[0]} points for FedAvg [{interval.split(' [')[1]}") in text
    assert all(d < 0 for d in t.diffs)  # "FedEnt ends above FedAvg on each of the 3 seeds"
    assert "seed by seed " + ", ".join(f"{d:.2f}".replace("-", "−") for d in t.diffs[:2]) + \
        f" and {t.diffs[2]:.2f}".replace("-", "−") in text
    assert "FedEnt ends above FedAvg on each of the 3 seeds" in text
    assert f"Finals {t.main['fedent'][1]}% against {t.main['fedavg'][1]}%" in text
    reach = paired["fedavg"][3].removesuffix(" (n = 3)")
    lo, hi = (float(v) for v in reach.split("[")[1].rstrip("]").split(","))
    assert lo < 0 < hi and f"show no difference ({reach.replace('-', '−')} rounds for FedAvg)" in text
    assert m["solves"] == "3000"
    assert (f"η* = 0 in {m['η* = 0']} of the 3,000 solves and at the cap in {m['η* at cap']}; the θ-weighted mean "
            f"used rate {m['mean η, first round']} in round 1 and {m['mean η, last round']} in round 50") in text
    logged = m["φ2' error (logged)"]
    assert m["sign rule holds"].startswith("100.0%") and f"within a median {logged} as logged" in text
    assert f"FedAvg ends {interval} points below FedEnt" in t.seed0


def test_the_cpu_twin_replicates_the_unkept_h100_emnist_seed_as_its_page_says() -> None:
    """docs/full-cpu/seed0/results.md, the EMNIST-L twin (α = 1.0): seed 0 of FedAvg and FedEnt retrained on the CPU
    against the `full` page's H100 seed 0: the finals, the bound the page states on their distance, FedEnt's
    mechanism figures and the end points, each as the two pages' tables print them."""
    heading = "**EMNIST-L setting, α_d = 1.0**"
    cpu_page, h100_page = ROOT / "docs" / "full-cpu" / "seed0" / "results.md", ROOT / "docs" / "full" / "results.md"
    cpu, h100 = _main_rows(cpu_page, heading), _main_rows(h100_page, heading)
    text = re.sub(r"\s*\n\s*", " ", cpu_page.read_text(encoding="utf-8"))
    final = {row: (float(cpu[row][1].split()[0]), float(h100[row][1].split()[0])) for row in ("fedavg", "fedent")}
    (avg_cpu, avg_h100), (ent_cpu, ent_h100) = final["fedavg"], final["fedent"]
    assert (f"The H100 run of seed 0 ended FedAvg at {avg_h100:.2f}% and FedEnt at {ent_h100:.2f}%; here "
            f"{avg_cpu:.2f}% and {ent_cpu:.2f}%") in text
    m = re.search(r"the EMNIST-L finals are within (\d+\.\d+) points of the H100's", text)
    assert m, "the page states how close the finals are"
    gap = round(max(abs(a - b) for a, b in final.values()), 2)  # the tables print two decimals
    assert gap <= float(m[1]) < gap + 0.011, (gap, m[1])

    m_cpu, m_h100 = (_mechanism_rows(page, heading)["fedent"] for page in (cpu_page, h100_page))
    zero, cap, first, last, top = "η* = 0", "η* at cap", "mean η, first round", "mean η, last round", "max η"
    assert m_cpu["solves"] == m_h100["solves"] == "1000"
    assert (f"η* = 0 in {m_cpu[zero]} of the 1,000 solves (H100 {m_h100[zero]}), at the cap in {m_cpu[cap]} "
            f"({m_h100[cap]}), the θ-weighted mean rate {m_cpu[first]} in round 1 and {m_cpu[last]} in round 50 "
            f"(H100 {m_h100[first]} and {m_h100[last]}), the largest rate {m_cpu[top]} ({m_h100[top]})") in text
    paired = _paired_rows(cpu_page, heading)
    ends = {row: paired[row][1].split()[0] for row in ("fedavg", "fedent")}
    delta = paired["fedavg"][2].split()[0].replace("-", "−")
    assert (f"EMNIST-L end points (the mean of the last 5 rounds) FedEnt {ends['fedent']}% and FedAvg "
            f"{ends['fedavg']}%, {delta} points for FedAvg") in text


def _assert_emnist_seeds_finals_and_rounds(t: ThreeSeeds) -> None:
    """Each seed's difference (from the logs), the finals and "the same round on every seed", as an EMNIST-L 3-seed
    section quotes them."""
    assert "seed by seed " + ", ".join(f"{d:+.2f}" for d in t.diffs[:2]) + f" and {t.diffs[2]:+.2f}" in t.text
    assert f"Finals {t.main['fedavg'][1]}% against {t.main['fedent'][1]}%" in t.text
    assert t.paired["fedavg"][3] == "+0.0 [+0.0, +0.0] (n = 3)" and "in the same round on every seed" in t.text


def _assert_rate_below_base_and_phi2_quoted(t: ThreeSeeds) -> None:
    """FedEnt's round-mean rate below its base rate in the first and last round, and φ2's logged error quoted."""
    m = t.mechanism
    assert max(float(m["mean η, first round"]), float(m["mean η, last round"])) < float(m["base lr"])
    logged = m["φ2' error (logged)"]
    assert f"within a median {logged} as logged" in t.text


def test_the_emnist_twins_three_seeds_say_what_their_tables_and_logs_show(tmp_path: Path) -> None:
    """docs/full-cpu/results.md, the EMNIST-L twin (α = 1.0, 3 seeds, FedAvg and FedEnt at the paper's values): the
    paired end points and interval, each seed's difference read from the kept logs ("on each of the 3 seeds"), the
    finals, rounds to target and the pooled mechanism figures as the tables print them; the seed-0 page quotes the
    same interval."""
    t = _three_seeds(tmp_path, "**EMNIST-L setting, α_d = 1.0**", "emnist-dir1.0")
    text, m = t.text, t.mechanism
    mean, bounds = t.interval.split(" [")
    assert (f"end point (the mean of the last 5 rounds) {t.ends['fedavg']}% against {t.ends['fedent']}%, {mean} "
            f"points for FedAvg [{bounds}") in text
    lo, hi = (float(v) for v in bounds.rstrip("]").split(","))
    assert 0 < lo < hi  # "FedAvg ends above FedEnt": the interval excludes no difference
    assert all(d > 0 for d in t.diffs) and "FedAvg ends above FedEnt on each of the 3 seeds" in text
    _assert_emnist_seeds_finals_and_rounds(t)
    assert m["solves"] == "3000" and m["η* at cap"] == "0%" and m["sign rule holds"].startswith("100.0%")
    assert (f"η* = 0 in {m['η* = 0']} of the 3,000 solves and never at the cap; the θ-weighted mean used rate "
            f"{m['mean η, first round']} in round 1 and {m['mean η, last round']} in round 50, below the base rate "
            f"{m['base lr']} (largest {m['max η']})") in text
    _assert_rate_below_base_and_phi2_quoted(t)
    assert f"FedAvg ends {t.interval} points above FedEnt" in t.seed0


def test_the_emnist_alpha_half_three_seeds_say_what_their_tables_and_logs_show(tmp_path: Path) -> None:
    """docs/full-cpu/results.md, the EMNIST-L twin at α = 0.5 (3 seeds): the paired end points and an interval that
    spans zero ("no difference shown"), each seed's difference read from the kept logs, the finals, rounds to target
    and the pooled mechanism figures as the tables print them; the seed-0 page quotes the same interval."""
    t = _three_seeds(tmp_path, "**EMNIST-L setting, α_d = 0.5**", "emnist-dir0.5")
    text, m = t.text, t.mechanism
    mean, bounds = t.interval.split(" [")
    lo, hi = (float(v) for v in bounds.rstrip("]").split(","))
    assert lo < 0 < hi and "**No difference shown:**" in text
    assert (f"end point (the mean of the last 5 rounds) {t.ends['fedavg']}% against {t.ends['fedent']}%, {mean} "
            f"points for FedAvg [{bounds.replace('-', '−')}") in text
    _assert_emnist_seeds_finals_and_rounds(t)
    assert m["solves"] == "3000" and m["sign rule holds"].startswith("100.0%")
    assert (f"η* = 0 in {m['η* = 0']} of the 3,000 solves and at the cap in {m['η* at cap']}; the θ-weighted mean "
            f"used rate {m['mean η, first round']} in round 1 and {m['mean η, last round']} in round 50, below the "
            f"base rate {m['base lr']} (largest {m['max η']})") in text
    _assert_rate_below_base_and_phi2_quoted(t)
    assert f"FedAvg ends {t.interval.replace('-', '−')} points from FedEnt" in t.seed0


def test_the_first_emnist_alpha_half_seed_says_what_its_tables_show() -> None:
    """docs/full-cpu/seed0/results.md, the EMNIST-L twin at α = 0.5 (one seed, no H100 counterpart): finals, end
    points, rounds to target and FedEnt's mechanism figures as the tables print them, and "n = 1" said."""
    heading = "**EMNIST-L setting, α_d = 0.5**"
    page = ROOT / "docs" / "full-cpu" / "seed0" / "results.md"
    text = _joined(page)
    main_rows, paired = _main_rows(page, heading), _paired_rows(page, heading)
    m = _mechanism_rows(page, heading)["fedent"]
    final = {row: main_rows[row][1].removesuffix(" (n = 1)") for row in ("fedavg", "fedent")}
    ends = {row: paired[row][1].removesuffix(" (n = 1)") for row in ("fedavg", "fedent")}
    delta = paired["fedavg"][2]
    assert delta.endswith("(n = 1, no interval)"), delta
    assert (f"Finals FedAvg {final['fedavg']}% and FedEnt {final['fedent']}%; end points (the mean of the last 5 "
            f"rounds) {ends['fedavg']}% and {ends['fedent']}%, {delta.split()[0]} points for FedAvg: one seed, no "
            "interval, no difference shown") in text
    reach = {row: float(main_rows[row][3].split()[0]) for row in ("fedavg", "fedent")}
    assert (f"FedEnt reaches the 79% target in round {reach['fedent']:.0f}, FedAvg in round {reach['fedavg']:.0f}"
            in text)
    assert m["solves"] == "1000" and m["sign rule holds"].startswith("100.0%")
    assert (f"η* = 0 in {m['η* = 0']} of the 1,000 solves, at the cap in {m['η* at cap']}, the θ-weighted mean rate "
            f"{m['mean η, first round']} in round 1 and {m['mean η, last round']} in round 50, below the base rate "
            f"{m['base lr']}, the largest rate {m['max η']}") in text
    assert max(float(m["mean η, first round"]), float(m["mean η, last round"])) < float(m["base lr"])


def _a_pathological_control_says_what_its_logs_show(tmp_path: Path, folder: str, row: str) -> tuple[str, Path, dict]:
    """A control page of the pathological twin (docs/full-cpu/FOLDER/results.md, row ROW, 3 seeds): its end point and
    interval against FedEnt as the paired table prints them, "no difference shown" only where that interval spans
    zero, each seed's difference, the pair against FedAvg (above it on each seed) as the kept logs give them, and the
    finals as the accuracy table prints them. Returns the page's joined text, the unpacked runs and ROW's end points."""
    from fedent.experiments import pair_runs
    from fedent.experiments import paired as P

    heading = "**MNIST-CNN, pathological, 20% of 100**"
    page = ROOT / "docs" / "full-cpu" / folder / "results.md"
    text, paired, main_rows = _joined(page), _paired_rows(page, heading), _main_rows(page, heading)
    with tarfile.open(ROOT / "docs" / "full-cpu" / "results" / "run-logs.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    runs = tmp_path / "runs" / "pathological"
    ctl, ent, avg = (pair_runs.end_points(pair_runs.runs_of(runs, r), 5) for r in (row, "fedent", "fedavg"))
    vs_ent, vs_avg = P.paired(ctl, ent), P.paired(ctl, avg)
    assert vs_ent is not None and vs_avg is not None and vs_ent.n == vs_avg.n == 3
    assert paired[row][2] == P.fmt(vs_ent)  # the table's pair is the logs' pair
    assert vs_ent.lo is not None and vs_ent.hi is not None and vs_ent.lo < 0 < vs_ent.hi  # "no difference shown"
    mean, bounds = P.fmt(vs_ent).removesuffix(" (n = 3)").replace("-", "−").split(" [")
    ends = {r: paired[r][1].split()[0] for r in (row, "fedent")}
    assert (f"end point (the mean of the last 5 rounds) {ends[row]}% against FedEnt's "
            f"{ends['fedent']}%, {mean} points [{bounds}") in text and "no difference shown" in text
    d_ent = [f"{100 * (ctl[s] - ent[s]):+.2f}".replace("-", "−") for s in (0, 1, 2)]  # type: ignore[operator]
    d_avg = [100 * (ctl[s] - avg[s]) for s in (0, 1, 2)]  # type: ignore[operator]
    assert f"seed by seed {d_ent[0]}, {d_ent[1]} and {d_ent[2]}" in text
    assert all(d > 0 for d in d_avg) and "above it on each seed (" + ", ".join(f"{d:+.2f}" for d in d_avg) in text
    assert vs_avg.lo is not None and vs_avg.lo > 0 and f"{P.fmt(vs_avg).removesuffix(' (n = 3)')} (n = 3)" in text
    label = next(k for k in main_rows if k.startswith(row))
    assert f"Finals {main_rows[label][1]}% against {main_rows['fedent'][1]}%" in text
    return text, runs, ctl


def test_the_pathological_replay_says_what_its_tables_and_logs_show(tmp_path: Path) -> None:
    """docs/full-cpu/replay/results.md (FedAvg at FedEnt's round-mean rate, 3 seeds): what every control page says
    against FedEnt and FedAvg, and seed 0's final against the H100's."""
    text, runs, _ = _a_pathological_control_says_what_its_logs_show(tmp_path, "replay", "fedavg-replay-mean")
    h100 = _main_rows(ROOT / "docs" / "full" / "results.md", "**MNIST-CNN, pathological, 20% of 100**")
    h100_final = h100[next(k for k in h100 if k.startswith("fedavg-replay-mean"))][1].split()[0]
    cpu_final = f"{100 * _final_acc(runs / 'fedavg-replay-mean-s0'):.2f}"
    assert f"this replay's seed 0 ends at {cpu_final}% (final), the H100's at {h100_final}%" in text


def test_the_pathological_shuffled_control_says_what_its_tables_and_logs_show(tmp_path: Path) -> None:
    """docs/full-cpu/controls/results.md (FedEnt's rates shuffled across a round's clients, 3 seeds): what every
    control page says against FedEnt and FedAvg, the pair against the round-mean replay ("no difference shown"
    only where it spans zero), and the mechanism figures it quotes as its table prints them."""
    from fedent.experiments import pair_runs
    from fedent.experiments import paired as P

    page = ROOT / "docs" / "full-cpu" / "controls" / "results.md"
    text, runs, sh = _a_pathological_control_says_what_its_logs_show(tmp_path, "controls", "fedent-shuffled")
    vs_rm = P.paired(sh, pair_runs.end_points(pair_runs.runs_of(runs, "fedavg-replay-mean"), 5))
    assert vs_rm is not None and vs_rm.n == 3 and vs_rm.lo is not None and vs_rm.hi is not None
    assert vs_rm.lo < 0 < vs_rm.hi
    assert f"{P.fmt(vs_rm).removesuffix(' (n = 3)').replace('-', '−')} from FedAvg at FedEnt's round-mean rate" in text
    m, f = _mechanism_rows(page)["fedent-shuffled"], _mechanism_rows(page)["fedent"]
    assert (f"η* = 0 in {m['η* = 0']} of the {int(m['solves']):,} solves and at the cap in {m['η* at cap']} "
            f"(FedEnt {f['η* = 0']} and {f['η* at cap']})") in text
    assert (f"{m['mean η, first round']} in round 1 and {m['mean η, last round']} in round 50 "
            f"(FedEnt {f['mean η, first round']} and {f['mean η, last round']};") in text


def test_the_pathological_uncapped_control_says_how_each_seed_diverged(tmp_path: Path) -> None:
    """docs/full-cpu/controls/results.md, row fedent-cap-none: the round and clients it names for each seed are the
    ones the archived status.json records, every seed diverged (the table says 3/3) while FedEnt's own runs finished
    all 50 rounds, and the pooled solve figures it quotes are what the mechanism command prints for those logs."""
    from fedent import runlog
    from fedent.experiments import mechanism

    page, text, runs = _pathological_twin_page(tmp_path, "controls")
    main_rows = _main_rows(page, TWIN_HEADING)
    row = next(k for k in main_rows if k.startswith("fedent-cap-none"))
    assert main_rows[row][1] == "diverged (3/3 seeds)"
    said = []
    for seed in (0, 1, 2):
        said.append(_diverged_at(runs / f"fedent-cap-none-s{seed}"))
        assert len(runlog.read_metrics(runs / f"fedent-s{seed}" / "metrics.jsonl")) == 50
    assert f"in {said[0]}, {said[1]} and {said[2]}" in text
    capless = mechanism.solve_stats([runlog.read_metrics(runs / f"fedent-cap-none-s{s}" / "metrics.jsonl")
                                     for s in (0, 1, 2)])
    assert capless is not None
    header, _, line = mechanism.stats_table({"x": capless})
    cells = {k.strip(): v.strip()
             for k, v in zip(header.strip("|").split("|"), line.strip("|").split("|"), strict=True)}
    fedent = _mechanism_rows(page)["fedent"]
    assert (f"Over the {int(cells['solves'])} solves of the {int(cells['solves']) // 20} rounds that finished, η* "
            f"was 0 in {cells['η* = 0']} (FedEnt {fedent['η* = 0']} of its {int(fedent['solves']):,})") in text
    assert cells["η* at cap"] == "0%" and "never at its bound B" in text
    assert (f"the θ-weighted mean rate {cells['mean η, first round']} in round 1 (FedEnt "
            f"{fedent['mean η, first round']}:") in text
    assert f"the largest rate used {cells['max η']}, against FedEnt's {fedent['max η']} over all 50 rounds" in text


@dataclass(frozen=True)
class TwinSearch:
    """A rate search on a twin (docs/full-cpu/tuning.md), its logs in docs/full-cpu/results/ARCHIVE: the page's
    paragraph on it starts with ``label``; ``held``: knobs not tuned, at the config's value; ``setting``: the `full`
    profile's setting searched (the pathological twin unless named)."""

    algorithm: str
    archive: str
    label: str
    held: tuple[tuple[str, float], ...] = ()
    setting: str = "pathological"


TWIN_SEARCHES = [TwinSearch("fedavg", "tune-logs.tar.gz", "**FedAvg's rate.**"),
                 TwinSearch("fedent", "fedent-tune-logs.tar.gz", "**FedEnt's base rate.**",
                            (("algorithm.beta", 0.99), ("algorithm.gamma", 0.99))),
                 TwinSearch("fedavg", "emnist-tune-logs.tar.gz", "**FedAvg's rate on the EMNIST-L twin.**",
                            setting="emnist-dir1.0"),
                 TwinSearch("fedent", "emnist-tune-logs.tar.gz", "**FedEnt's base rate on the EMNIST-L twin.**",
                            (("algorithm.beta", 0.99), ("algorithm.gamma", 0.99)), setting="emnist-dir1.0")]


@pytest.mark.parametrize("search", TWIN_SEARCHES,
                         ids=lambda s: s.algorithm + ("" if s.setting == "pathological" else f"-{s.setting}"))
def test_a_rate_searched_on_a_twin_is_what_its_kept_runs_score(tmp_path: Path, search: TwinSearch) -> None:
    """docs/full-cpu/tuning.md: ``fedent tune`` searched a rate on a validation split of a twin (the pathological or
    the EMNIST-L) with the test set sealed. The page states the archive's sha256; each tried rate's score is
    recomputed from its kept run (mean validation accuracy of the last 5 rounds) and quoted as the page quotes it, a
    diverged point failed on
    a non-finite model in the round the page names, the runs are the `full` profile's row of that algorithm on that
    setting (the validation split aside), the knobs not searched stayed at the config's value, and the chosen rate
    and whether the grid brackets it are what the runs give."""
    import json

    from fedent.experiments.plan import build_plan
    from fedent.experiments.profiles import get_profile

    page = ROOT / "docs" / "full-cpu" / "tuning.md"
    archive = ROOT / "docs" / "full-cpu" / "results" / search.archive
    text = _joined(page)
    assert hashlib.sha256(archive.read_bytes()).hexdigest() in page.read_text(encoding="utf-8").replace("\n  ", "")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "tune", filter="data")
    tuned = json.loads((tmp_path / "tune" / "tuned.json").read_text(encoding="utf-8"))
    assert tuned["seeds"] == [0] and tuned["validation_fraction"] == 0.1 and tuned["tail_k"] == 5
    knob, *held = tuned["algorithms"][search.algorithm]["knobs"]
    assert [(k["key"], k["tuned"], k["tried"]) for k in held] == [(k, False, []) for k, _ in search.held]
    tried = sorted(knob["tried"])
    assert knob["key"] == "train.lr" and knob["tuned"] and len(tried) >= 3
    plan = build_plan(get_profile("full"), [0], tmp_path / "plan", ROOT / "configs", rows=[search.algorithm],
                      settings=[search.setting], overrides=["train.local_eval=0"])
    (row,) = plan.runs
    said = []
    for lr, score in tried:
        run = tmp_path / "tune" / "runs" / search.algorithm / _point_run({**dict(search.held), "train.lr": lr}, 0)
        said.append(_a_sealed_search_point(run, search.algorithm, lr, score, row.config, ("local_eval",)))
    finite = [s for _, s in tried if s is not None]
    at = [s for _, s in tried].index(max(finite))
    best = tried[at][0]
    assert tuned["algorithms"][search.algorithm]["chosen"]["train.lr"] == best == knob["best"]
    bracketed = "bracketed" if 0 < at < len(tried) - 1 else "not bracketed"
    paragraph = f"{search.label} Tried (validation accuracy): {', '.join(said)}."
    assert f"{paragraph} The search chose {best:g}, {bracketed}" in text


def test_the_twins_second_tuning_seed_says_what_its_scores_give(tmp_path: Path) -> None:
    """docs/full-cpu/tuning.md, the second tuning seed: the means it quotes for the chosen rate against the other
    point of each search, and FedEnt's gap to FedAvg at that rate on each seed, are tuned.json's, and the claim that
    FedEnt at 0.09 ran 50 rounds on both tuning seeds is the runs' (the test-set run on seed 0 diverged)."""
    import json

    pages = _tuning_archive("tune-2seeds-logs.tar.gz", tmp_path / "two", "full-cpu")
    text = pages[0][1]
    tuned = json.loads((tmp_path / "two" / "tuned.json").read_text(encoding="utf-8"))
    per = {a: dict((v, sc) for v, sc in tuned["algorithms"][a]["knobs"][0]["per_seed"]) for a in ("fedavg", "fedent")}
    for algorithm in ("fedavg", "fedent"):
        mean = _finite_means(per[algorithm])
        assert max(mean, key=mean.__getitem__) == 0.09
        assert f"so does their mean ({100 * mean[0.09]:.2f}% against {100 * mean[0.03]:.2f}%)" in text, algorithm
    gaps = [100 * (e - a) for e, a in zip(per["fedent"][0.09], per["fedavg"][0.09], strict=True)]
    words = [f"{abs(g):.2f} {'above' if g > 0 else 'below'}" for g in gaps]
    assert (f"At 0.09 FedEnt scores {words[0].replace('above', 'points above FedAvg')} on seed 0 and {words[1]} on "
            "seed 1 (two seeds: no interval, no difference shown)") in text
    for seed in (0, 1):
        run = tmp_path / "two" / "runs" / "fedent" / _point_run({"algorithm.beta": 0.99, "algorithm.gamma": 0.99,
                                                                 "train.lr": 0.09}, seed)
        assert json.loads((run / "status.json").read_text(encoding="utf-8"))["phase"] == "done"
    assert "FedEnt at 0.09 ran all 50 rounds on both tuning seeds" in text


def test_fedents_beta_and_gamma_on_the_twins_third_tuning_seed_say_what_the_runs_did(tmp_path: Path) -> None:
    """docs/full-cpu/tuning.md, β and γ on tuning seeds 0, 1 and 2: the means it quotes for each chosen value against
    the runner-up are tuned.json's, seed 2's margins are that seed's scores', each divergence it names (β = 0.999 on
    every seed, γ = 0.9 on seed 2) is the one its run's status.json keeps, and η* at the cap for β = 0.999 on seed 2
    is its run's."""
    import json

    from fedent import runlog

    pages = _tuning_archive("fedent-knobs-tune-3seeds-logs.tar.gz", tmp_path / "three", "full-cpu")
    text = pages[0][1]
    tuned = json.loads((tmp_path / "three" / "tuned.json").read_text(encoding="utf-8"))
    beta, gamma = (dict((v, sc) for v, sc in k["per_seed"]) for k in tuned["algorithms"]["fedent"]["knobs"][1:])
    mb, mg = _finite_means(beta), _finite_means(gamma)
    assert sorted(mb) == [0.9, 0.99] and sorted(mg) == [0.99, 0.999]
    assert max(mb, key=mb.__getitem__) == 0.99 == max(mg, key=mg.__getitem__)
    assert (f"the mean chooses 0.99 ({100 * mb[0.99]:.2f}% against {100 * mb[0.9]:.2f}%), bracketed: seed 2 sides "
            f"with seed 0, by {100 * (beta[0.99][2] - beta[0.9][2]):.2f} points") in text
    assert (f"the mean chooses 0.99 ({100 * mg[0.99]:.2f}% against {100 * mg[0.999]:.2f}%), bracketed: two of the "
            f"three seeds alone would take 0.999, seed 2 by {100 * (gamma[0.999][2] - gamma[0.99][2]):.2f} points, "
            f"and the mean keeps the paper's 0.99 by {100 * (mg[0.99] - mg[0.999]):.2f} points") in text
    assert [g1 > g0 for g0, g1 in zip(gamma[0.99], gamma[0.999], strict=True)] == [False, True, True]
    assert all(0 < m < 0.002 for m in (mb[0.99] - mb[0.9], mg[0.99] - mg[0.999]))  # "each by under 0.2 points"
    runs = tmp_path / "three" / "runs" / "fedent"
    at = {"train.lr": 0.09, "algorithm.beta": 0.99, "algorithm.gamma": 0.99}
    edges = [_diverged_at(runs / _point_run({**at, "algorithm.beta": 0.999}, seed)) for seed in (0, 1, 2)]
    earlier = [re.match(r"round (\d+)", e)[1] for e in edges[:2]]  # type: ignore[index]
    assert f"β = 0.999 diverged on seed 2 in {edges[2]}, where seeds 0 and 1 diverged in rounds {earlier[0]} and " \
        f"{earlier[1]}" in text
    run = runs / _point_run({**at, "algorithm.beta": 0.999}, 2)
    stars = [c["eta_star"] for r in runlog.read_metrics(run / "metrics.jsonl") for c in r["fedent"]["clients"]]
    assert f"η* sat at the cap in {100 * sum(e >= 1.0 for e in stars) / len(stars):.1f}% of its {len(stars)} solves" \
        in text
    assert f"γ = 0.9 diverged in {_diverged_at(runs / _point_run({**at, 'algorithm.gamma': 0.9}, 2))}" in text


def _finite_means(per_seed: dict[float, list[float | None]]) -> dict[float, float]:
    """Each point's mean score over the tuning seeds, for the points that diverged on no seed."""
    return {v: sum(sc) / len(sc) for v, sc in per_seed.items() if None not in sc}  # type: ignore[arg-type]


def _assert_read_back(run: Path, earlier: Path) -> None:
    """A run a search read back from an earlier one: the same files, byte for byte (not trained again)."""
    files = sorted(f.name for f in earlier.iterdir())
    assert files == sorted(f.name for f in run.iterdir()), run.name
    assert all((run / f).read_bytes() == (earlier / f).read_bytes() for f in files), run.name


def _twin_beta_search(archive: str, first: str, setting: str, tmp_path: Path
                      ) -> tuple[list[tuple[Path, str]], list[dict[str, Any]], Path, dict[str, float], dict[str, str]]:
    """FedEnt's base rate and then β searched on a twin's validation split (archive ARCHIVE), γ held at 0.99, its
    base-rate runs read back from the rate search FIRST: the knobs tuned.json records are those, every point's run is
    the one its values name on the `full` profile's FedEnt row of SETTING with each score recomputed
    (``_check_search``), no other run is kept, and the base rate's runs are FIRST's files. Returns the pages, the
    knobs, the runs' folder, the values chosen and each knob's tried values as the pages quote them."""
    pages, fedent, earlier = _fedent_search(archive, first, tmp_path, "full-cpu")
    knobs = fedent["knobs"]
    assert [(k["key"], k["tuned"]) for k in knobs] == [("train.lr", True), ("algorithm.beta", True),
                                                       ("algorithm.gamma", False)]
    assert knobs[2]["tried"] == []
    assert knobs[0]["tried"] == earlier["algorithms"]["fedent"]["knobs"][0]["tried"]  # the same runs, read back
    runs = tmp_path / "tune" / "runs" / "fedent"
    held = {"algorithm.beta": 0.99, "algorithm.gamma": 0.99}
    chosen, names, texts = _check_search(runs, knobs[:2], held,
                                         _row_config("fedent", tmp_path / "plan", "full-cpu", setting))
    assert fedent["chosen"] == chosen and fedent["runs"] == len(names)
    assert {d.name for d in runs.iterdir()} == names  # no other run kept
    for value, _ in knobs[0]["tried"]:  # the base rate's runs: the rate search's files
        name = _point_dir({**held, "train.lr": value})
        _assert_read_back(runs / name, tmp_path / "first" / "runs" / "fedent" / name)
    return pages, knobs, runs, chosen, texts


def test_fedents_beta_searched_on_the_pathological_twin_is_what_its_kept_runs_score(tmp_path: Path) -> None:
    """docs/full-cpu/tuning.md and docs/results.md: FedEnt's base rate and then β at the chosen rate searched on the
    pathological twin's validation split, tuning seed 0, test set sealed, γ held at the paper's 0.99. The base rate's
    points are the first search's runs (read back, files unchanged); every β point's run is the one its values name,
    on the `full` profile's FedEnt row of that setting; each score, the choice and its bracket are recomputed from
    the runs; no other run is kept; the pages quote every tried β; and the mechanism the page gives (η* over every
    solve of each β run, and the rates used) is the runs'."""
    import statistics

    from fedent import runlog

    pages, knobs, runs, chosen, texts = _twin_beta_search("fedent-beta-tune-logs.tar.gz", "fedent-tune-logs.tar.gz",
                                                          "pathological", tmp_path)
    for page, text in pages:
        assert f"Tried for β at base rate {chosen['train.lr']:g} (validation accuracy): {texts['algorithm.beta']}." \
            in text, page
        bracketed = "bracketed" if knobs[1]["bracketed"] else "not bracketed"
        assert f"the search chose β = {chosen['algorithm.beta']:g}, {bracketed}" in text, page

    def solves(beta: float) -> tuple[list[float], list[float]]:
        name = _point_dir({"train.lr": chosen["train.lr"], "algorithm.beta": beta, "algorithm.gamma": 0.99})
        got = [c for r in runlog.read_metrics(runs / name / "metrics.jsonl") for c in r["fedent"]["clients"]]
        return [c["eta_star"] for c in got], [c["eta"] for c in got]

    text = pages[0][1].replace("\n", " ")
    for beta, _ in knobs[1]["tried"]:
        stars, rates = solves(beta)
        at_cap = sum(e >= 1.0 for e in stars) / len(stars)
        said = (f"β = {beta:g}: η*'s median {statistics.median(stars):.4f}, at the cap in {100 * at_cap:.1f}% of "
                f"{len(stars)} solves, rates {min(rates):.3f}–{max(rates):.3f}")
        assert said in text, said

    # β = 0.999 diverged in the round and on the client where the test-set run at β = 0.99 diverged on seed 0
    edge = _diverged_at(runs / _point_dir({"train.lr": chosen["train.lr"], "algorithm.beta": 0.999,
                                           "algorithm.gamma": 0.99}))
    assert _diverged_at(_pathological_twin_page(tmp_path / "twin", "tuned")[2] / "fedent-lr9-s0") == edge
    rnd, who = re.fullmatch(r"round (\d+) \(seed 0, (client \d+)\)", edge).groups()  # type: ignore[union-attr]
    assert (f"the rates climb until {who}'s local model is not finite in round {rnd}: the round and client of the "
            "test-set run at β = 0.99 that diverged on seed 0") in text


@dataclass(frozen=True)
class GammaSearch:
    """FedEnt's γ searched on a twin after its base rate and β (docs/full-cpu/tuning.md): the archive, the β search's
    archive it read its runs back from (``first``, ``earlier`` runs), the `full` profile's setting, and how the pages
    name it (``where`` after "Tried for γ", ``chose`` before "chose γ")."""

    archive: str
    first: str
    setting: str
    earlier: int
    where: str
    chose: str


GAMMA_SEARCHES = [GammaSearch("fedent-knobs-tune-logs.tar.gz", "fedent-beta-tune-logs.tar.gz", "pathological", 5, "",
                              "the search"),
                  GammaSearch("emnist-fedent-knobs-tune-logs.tar.gz", "emnist-fedent-beta-tune-logs.tar.gz",
                              "emnist-dir1.0", 6, " on the EMNIST-L twin", "the EMNIST-L twin's search")]


@pytest.mark.parametrize("search", GAMMA_SEARCHES, ids=lambda g: g.setting)
def test_fedents_gamma_searched_on_a_twin_is_what_its_kept_runs_score(tmp_path: Path, search: GammaSearch) -> None:
    """docs/full-cpu/tuning.md and docs/results.md: FedEnt's γ searched on a twin's validation split (the
    pathological, then the EMNIST-L) at the base rate and β the search chose before, tuning seed 0, test set sealed.
    The base rate's and β's points are the β search's runs (read back, files unchanged, the same scores); every γ
    point's run is the one its values name, on the `full` profile's FedEnt row of that setting; each score, the
    choice and its bracket are recomputed from the runs; no other run is kept; the pages quote every tried γ; and the
    rates and any divergence the page gives are the runs'."""
    from fedent import runlog

    pages, fedent, first = _fedent_search(search.archive, search.first, tmp_path, "full-cpu")
    knobs = fedent["knobs"]
    assert [(k["key"], k["tuned"]) for k in knobs] == [(k, True) for k in ("train.lr", "algorithm.beta",
                                                                              "algorithm.gamma")]
    before = first["algorithms"]["fedent"]["knobs"]
    assert [k["tried"] for k in knobs[:2]] == [k["tried"] for k in before[:2]]  # the same runs, read back
    runs = tmp_path / "tune" / "runs" / "fedent"
    chosen, names, texts = _check_search(runs, knobs, {"algorithm.beta": 0.99, "algorithm.gamma": 0.99},
                                         _row_config("fedent", tmp_path / "plan", "full-cpu", search.setting))
    assert fedent["chosen"] == chosen and fedent["runs"] == len(names)
    assert {d.name for d in runs.iterdir()} == names  # no other run kept
    earlier = sorted((tmp_path / "first" / "runs" / "fedent").iterdir())
    assert len(earlier) == search.earlier
    for run in earlier:
        _assert_read_back(runs / run.name, run)
    lr, beta, gamma = (chosen[k] for k in ("train.lr", "algorithm.beta", "algorithm.gamma"))
    bracketed = "bracketed" if knobs[2]["bracketed"] else "not bracketed"
    for page, text in pages:
        assert (f"Tried for γ{search.where} at base rate {lr:g} and β = {beta:g} (validation accuracy): "
                f"{texts['algorithm.gamma']}.") in text, page
        assert f"{search.chose} chose γ = {gamma:g}, {bracketed}" in text, page

    text = pages[0][1]
    for value, score in knobs[2]["tried"]:
        run = runs / _point_dir({"train.lr": lr, "algorithm.beta": beta, "algorithm.gamma": value})
        rates = [c["eta"] for r in runlog.read_metrics(run / "metrics.jsonl") for c in r["fedent"]["clients"]]
        said = f"γ = {value:g}: rates {min(rates):.3f}–{max(rates):.3f}"
        if score is None:
            said += f" until {_diverged_at(run)}"
        assert said in text, said


def test_fedents_beta_searched_on_the_emnist_twin_is_what_its_kept_runs_score(tmp_path: Path) -> None:
    """docs/full-cpu/tuning.md and docs/results.md: FedEnt's β searched on the EMNIST-L twin's (α = 1.0) validation
    split at the base rate that twin's rate search chose, tuning seed 0, test set sealed, γ held at the paper's 0.99.
    The base rate's points are the rate search's runs (read back, files unchanged); every β point's run is the one
    its values name, on the `full` profile's FedEnt row of that setting; each score, the choice and its bracket are
    recomputed from the runs; no other run is kept; the pages quote every tried β; and η* over every solve of each β
    run, as the page gives it, is the runs'."""
    import statistics

    from fedent import runlog

    pages, knobs, runs, chosen, texts = _twin_beta_search("emnist-fedent-beta-tune-logs.tar.gz",
                                                          "emnist-tune-logs.tar.gz", "emnist-dir1.0", tmp_path)
    held = {"algorithm.beta": 0.99, "algorithm.gamma": 0.99}
    bracketed = "bracketed" if knobs[1]["bracketed"] else "not bracketed"
    for page, text in pages:
        assert (f"Tried for β on the EMNIST-L twin at base rate {chosen['train.lr']:g} (validation accuracy): "
                f"{texts['algorithm.beta']}.") in text, page
        assert f"the EMNIST-L twin's search chose β = {chosen['algorithm.beta']:g}, {bracketed}" in text, page
    text = pages[0][1].replace("\n", " ")
    scores = dict(knobs[1]["tried"])
    assert f"0.9 scores {100 * (scores[0.99] - scores[0.9]):.2f} points below it" in text
    for beta, _ in knobs[1]["tried"]:
        name = _point_dir({**held, "train.lr": chosen["train.lr"], "algorithm.beta": beta})
        got = [c for r in runlog.read_metrics(runs / name / "metrics.jsonl") for c in r["fedent"]["clients"]]
        stars, rates = [c["eta_star"] for c in got], [c["eta"] for c in got]
        at_cap = sum(e >= 1.0 for e in stars) / len(stars)
        said = (f"β = {beta:g}: η*'s median {statistics.median(stars):.4f}, at the cap in {100 * at_cap:.1f}% of "
                f"{len(stars)} solves, rates {min(rates):.3f}–{max(rates):.3f}")
        assert said in text, said


def test_fedents_beta_and_gamma_on_the_twins_second_tuning_seed_say_what_the_runs_did(tmp_path: Path) -> None:
    """docs/full-cpu/tuning.md, β and γ on tuning seeds 0 and 1: the mean it quotes for the chosen β against the
    other finite point is tuned.json's, β's margin on seed 1 alone is that seed's scores', and each divergence it
    names on seed 1 (β = 0.999, γ = 0.9) is the one its run's status.json keeps, next to seed 0's round."""
    import json

    pages = _tuning_archive("fedent-knobs-tune-2seeds-logs.tar.gz", tmp_path / "two", "full-cpu")
    text = pages[0][1]
    tuned = json.loads((tmp_path / "two" / "tuned.json").read_text(encoding="utf-8"))
    beta, gamma = (dict((v, sc) for v, sc in k["per_seed"]) for k in tuned["algorithms"]["fedent"]["knobs"][1:])
    mean = _finite_means(beta)
    assert sorted(mean) == [0.9, 0.99] and max(mean, key=mean.__getitem__) == 0.99
    assert f"the mean chooses 0.99 ({100 * mean[0.99]:.2f}% against {100 * mean[0.9]:.2f}%), bracketed" in text
    edge_by = 100 * (beta[0.9][1] - beta[0.99][1])
    assert f"seed 1 alone would take the grid's lower edge, by {edge_by:.2f} points" in text
    slow = _finite_means(gamma)
    assert sorted(slow) == [0.99, 0.999] and max(slow, key=slow.__getitem__) == 0.99
    assert (f"and the mean chooses 0.99 ({100 * slow[0.99]:.2f}% against {100 * slow[0.999]:.2f}%), bracketed: seed 1 "
            f"alone would take 0.999, by {100 * (gamma[0.999][1] - gamma[0.99][1]):.2f} points") in text
    margins = [mean[0.99] - mean[0.9], slow[0.99] - slow[0.999]]
    assert all(0 < m < 0.003 for m in margins)
    assert ("the paper's β and γ stand on the mean of two seeds, each by under 0.3 points (no interval)"
            in pages[1][1])
    runs = tmp_path / "two" / "runs" / "fedent"
    at = {"train.lr": 0.09, "algorithm.beta": 0.99, "algorithm.gamma": 0.99}
    edge = {s: _diverged_at(runs / _point_run({**at, "algorithm.beta": 0.999}, s)) for s in (0, 1)}
    rounds = {s: int(re.match(r"round (\d+)", e)[1]) for s, e in edge.items()}  # type: ignore[index]
    assert rounds[1] == rounds[0] - 1
    assert f"β = 0.999 diverged on seed 1 too, in {edge[1]}, one round before seed 0's" in text
    fast = {s: _diverged_at(runs / _point_run({**at, "algorithm.gamma": 0.9}, s)) for s in (0, 1)}
    assert gamma[0.9] == [None, None]
    assert f"γ = 0.9 diverged in {fast[1]}, where seed 0's diverged in {fast[0].split(' (')[0]}" in text


@pytest.mark.parametrize(("archive", "algorithm", "held"), [
    ("fedent-tune-3seeds-logs.tar.gz", "fedent", {"algorithm.beta": 0.99, "algorithm.gamma": 0.99}),
    ("fedavg-tune-3seeds-logs.tar.gz", "fedavg", {}),
], ids=["fedent", "fedavg"])
def test_the_twins_third_tuning_seed_says_how_far_each_algorithm_at_its_chosen_rate_ran(
        tmp_path: Path, archive: str, algorithm: str, held: dict[str, float]) -> None:
    """docs/full-cpu/tuning.md, FedEnt's base rate and FedAvg's rate on tuning seeds 0, 1 and 2: the mean it quotes
    for the chosen rate against the other finite point is tuned.json's, and the algorithm at 0.09 ran 50 rounds on
    every tuning seed, as the page says (FedEnt's test-set run on seed 0 diverged)."""
    import json

    pages = _tuning_archive(archive, tmp_path / "three", "full-cpu")
    text = pages[0][1]
    tuned = json.loads((tmp_path / "three" / "tuned.json").read_text(encoding="utf-8"))
    per = dict((v, sc) for v, sc in tuned["algorithms"][algorithm]["knobs"][0]["per_seed"])
    mean = _finite_means(per)
    best = max(mean, key=mean.__getitem__)
    other = min(mean, key=mean.__getitem__)
    assert (best, tuned["algorithms"][algorithm]["chosen"]["train.lr"]) == (0.09, 0.09)
    name = {"fedent": "FedEnt", "fedavg": "FedAvg"}[algorithm]
    (paragraph,) = [p for p in text.split("**") if f"(results/{archive})" in p]  # the one that links the archive
    assert f"the mean chooses {best:g} ({100 * mean[best]:.2f}% against {100 * mean[other]:.2f}%)" in paragraph
    for seed in (0, 1, 2):
        run = tmp_path / "three" / "runs" / algorithm / _point_run({**held, "train.lr": 0.09}, seed)
        status = json.loads((run / "status.json").read_text(encoding="utf-8"))
        assert (status["phase"], status["round"]) == ("done", 50), seed
    assert f"{name} at 0.09 ran all 50 rounds on all three tuning seeds" in paragraph


def test_the_twins_third_tuning_seed_says_how_far_fedent_is_from_fedavg_at_the_rate_both_chose(tmp_path: Path) -> None:
    """docs/full-cpu/tuning.md, FedAvg's rate on tuning seeds 0, 1 and 2: FedEnt's validation score at 0.09 minus
    FedAvg's, seed by seed, is what the two 3-seed searches' tuned.json give (each score recomputed from its run by
    the seed-search test)."""
    import json

    scores = {}
    for algorithm in ("fedavg", "fedent"):
        pages = _tuning_archive(f"{algorithm}-tune-3seeds-logs.tar.gz", tmp_path / algorithm, "full-cpu")
        tuned = json.loads((tmp_path / algorithm / "tuned.json").read_text(encoding="utf-8"))
        scores[algorithm] = dict((v, sc) for v, sc in tuned["algorithms"][algorithm]["knobs"][0]["per_seed"])[0.09]
    gaps = [f"{100 * (e - a):+.2f}".replace("-", "\u2212") for e, a in zip(scores["fedent"], scores["fedavg"],
                                                                           strict=True)]
    said = (f"At 0.09 FedEnt's validation score is {gaps[0]}, {gaps[1]} and {gaps[2]} points from FedAvg's on "
            "seeds 0, 1 and 2")
    assert said in pages[0][1], said


def test_the_emnist_twins_search_says_what_the_added_point_changed(tmp_path: Path) -> None:
    """docs/full-cpu/tuning.md, the EMNIST-L twin's four-point search: the first three points alone choose the paper's
    0.1 for FedAvg; 0.2's margin over 0.1 and FedEnt's over FedAvg at 0.2 are the kept scores' (each recomputed from
    its run by the search test)."""
    import json

    (page, _), _ = _tuning_archive("emnist-tune-logs.tar.gz", tmp_path, "full-cpu")
    text = _joined(page)
    tuned = json.loads((tmp_path / "tuned.json").read_text(encoding="utf-8"))
    fedavg, fedent = (dict(tuned["algorithms"][a]["knobs"][0]["tried"]) for a in ("fedavg", "fedent"))
    three = {v: x for v, x in fedavg.items() if v != 0.2 and x is not None}
    assert _chosen(three) == 0.1 and _chosen({v: x for v, x in fedavg.items() if x is not None}) == 0.2
    assert "The first three points alone chose the paper's 0.1, bracketed too" in text
    assert f"beats 0.1 by {100 * (fedavg[0.2] - fedavg[0.1]):.2f} points on this tuning seed" in text
    assert (f"FedEnt scores {100 * fedent[0.2]:.2f}% and FedAvg {100 * fedavg[0.2]:.2f}% on the validation split, "
            f"{100 * (fedent[0.2] - fedavg[0.2]):.2f} points apart on one tuning seed") in text


def _final_acc(run: Path) -> float:
    from fedent import runlog

    return float(runlog.read_metrics(run / "metrics.jsonl")[-1]["test_acc"])


TWIN_HEADING = "**MNIST-CNN, pathological, 20% of 100**"


def _pathological_twin_page(tmp_path: Path, folder: str, setting: str = "pathological") -> tuple[Path, str, Path]:
    """docs/full-cpu/FOLDER/results.md, its text with the lines joined, and one twin's runs (the pathological twin's
    unless ``setting`` says otherwise) of the shared archive unpacked under ``tmp_path``."""
    page = ROOT / "docs" / "full-cpu" / folder / "results.md"
    with tarfile.open(ROOT / "docs" / "full-cpu" / "results" / "run-logs.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    return page, _joined(page), tmp_path / "runs" / setting


def _verdict(p: Any, above: str, below: str) -> str:
    """How the tuned twin page reads a paired interval: "no difference shown" only where it spans zero."""
    assert p is not None and p.lo is not None and p.hi is not None
    return "no difference shown" if p.lo < 0 < p.hi else (above if p.lo > 0 else below)


def _diverged_at(run: Path) -> str:
    """A diverged run as the twin pages name it, "round R (seed S, client C)", from the error its status.json keeps."""
    from fedent.experiments import reproduce

    error = reproduce.diverged(run)
    assert error is not None, run.name
    rnd, cids = re.search(r"round (\d+) missed", error), re.search(r"client\(s\) \[([\d, ]+)\]", error)
    assert rnd and cids, error
    ids = [c.strip() for c in cids[1].split(",")]
    who = f"client {ids[0]}" if len(ids) == 1 else f"clients {', '.join(ids[:-1])} and {ids[-1]}"
    seed = run.name.rsplit("-s", 1)[1]
    return f"round {rnd[1]} (seed {seed}, {who})"


@dataclass(frozen=True)
class TunedTwin:
    """A twin's tuned rows on the test set (docs/full-cpu/FOLDER/results.md, runs in the shared archive): FedAvg and
    FedEnt at the rate both searches (``TWIN_SEARCHES`` of that setting) chose, ``rate`` = ``scale`` × the paper's
    ``base``; the rows ``fedavg-lrK`` and ``fedent-lrK`` (K = ``scale``); ``heading``: the generated table's."""

    folder: str
    setting: str
    base: float
    scale: int
    heading: str

    @property
    def rate(self) -> float:
        return self.base * self.scale


TUNED_TWINS = [TunedTwin("tuned", "pathological", 0.01, 9, TWIN_HEADING),
               TunedTwin("tuned-emnist", "emnist-dir1.0", 0.1, 2, "**EMNIST-L setting, α_d = 1.0**")]


@pytest.mark.parametrize("twin", TUNED_TWINS, ids=lambda t: t.setting)
def test_the_twins_tuned_rows_train_their_searches_rate_after_the_searches_ended(tmp_path: Path,
                                                                                 twin: TunedTwin) -> None:
    """docs/full-cpu/tuned/results.md (the pathological twin) and docs/full-cpu/tuned-emnist/results.md (the EMNIST-L
    twin): rows fedavg-lrK and fedent-lrK are the FedAvg and FedEnt runs of the same seeds with one change, train.lr
    at the rate each one's search on the validation split chose (docs/full-cpu/tuning.md's tuned.json), trained by
    processes that started after that search's last run ended (the test set was read once, after the choice); each
    ran 50 rounds or diverged where the page says."""
    import json

    import yaml

    from fedent import runlog

    _, text, runs = _pathological_twin_page(tmp_path / "study", twin.folder, twin.setting)
    searches = [s for s in TWIN_SEARCHES if s.setting == twin.setting]
    assert sorted(s.algorithm for s in searches) == ["fedavg", "fedent"]
    for search in searches:
        tune = tmp_path / search.algorithm
        with tarfile.open(ROOT / "docs" / "full-cpu" / "results" / search.archive) as tar:
            tar.extractall(tune, filter="data")
        chosen = json.loads((tune / "tuned.json").read_text(encoding="utf-8"))["algorithms"][search.algorithm]
        assert chosen["chosen"] == {"train.lr": pytest.approx(twin.rate), **dict(search.held)}  # held knobs at 0.99
        ended = max(json.loads(s.read_text(encoding="utf-8"))["updated_at"]
                    for s in (tune / "runs" / search.algorithm).glob("*/status.json"))
        blew = []
        for seed in (0, 1, 2):
            run = runs / f"{search.algorithm}-lr{twin.scale}-s{seed}"
            base = runs / f"{search.algorithm}-s{seed}"
            cfg, ref = (yaml.safe_load((r / "config.yaml").read_text(encoding="utf-8")) for r in (run, base))
            assert cfg["train"]["lr"] == pytest.approx(chosen["chosen"]["train.lr"])
            assert ref["train"]["lr"] == twin.base
            for part in ("data", "model", "algorithm", "train"):  # the rate is the one change from the paper's row
                assert {k: v for k, v in cfg[part].items() if k != "lr"} == \
                    {k: v for k, v in ref[part].items() if k != "lr"}, (run.name, part)
            for key, value in search.held:
                part, name = key.split(".")
                assert cfg[part][name] == value
            assert cfg["train"]["seed"] == seed and cfg["train"]["rounds"] == 50
            assert json.loads((run / "partition.json").read_text()) == json.loads((base / "partition.json").read_text())
            status = json.loads((run / "status.json").read_text(encoding="utf-8"))
            assert status["started_at"] > ended, run.name
            prov = json.loads((run / "provenance.json").read_text(encoding="utf-8"))
            assert all(e.get("started_at", 0) > ended for e in prov.get("earlier", [])), run.name
            rounds = [r["round"] for r in runlog.read_metrics(run / "metrics.jsonl")]
            if status["phase"] == "done":
                assert rounds == list(range(1, 51)), run.name
            else:  # diverged: every round before the one that failed is logged, and the page names it
                assert status["phase"] == "failed" and rounds == list(range(1, status["round"])), run.name
                blew.append(_diverged_at(run))
        name = {"fedavg": "FedAvg", "fedent": "FedEnt"}[search.algorithm]
        if blew:
            assert f"{name} at {twin.rate:g} diverged in {' and '.join(blew)}" in text, blew
        else:
            assert f"{name} at {twin.rate:g} ran all 50 rounds on each of the 3 seeds" in text


@pytest.mark.parametrize("twin", TUNED_TWINS, ids=lambda t: t.setting)
def test_the_twins_tuned_rows_say_what_their_tables_and_logs_show(tmp_path: Path, twin: TunedTwin) -> None:
    """docs/full-cpu/tuned/results.md and docs/full-cpu/tuned-emnist/results.md: FedEnt at its tuned base rate
    against FedAvg at its tuned rate (the pair the generated table, referenced on FedEnt at the paper's values, does
    not print), and each tuned row against the paper's rows, over the seeds both finished, as the kept logs give
    them; every verdict follows its interval."""
    from fedent.experiments import pair_runs
    from fedent.experiments import paired as P

    page, text, runs = _pathological_twin_page(tmp_path, twin.folder, twin.setting)
    table = _paired_rows(page, twin.heading)
    avg, ent = f"fedavg-lr{twin.scale}", f"fedent-lr{twin.scale}"
    end = {r: pair_runs.end_points(pair_runs.runs_of(runs, r), 5) for r in ("fedavg", "fedent", avg, ent)}

    def said(p: Any) -> str:
        return P.fmt(p).removesuffix(f" (n = {p.n})").replace("-", "−")

    head = P.paired(end[ent], end[avg])
    assert head is not None and head.n >= 2
    both = sorted(end[ent].keys() & end[avg].keys())
    diffs = [f"{100 * (end[ent][s] - end[avg][s]):+.2f}".replace("-", "−")  # type: ignore[operator]
             for s in both]
    mean = {r: f"{100 * sum(end[r][s] for s in both) / len(both):.2f}" for r in (ent, avg)}  # type: ignore[misc]
    seeds = ", ".join(str(s) for s in both)
    assert (f"end points (the mean of the last 5 rounds) {mean[ent]}% against {mean[avg]}% on "
            f"seeds {seeds}, {said(head)} points (95% t-interval of the paired difference, n = {head.n}): "
            f"{_verdict(head, 'FedEnt above', 'FedEnt below')}; seed by seed {', '.join(diffs)}") in text
    for row, ref, label, above, below in (
            (avg, "fedent", "**FedAvg at its tuned rate against FedEnt at the paper's values:**",
             "FedAvg above", "FedAvg below"),
            (avg, "fedavg", "**Tuning FedAvg's rate:**", "a gain", "a loss"),
            (ent, "fedent", "**FedEnt's base rate tuned, against FedEnt at the paper's:**", "a gain",
             "a loss")):
        p = P.paired(end[row], end[ref])
        assert p is not None and p.n >= 2
        if ref == "fedent":  # the generated table's own pair
            assert table[row][2] == P.fmt(p)
        assert f"{label} {said(p)} (n = {p.n}), {_verdict(p, above, below)}" in text, (row, ref)
