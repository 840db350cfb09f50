"""fedent compare: algorithms x seeds on identical inputs -> compare.md, summary.json and figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_support import tiny_config, tiny_inputs

from fedent import runlog
from fedent.config import ExperimentConfig
from fedent.experiments.compare import (
    AlgorithmSummary,
    RunSummary,
    markdown_table,
    rounds_to_target,
    run_comparison,
    sampling_identical,
    summarize,
)
from fedent.inputs import RunInputs


def _inputs(cfg: ExperimentConfig) -> RunInputs:
    return tiny_inputs(seed=cfg.train.seed)


def _inputs_noting_the_process(cfg: ExperimentConfig) -> RunInputs:
    """_inputs, leaving a file named after the process that asked (the pool's workers inherit the variable)."""
    import os

    (Path(os.environ["FEDENT_TEST_PIDS"]) / f"{os.getpid()}-{cfg.algorithm.name}-{cfg.train.seed}").touch()
    return _inputs(cfg)


def test_compare_two_algorithms_two_seeds(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=3, lr=0.1)
    res = run_comparison(cfg, ["fedavg", "fedprox"], [0, 1], tmp_path / "cmp", target=0.5, progress=False,
                         local_eval=2, algo_overrides=["fedprox.mu=0.5"], inputs_for=_inputs)
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| fedavg |" in md and "| fedprox |" in md and "rounds to 50.0%" in md
    assert "identical participants per round across algorithms: yes" in md
    assert res.same_sampling
    figs = sorted(p.name for p in (tmp_path / "cmp" / "figures").iterdir())
    assert figs == ["accuracy.png", "local_acc.png", "test_loss.png", "train_loss.png"]
    for p in res.figures:
        assert p.stat().st_size > 1000 and f"]({p.relative_to(tmp_path / 'cmp')})" in md
    assert sorted(p.name for p in (tmp_path / "cmp" / "runs").iterdir()) == [
        "fedavg-s0", "fedavg-s1", "fedprox-s0", "fedprox-s1"]
    summary = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    by_algo = {a["algorithm"]: a for a in summary["algorithms"]}
    finals = [r.final_acc for r in res.runs if r.algorithm == "fedavg"]
    assert by_algo["fedavg"]["final_acc"]["mean"] == pytest.approx(sum(finals) / 2)  # type: ignore[arg-type]
    prox_cfg = json.loads((tmp_path / "cmp" / "runs" / "fedprox-s0" / "status.json").read_text())
    assert prox_cfg["algorithm"] == "fedprox"
    assert "mu: 0.5" in (tmp_path / "cmp" / "runs" / "fedprox-s0" / "config.yaml").read_text()
    # paired over seeds: fedprox − fedavg of the last-5-round mean, recomputed from the logs by hand
    def end(run: str) -> float:
        accs = [r["test_acc"] for r in runlog.read_metrics(tmp_path / "cmp" / "runs" / run / "metrics.jsonl")
                if r.get("test_acc") is not None][-5:]
        return sum(accs) / len(accs)
    d = [end("fedprox-s0") - end("fedavg-s0"), end("fedprox-s1") - end("fedavg-s1")]
    (pair,) = summary["paired"]
    assert pair["algorithm"] == "fedprox" and pair["reference"] == "fedavg" and pair["end_point"]["n"] == 2
    assert pair["end_point"]["mean"] == pytest.approx(sum(d) / 2)
    half = 12.706 * abs(d[0] - d[1]) / 2 ** 0.5 / 2 ** 0.5  # t(0.975, 1) * sd / sqrt(2), sd = |d0 - d1| / sqrt 2
    assert pair["end_point"]["hi"] - pair["end_point"]["mean"] == pytest.approx(half)
    assert "Paired over seeds against fedavg" in md and "(n = 2)" in md
    prov = summary["runs"][0]["provenance"]
    assert prov["cpu_count"] and prov["torch"] and "Provenance (provenance.json of the runs): commit " in md


def test_rounds_to_target_and_summary_stats() -> None:
    recs = [{"round": 0, "test_acc": 0.3}, {"round": 1, "test_acc": None}, {"round": 2, "test_acc": 0.7}]
    assert rounds_to_target(recs, 0.5) == 3 and rounds_to_target(recs, 0.3) == 1
    assert rounds_to_target(recs, 0.9) is None and rounds_to_target(recs, None) is None
    p = Path(".")
    runs = [RunSummary("a", 0, p, 0.5, 0.6, 3, 1.0), RunSummary("a", 1, p, 0.7, 0.8, None, 1.0),
            RunSummary("b", 0, p, None, None, None, None, error="diverged")]
    a, b = summarize(runs, ["a", "b"])
    assert a.final == pytest.approx((0.6, 0.1414213562)) and a.reach == (3.0, None) and a.reached == 1
    assert b == AlgorithmSummary("b", 1, None, None, None, 0, 1)
    table = markdown_table([a, b], 0.75)
    assert "| a | 60.00 ± 14.14 | 70.00 ± 14.14 | 3.0 (1/2) | 0 |" in table  # one seed reached: no ± 0.0
    one = summarize(runs[:1], ["a"])[0]  # a single seed has no spread: the table says n=1, never "± 0.00"
    assert one.final == (0.5, None)
    assert "| a | 50.00 (n=1) | 60.00 (n=1) | 3.0 (1/1) | 0 |" in markdown_table([one], 0.75)
    assert "| b | — | — | not reached (0/1) | 1 |" in table


def test_sampling_check_can_fail() -> None:
    same = {("a", 0): [{"round": 0, "clients": [1, 2]}], ("b", 0): [{"round": 0, "clients": [1, 2]}],
            ("a", 1): [{"round": 0, "clients": [3, 4]}]}
    assert sampling_identical(same)
    same[("b", 0)] = [{"round": 0, "clients": [1, 3]}]
    assert not sampling_identical(same)


def test_an_interrupted_comparison_continues_where_it_stopped(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted in fedprox's second round (after fedavg finished), the same call on the same directory reads
    fedavg back, resumes fedprox from its round-1 checkpoint, and ends with the uninterrupted result."""
    from fedent.rounds.engine import RoundEngine

    cfg = tiny_config(rounds=3, lr=0.1)
    ref = run_comparison(cfg, ["fedavg", "fedprox"], [0], tmp_path / "ref", progress=False, inputs_for=_inputs)
    real = RoundEngine.run_round
    calls: list[int] = []

    def counted(self: RoundEngine, rnd: int) -> dict[str, object]:
        calls.append(rnd)
        if len(calls) == 5 and stop:  # fedavg: calls 1-3; fedprox round 2 is call 5
            raise KeyboardInterrupt("stopped by SIGTERM")
        return real(self, rnd)

    monkeypatch.setattr(RoundEngine, "run_round", counted)
    stop = True
    with pytest.raises(KeyboardInterrupt):
        run_comparison(cfg, ["fedavg", "fedprox"], [0], tmp_path / "cmp", progress=False, inputs_for=_inputs)
    assert json.loads((tmp_path / "cmp" / "runs" / "fedprox-s0" / "status.json").read_text())["phase"] == "stopped"
    calls.clear()
    stop = False
    res = run_comparison(cfg, ["fedavg", "fedprox"], [0], tmp_path / "cmp", progress=False, inputs_for=_inputs)
    assert calls == [1, 2]  # fedavg not run again; fedprox from its second round (loop index 1) on
    assert [(r.algorithm, r.final_acc, r.best_acc) for r in res.runs] == [
        (r.algorithm, r.final_acc, r.best_acc) for r in ref.runs]
    assert all(r.error is None for r in res.runs)
    logged = [r["round"] for r in runlog.read_metrics(tmp_path / "cmp" / "runs" / "fedprox-s0" / "metrics.jsonl")]
    assert logged == [1, 2, 3]


def test_workers_run_the_comparison_in_a_pool_with_one_process_results(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--workers 2: the four runs go to two spawned processes (one thread each); every run's model and log
    equal the one-process comparison's at one thread, and the report lists the runs in the same order."""
    import torch

    from fedent.model_file import load_model_file

    cfg = tiny_config(rounds=2, lr=0.1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = run_comparison(cfg, ["fedavg", "fedprox"], [0, 1], tmp_path / "one", progress=False, inputs_for=_inputs)
    finally:
        torch.set_num_threads(threads)
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("FEDENT_TEST_PIDS", str(pids))
    two = run_comparison(cfg, ["fedavg", "fedprox"], [0, 1], tmp_path / "two", progress=False,
                         inputs_for=_inputs_noting_the_process, workers=2)
    import os

    seen = [p.name.split("-", 1) for p in pids.iterdir()]
    assert sorted(run for _, run in seen) == ["fedavg-0", "fedavg-1", "fedprox-0", "fedprox-1"]
    assert str(os.getpid()) not in {pid for pid, _ in seen} and 1 <= len({pid for pid, _ in seen}) <= 2
    assert [(r.algorithm, r.seed) for r in two.runs] == [(r.algorithm, r.seed) for r in one.runs] == [
        ("fedavg", 0), ("fedprox", 0), ("fedavg", 1), ("fedprox", 1)]
    for a, b in zip(one.runs, two.runs, strict=True):
        assert a.error is None and b.error is None and a.final_acc == b.final_acc
        pa = load_model_file(a.run_dir / "model_final.pt").params
        pb = load_model_file(b.run_dir / "model_final.pt").params
        assert max(float((x - y).abs().max()) for x, y in zip(pa, pb, strict=True)) <= 1e-5
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    ref = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["algorithms"] == ref["algorithms"]
    with pytest.raises(Exception, match="--workers: must be >= 1"):
        run_comparison(cfg, ["fedavg"], [0], tmp_path / "bad", progress=False, inputs_for=_inputs, workers=0)


@pytest.mark.parametrize("workers", [1, 2])
def test_stacked_runs_give_the_comparison_of_runs_one_by_one(tmp_path: Path, workers: int) -> None:
    """--stack 3: the four runs (fedavg and fedent, seeds 0 and 1) train three and one side by side (in this
    process, or as pool tasks); the report's rows and every run's log are the one-by-one comparison's."""
    cfg = tiny_config(rounds=2, lr=0.1, executor="vectorised")
    one = run_comparison(cfg, ["fedavg", "fedent"], [0, 1], tmp_path / "one", progress=False, inputs_for=_inputs)
    stacked = run_comparison(cfg, ["fedavg", "fedent"], [0, 1], tmp_path / "stacked", progress=False,
                             inputs_for=_inputs, stack=3, workers=workers)
    assert [(r.algorithm, r.seed) for r in stacked.runs] == [(r.algorithm, r.seed) for r in one.runs]
    for a, b in zip(one.runs, stacked.runs, strict=True):
        assert b.error is None and b.final_acc == pytest.approx(a.final_acc, abs=1e-6)
        got, want = (runlog.read_metrics(r.run_dir / "metrics.jsonl") for r in (b, a))
        assert [r["train_loss"] for r in got] == pytest.approx([r["train_loss"] for r in want], rel=1e-5)
    stacks = [json.loads((r.run_dir / "status.json").read_text())["state"].get("stacked_runs") for r in stacked.runs]
    assert stacks == [3, 3, 3, None]
    with pytest.raises(Exception, match="--stack: must be >= 1"):
        run_comparison(cfg, ["fedavg"], [0], tmp_path / "bad", progress=False, inputs_for=_inputs, stack=0)


def test_a_control_row_is_label_equals_algorithm() -> None:
    from fedent.config import ConfigError
    from fedent.experiments.compare import parse_arm

    assert parse_arm("fedent") == ("fedent", "fedent")
    assert parse_arm(" fedent-fixed = fedent ") == ("fedent-fixed", "fedent")
    for bad in ("=fedent", "x=", "a.b=fedent"):
        with pytest.raises(ConfigError, match="LABEL=ALGORITHM"):
            parse_arm(bad)
    with pytest.raises(ConfigError, match="duplicate labels"):
        run_comparison(tiny_config(), ["fedavg", "fedavg=fedprox"], [0], Path("/nonexistent"), progress=False,
                       inputs_for=_inputs)
