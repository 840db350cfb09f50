"""fedent tune: bracketed grids scored on the validation split; the test set is never evaluated while tuning,
and the chosen values reach the comparison's runs."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from sim_support import tiny_config, tiny_inputs

from fedent import runlog
from fedent.config import ConfigError, ExperimentConfig
from fedent.experiments.compare import run_comparison
from fedent.experiments.tuning import Knob, Tuned, Tuner, knobs_for, val_score, write_tuned
from fedent.inputs import RunInputs
from fedent.rounds.evaluation import Evaluator


def _inputs(cfg: ExperimentConfig) -> RunInputs:
    return tiny_inputs(seed=cfg.train.seed)


def _fake(peak: float, diverge_above: float = math.inf) -> tuple[Any, list[float]]:
    """A run function whose validation score peaks at lr = ``peak`` (log scale); runs above ``diverge_above``
    diverge. Returns it and the list of rates it was asked for."""
    asked: list[float] = []

    def run(cfg: ExperimentConfig, run_dir: Path, inputs: RunInputs) -> Sequence[Mapping[str, Any]] | None:
        lr = cfg.train.lr
        asked.append(lr)
        assert cfg.train.evaluate_test is False and cfg.data.validation_fraction == 0.2
        if lr > diverge_above:
            return None
        acc = 0.9 - 0.1 * abs(math.log10(lr / peak))
        return [{"val_acc": 0.0}, {"val_acc": acc}, {"val_acc": acc}]

    return run, asked


def _tuner(tmp_path: Path, run: Any, max_extend: int = 2) -> Tuner:
    return Tuner(tiny_config(), [0], tmp_path, fraction=0.2, tail_k=2, max_extend=max_extend, run=run,
                 inputs_for=_inputs)


def test_an_interior_best_is_bracketed_without_extension(tmp_path: Path) -> None:
    run, asked = _fake(peak=0.03)
    res = _tuner(tmp_path, run).tune_knob("fedavg", Knob("train.lr", (0.01, 0.03, 0.1)), {})
    assert res.best == 0.03 and res.bracketed and res.extensions == 0
    assert sorted(asked) == [0.01, 0.03, 0.1]


def test_a_best_at_the_upper_edge_extends_the_grid_upwards_until_bracketed(tmp_path: Path) -> None:
    run, asked = _fake(peak=0.9)
    res = _tuner(tmp_path, run, max_extend=3).tune_knob("fedavg", Knob("train.lr", (0.01, 0.03, 0.1)), {})
    assert asked == pytest.approx([0.01, 0.03, 0.1, 0.3, 0.9, 2.7])
    assert res.best == pytest.approx(0.9) and res.bracketed and res.extensions == 3


def test_a_best_at_the_lower_edge_extends_downwards_and_the_limit_is_reported(tmp_path: Path) -> None:
    run, asked = _fake(peak=1e-4)
    res = _tuner(tmp_path, run, max_extend=2).tune_knob("fedavg", Knob("train.lr", (0.01, 0.03, 0.1)), {})
    assert asked == pytest.approx([0.01, 0.03, 0.1, 0.01 / 3, 0.01 / 9])
    assert not res.bracketed and res.best == pytest.approx(0.01 / 9)
    assert res.why == "best at the lower edge after 2 extension(s) (the limit)"


def test_a_diverged_run_scores_below_every_finite_one_and_brackets_from_above(tmp_path: Path) -> None:
    run, _ = _fake(peak=10.0, diverge_above=0.05)
    res = _tuner(tmp_path, run).tune_knob("fedavg", Knob("train.lr", (0.01, 0.03, 0.1)), {})
    assert res.tried[0.1] is None and res.best == 0.03 and res.bracketed


def test_the_domain_limit_stops_an_extension() -> None:
    beta = Knob("algorithm.beta", (0.9, 0.99, 0.999), "log1m", 10.0, 0.0, 1.0)
    assert beta.step(0.99, up=True) == 0.999 and beta.step(0.9, up=False) == 0.0 and not beta.inside(0.0)
    assert Knob("train.lr", (0.1, 0.3)).step(0.1, up=True) == pytest.approx(0.3)


def test_grids_per_algorithm_and_their_checks() -> None:
    knobs = {k.key: k for k in knobs_for("fedent", {"train.lr": [0.1, 0.01], "fedent.algorithm.beta": [0.5, 0.9],
                                                    "fedprox.algorithm.mu": [1.0, 2.0]})}
    assert knobs["train.lr"].grid == (0.01, 0.1) and knobs["algorithm.beta"].grid == (0.5, 0.9)
    assert set(knobs) == {"train.lr", "algorithm.beta", "algorithm.gamma"}  # fedprox's grid is not fedent's
    assert [k.key for k in knobs_for("fedprox")] == ["train.lr", "algorithm.mu"]
    assert [k.key for k in knobs_for("feddyn")] == ["train.lr", "algorithm.alpha"]
    assert [k.key for k in knobs_for("fedadam")] == ["train.lr", "algorithm.server_lr"]
    with pytest.raises(ConfigError, match="at least two distinct values"):
        knobs_for("fedent", {"algorithm.beta": [0.9, 1.0]})
    with pytest.raises(ConfigError, match="at least two distinct values"):
        knobs_for("fedavg", {"train.lr": [0.1]})


def test_a_knob_only_a_grid_names_keeps_to_its_options_declared_range() -> None:
    beta1 = knobs_for("fedadam", {"fedadam.algorithm.beta1": [0.99, 0.9]})[-1]
    assert (beta1.key, beta1.grid, beta1.scale, beta1.hi) == ("algorithm.beta1", (0.9, 0.99), "log1m", 1.0)
    assert beta1.step(0.99, up=True) == 0.999  # on the log scale 0.99 × 3 = 2.97, which FedAdam refuses
    tau = knobs_for("fedadam", {"algorithm.tau": [1e-3, 1e-2]})[-1]
    assert (tau.scale, tau.lo, tau.hi) == ("log", 0.0, math.inf)
    fraction = knobs_for("fedavg", {"train.fraction": [0.1, 0.2]})[-1]  # gt=0, le=1, not a decay
    assert fraction.scale == "log" and fraction.inside(0.6) and fraction.inside(1.0) and not fraction.inside(1.8)
    epochs = knobs_for("fedavg", {"train.local_epochs": [1, 3]})[-1]  # ge=1: one epoch is a valid point
    assert epochs.domain() == "[1, inf)" and not epochs.inside(0.5)
    gamma = knobs_for("fednorm", {"fednorm.algorithm.gamma": [0.9, 0.99]})[-1]  # le=1, but 1 − x cannot leave 1
    assert (gamma.scale, gamma.domain()) == ("log1m", "(0, 1)")
    with_one = knobs_for("fednorm", {"fednorm.algorithm.gamma": [0.9, 0.99, 1.0]})[-1]  # γ = 1 asked for: allowed
    assert (with_one.scale, with_one.domain()) == ("log", "(0, 1]")
    with pytest.raises(ConfigError, match=r"inside \(0, 1\]"):
        knobs_for("fednorm", {"fednorm.algorithm.gamma": [0.9, 1.5]})
    with pytest.raises(ConfigError, match="fedavg has no option 'algorithm.beta1'"):
        knobs_for("fedavg", {"algorithm.beta1": [0.9, 0.99]})
    with pytest.raises(ConfigError, match=r"tune train\.\* or algorithm\.\* keys"):
        knobs_for("fedavg", {"fedavg.data.validation_fraction": [0.1, 0.2]})


def test_an_extension_of_a_grid_only_knob_stops_at_its_domain(tmp_path: Path) -> None:
    """Scored best at the top every time, β1's search climbs towards 1 on the near-one scale and ends at the limit
    of extensions, every point a config FedAdam accepts (before, the first extension asked for β1 = 2.97)."""
    asked: list[float] = []

    def run(cfg: ExperimentConfig, run_dir: Path, inputs: RunInputs) -> Sequence[Mapping[str, Any]]:
        beta1 = cfg.algorithm.options.beta1  # type: ignore[attr-defined]
        asked.append(beta1)
        return [{"val_acc": beta1}, {"val_acc": beta1}]

    knob = knobs_for("fedadam", {"fedadam.algorithm.beta1": [0.9, 0.99]})[-1]
    res = _tuner(tmp_path, run, max_extend=2).tune_knob("fedadam", knob, {})
    assert asked == pytest.approx([0.9, 0.99, 0.999, 0.9999]) and res.best == pytest.approx(0.9999)
    assert res.why == "best at the upper edge after 2 extension(s) (the limit)"


def test_equal_scores_summed_in_another_order_tie_and_the_smaller_value_wins(tmp_path: Path) -> None:
    """Two runs with the same 29,258 of 30,000 validation predictions right over their last 5 rounds (real MNIST,
    FedNorm's γ 0.99 and 0.999, seed 0) score 2e-16 apart as floats: the tie rule (the smaller value) still holds,
    for the mean's choice and for each seed's own."""
    a = [0.9751666666666666, 0.975, 0.9741666666666666, 0.978, 0.974]
    b = [0.9733333333333334, 0.9753333333333334, 0.9738333333333333, 0.9783333333333334, 0.9755]
    sa, sb = val_score([{"val_acc": x} for x in a], 5), val_score([{"val_acc": x} for x in b], 5)
    assert sa is not None and sb is not None and sa != sb and abs(sa - sb) < 1e-12  # the float noise
    scores = {0.99: [{"val_acc": x} for x in a], 0.999: [{"val_acc": x} for x in b], 0.9: [{"val_acc": 0.97}]}

    def run(cfg: ExperimentConfig, run_dir: Path, inputs: RunInputs) -> Sequence[Mapping[str, Any]] | None:
        return scores[cfg.to_dict()["algorithm"]["gamma"]]

    tuner = Tuner(tiny_config("fednorm"), [0], tmp_path, fraction=0.2, tail_k=5, max_extend=0, run=run,
                  inputs_for=_inputs)
    res = tuner.tune_knob("fednorm", Knob("algorithm.gamma", (0.9, 0.99, 0.999), "log1m", 10.0, 0.0, 1.0), {})
    assert res.best == 0.99 and res.seed_choices() == [0.99]
    assert res.bracketed  # 0.999 is not better: the grid needs no extension


def test_val_score_is_the_mean_of_the_last_k_validation_accuracies() -> None:
    recs = [{"val_acc": 0.1}, {"val_acc": None}, {"val_acc": 0.4}, {"val_acc": 0.6}]
    assert val_score(recs, 2) == pytest.approx(0.5) and val_score(recs, 9) == pytest.approx(1.1 / 3)
    assert val_score([{"test_acc": 0.9}], 2) is None


@pytest.fixture
def test_set_spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every evaluation of the test set (Evaluator.evaluate is the only path to it)."""
    calls: list[int] = []
    original = Evaluator.evaluate

    def counting(self: Evaluator, params: Any) -> tuple[float, float]:
        calls.append(int(self.y_test.shape[0]))
        return original(self, params)

    monkeypatch.setattr(Evaluator, "evaluate", counting)
    return calls


def test_tuning_never_evaluates_the_test_set_and_the_chosen_values_reach_the_final_runs(
        tmp_path: Path, test_set_spy: list[int]) -> None:
    cfg = tiny_config("fedavg", rounds=2, lr=0.05, local_eval=2)
    tuner = Tuner(cfg, [0], tmp_path / "tune", fraction=0.2, tail_k=2, max_extend=0, inputs_for=_inputs)
    results = [tuner.tune("fedavg", {"train.lr": [0.01, 0.3]}),
               tuner.tune("fedprox", {"train.lr": [0.01, 0.3], "fedprox.algorithm.mu": [0.01, 1.0]})]
    assert test_set_spy == []  # not once, local models included (local_eval 2)
    logs = sorted((tmp_path / "tune" / "runs").glob("*/*/metrics.jsonl"))
    assert len(logs) == tuner.runs == 2 + 3  # fedprox's (0.3 or 0.01, mu 0.01) point is not run twice
    for path in logs:
        recs = runlog.read_metrics(path)
        assert all(r["test_acc"] is None for r in recs) and all(r["val_acc"] is not None for r in recs)
    write_tuned(tmp_path / "tune" / "tuned.json", tuner, results)
    tuned = Tuned.read(tmp_path / "tune" / "tuned.json")
    chosen = tuned.chosen["fedprox"]
    assert set(chosen) == {"train.lr", "algorithm.mu"} and tuned.validation_fraction == 0.2
    assert "| fedprox | algorithm.mu |" in (tmp_path / "tune" / "tune.md").read_text()

    res = run_comparison(cfg, ["fedavg", "fedprox", "prox-big=fedprox"], [0], tmp_path / "cmp", progress=False,
                         inputs_for=_inputs, tuned=tuned, algo_overrides=["prox-big.mu=5.0"])
    assert test_set_spy  # the final runs evaluate the test set
    assert [r.algorithm for r in res.runs] == ["fedavg", "fedprox", "prox-big"]
    written = {arm: yaml.safe_load((tmp_path / "cmp" / "runs" / f"{arm}-s0" / "config.yaml").read_text())
               for arm in ("fedavg", "fedprox", "prox-big")}
    assert written["fedavg"]["train"]["lr"] == tuned.chosen["fedavg"]["train.lr"]
    assert written["fedprox"]["train"]["lr"] == chosen["train.lr"]
    assert written["fedprox"]["algorithm"]["mu"] == chosen["algorithm.mu"]
    assert written["prox-big"]["train"]["lr"] == chosen["train.lr"]  # a control inherits its algorithm's values
    assert written["prox-big"]["algorithm"]["mu"] == 5.0  # ... under its own options
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "- validation split: 0.2 of every client's training samples held out" in md
    assert f"  - prox-big: fedprox, lr {chosen['train.lr']:g}, mu 5.0 (tuned values of " in md
    for arm, w in written.items():
        assert w["data"]["validation_fraction"] == 0.2 and "evaluate_test" not in w["train"], arm
        recs = runlog.read_metrics(tmp_path / "cmp" / "runs" / f"{arm}-s0" / "metrics.jsonl")
        assert recs[-1]["test_acc"] is not None and recs[-1]["val_acc"] is not None


def test_a_point_cut_short_goes_on_from_its_checkpoint_and_another_configs_finished_run_is_kept(
        tmp_path: Path) -> None:
    """Tuning again after a kill continues the point that was cut short (its logged rounds kept, not trained
    again) and ends where the uninterrupted run ended; a finished run of another config is moved aside."""
    cfg = tiny_config("fedavg", rounds=3, local_eval=0)

    def search() -> Any:
        return Tuner(cfg, [0], tmp_path, fraction=0.2, tail_k=2, max_extend=0,
                     inputs_for=_inputs).tune("fedavg", {"train.lr": [0.05, 0.1]})

    first = search()
    run_dir = sorted((tmp_path / "runs").glob("*/*/metrics.jsonl"))[0].parent
    metrics = run_dir / "metrics.jsonl"
    full = metrics.read_text().splitlines()
    assert len(full) == 3
    # as a kill during round 3 leaves it: round 3 not logged, the newest checkpoint that of round 2
    metrics.write_text("".join(line + "\n" for line in full[:2]))
    ckpts = sorted((run_dir / "checkpoint").iterdir())
    assert [c.name for c in ckpts] == ["round-00000001.ckpt", "round-00000002.ckpt"]  # the last two kept
    ckpts[-1].unlink()
    (run_dir / "model_final.pt").unlink()
    (run_dir / "status.json").write_text(json.dumps({"phase": "running"}))
    again = search()
    assert metrics.read_text().splitlines()[:2] == full[:2]  # rounds 1-2 kept (their wall times too)
    assert runlog.read_metrics(metrics)[2]["val_acc"] == json.loads(full[2])["val_acc"]
    assert again.to_dict() == first.to_dict()

    # the same point's directory holding a finished run of another config: kept aside, whole
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    written["train"]["local_epochs"] = 2
    (run_dir / "config.yaml").write_text(yaml.safe_dump(written))
    before = metrics.read_text()
    search()
    kept = run_dir.with_name(f"{run_dir.name}.superseded-1")
    assert yaml.safe_load((kept / "config.yaml").read_text())["train"]["local_epochs"] == 2
    assert (kept / "metrics.jsonl").read_text() == before
    assert len(runlog.read_metrics(metrics)) == 3 and (run_dir / "model_final.pt").exists()


def test_each_tuning_seeds_scores_and_its_own_choice_are_kept_and_shown(tmp_path: Path) -> None:
    """With several tuning seeds the mean decides, and tuned.json and tune.md also keep each seed's scores and the
    value each seed alone would choose, so a reader sees whether the seeds agree."""
    peaks = {0: 0.03, 1: 0.1}  # seed 1 alone prefers 0.1; the mean prefers 0.03 (seed 0 is steeper)
    lines: list[str] = []

    def run(cfg: ExperimentConfig, run_dir: Path, inputs: RunInputs) -> Sequence[Mapping[str, Any]] | None:
        if cfg.train.lr > 0.2:
            return None if cfg.train.seed == 1 else [{"val_acc": 0.1}]
        slope = 0.2 if cfg.train.seed == 0 else 0.05
        return [{"val_acc": 0.9 - slope * abs(math.log10(cfg.train.lr / peaks[cfg.train.seed]))}]

    tuner = Tuner(tiny_config(), [0, 1], tmp_path, fraction=0.2, tail_k=1, max_extend=0, run=run,
                  inputs_for=_inputs, log=lines.append)
    res = tuner.tune("fedavg", {"train.lr": [0.01, 0.03, 0.1, 0.3]})
    knob = res.knobs[0]
    assert res.chosen == {"train.lr": 0.03} and knob.seed_choices() == [0.03, 0.1]
    assert knob.per_seed[0.3] == [0.1, None] and knob.tried[0.3] is None
    s0, s1 = knob.per_seed[0.1]
    assert knob.tried[0.1] == pytest.approx((s0 + s1) / 2) and s1 == pytest.approx(0.9)
    assert "tune fedavg: lr0.1: validation 84.77% (seeds 79.54%, 90.00%)" in lines
    write_tuned(tmp_path / "tuned.json", tuner, [res])
    kept = json.loads((tmp_path / "tuned.json").read_text())["algorithms"]["fedavg"]["knobs"][0]
    assert kept["per_seed"] == [[v, per] for v, per in sorted(knob.per_seed.items())]
    md = (tmp_path / "tune.md").read_text().splitlines()
    assert "| fedavg | train.lr | 0.1 | 79.54 | 90.00 | 84.77 |" in md
    assert "| fedavg | train.lr | 0.3 | 10.00 | div. | div. |" in md
    assert "| fedavg | train.lr | alone chooses | **0.03** | **0.1** | **0.03** |" in md
    assert "Tuner" not in "".join(md)

    one = Tuner(tiny_config(), [0], tmp_path / "one", fraction=0.2, tail_k=1, max_extend=0, run=run,
                inputs_for=_inputs)
    write_tuned(tmp_path / "one" / "tuned.json", one, [one.tune("fedavg", {"train.lr": [0.01, 0.03, 0.1]})])
    assert "alone chooses" not in (tmp_path / "one" / "tune.md").read_text()  # one seed: nothing to compare


def test_tuned_json_errors_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        Tuned.read(tmp_path / "missing.json")
    (tmp_path / "old.json").write_text(json.dumps({"version": 0}))
    with pytest.raises(ConfigError, match="not a tuned.json"):
        Tuned.read(tmp_path / "old.json")
    t = Tuned(0.1, {"fedent": {"train.lr": 0.3}})
    assert t.for_arm("fedent-fixed", "fedent") == {"train.lr": 0.3} and t.for_arm("fedavg", "fedavg") == {}


def test_tuner_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="validation-fraction"):
        Tuner(tiny_config(), [0], tmp_path, fraction=0.0)
    with pytest.raises(ConfigError, match="max-extend"):
        Tuner(tiny_config(), [0], tmp_path, max_extend=-1)


def _lr_peaked(cfg: ExperimentConfig) -> list[dict[str, float]]:
    """Validation accuracy peaking at lr 0.03 (and at mu 0.01, β 0.99 where the algorithm has them)."""
    acc = 0.9 - 0.1 * abs(math.log10(cfg.train.lr / 0.03)) - 0.01 * cfg.train.seed
    opts = cfg.to_dict()["algorithm"]
    for name, peak in (("mu", 0.01), ("beta", 0.99)):
        if name in opts:
            acc -= 0.01 * abs(math.log10(float(opts[name]) / peak))
    return [{"val_acc": acc}]


def test_a_pool_runs_a_knobs_points_at_once_and_chooses_what_the_sequential_search_chooses(tmp_path: Path) -> None:
    """Every seed of every grid value of the knob is in flight together (a barrier of 6 that a one-at-a-time
    search would break on its timeout), and the result is the sequential one, runs counted alike."""
    barrier = threading.Barrier(6, timeout=20)

    def together(cfg: ExperimentConfig, run_dir: Path, inputs: RunInputs) -> Sequence[Mapping[str, Any]] | None:
        barrier.wait()
        return _lr_peaked(cfg)

    def alone(cfg: ExperimentConfig, run_dir: Path, inputs: RunInputs) -> Sequence[Mapping[str, Any]] | None:
        return _lr_peaked(cfg)

    grids = {"train.lr": [0.01, 0.03, 0.1]}
    with ThreadPoolExecutor(8) as pool:
        pooled = Tuner(tiny_config(), [0, 1], tmp_path / "p", fraction=0.2, tail_k=1, run=together,
                       inputs_for=_inputs, pool=pool).tune_all(["fedavg"], grids)
    sequential = Tuner(tiny_config(), [0, 1], tmp_path / "s", fraction=0.2, tail_k=1, run=alone,
                       inputs_for=_inputs).tune_all(["fedavg"], grids)
    assert pooled[0].to_dict() == sequential[0].to_dict()
    assert pooled[0].chosen == {"train.lr": 0.03} and pooled[0].runs == 6
    assert pooled[0].score == pytest.approx(0.895)  # the mean over seeds 0 and 1


def test_a_pool_tunes_the_algorithms_at_once_and_writes_the_same_tuned_json(tmp_path: Path) -> None:
    """Each algorithm's first point waits for the others' (a barrier across the three searches); extensions
    stay decided on the results, and tuned.json is byte for byte the sequential search's."""
    barrier = threading.Barrier(3, timeout=20)
    first: set[str] = set()
    lock = threading.Lock()
    lines: list[str] = []

    def run(cfg: ExperimentConfig, run_dir: Path, inputs: RunInputs) -> Sequence[Mapping[str, Any]] | None:
        with lock:
            wait = cfg.algorithm.name not in first
            first.add(cfg.algorithm.name)
        if wait:
            barrier.wait()
        if cfg.train.lr > 0.5:
            return None  # diverged: scores below every finite run, as in the sequential search
        return _lr_peaked(cfg)

    algorithms, grids = ["fedavg", "fedprox", "fedent"], {"train.lr": [0.1, 0.3]}  # best at the lower edge
    with ThreadPoolExecutor(4) as pool:
        tuner = Tuner(tiny_config(), [0], tmp_path / "p", fraction=0.2, tail_k=1, run=run, inputs_for=_inputs,
                      pool=pool, log=lines.append)
        pooled = tuner.tune_all(algorithms, grids)
    first.clear()
    barrier = threading.Barrier(1)  # the sequential search runs one point at a time
    seq = Tuner(tiny_config(), [0], tmp_path / "s", fraction=0.2, tail_k=1, run=run, inputs_for=_inputs)
    sequential = seq.tune_all(algorithms, grids)
    assert [r.to_dict() for r in pooled] == [r.to_dict() for r in sequential]
    assert tuner.runs == seq.runs == sum(r.runs for r in pooled) == len(lines)  # one log line per point
    assert pooled[0].knobs[0].extensions == 2 and pooled[0].chosen["train.lr"] == pytest.approx(0.1 / 3)
    write_tuned(tmp_path / "p" / "tuned.json", tuner, pooled)
    write_tuned(tmp_path / "s" / "tuned.json", seq, sequential)
    assert (tmp_path / "p" / "tuned.json").read_bytes() == (tmp_path / "s" / "tuned.json").read_bytes()


def test_a_run_that_raises_in_the_pool_surfaces_and_stops_the_other_searches(tmp_path: Path) -> None:
    asked: list[str] = []

    def run(cfg: ExperimentConfig, run_dir: Path, inputs: RunInputs) -> Sequence[Mapping[str, Any]] | None:
        asked.append(cfg.algorithm.name)
        if cfg.algorithm.name == "fedprox":
            raise KeyError("a bug")
        return _lr_peaked(cfg)

    with ThreadPoolExecutor(2) as pool:
        tuner = Tuner(tiny_config(), [0], tmp_path, fraction=0.2, tail_k=1, run=run, inputs_for=_inputs,
                      pool=pool)
        with pytest.raises(KeyError, match="a bug"):
            tuner.tune_all(["fedent", "fedprox"], {"train.lr": [0.01, 0.03, 0.1]})
    assert asked.count("fedent") < 9  # fedent's search stopped before its β and γ knobs
    with pytest.raises(ConfigError, match="twice"):
        Tuner(tiny_config(), [0], tmp_path, pool=ThreadPoolExecutor(1)).tune_all(["fedavg", "fedavg"])


@pytest.mark.parametrize("pooled", [False, True])
def test_stacked_tuning_runs_side_by_side_and_chooses_what_one_at_a_time_chooses(tmp_path: Path,
                                                                                pooled: bool) -> None:
    """--stack 3: a knob's points x seeds train in groups of three, one vectorised step (in this process, or as one
    task of a pool); the scores, the choice and the runs' logs are the one-at-a-time search's."""
    cfg = tiny_config("fedavg", rounds=2, lr=0.05, executor="vectorised")
    grids = {"train.lr": [0.01, 0.05, 0.3]}

    def tune(out: Path, stack: int) -> Any:
        with ThreadPoolExecutor(2) as pool:
            tuner = Tuner(cfg, [0, 1], out, fraction=0.2, tail_k=2, max_extend=0, inputs_for=_inputs,
                          pool=pool if pooled else None, stack=stack)
            return tuner, tuner.tune("fedavg", grids)

    one_tuner, one = tune(tmp_path / "one", 1)
    stacked_tuner, stacked = tune(tmp_path / "stacked", 3)
    assert stacked.to_dict() == one.to_dict() and stacked_tuner.runs == one_tuner.runs == 6
    logs = sorted((tmp_path / "stacked" / "runs").glob("*/*/metrics.jsonl"))
    assert len(logs) == 6
    for path in logs:
        twin = tmp_path / "one" / path.relative_to(tmp_path / "stacked")
        got, want = runlog.read_metrics(path), runlog.read_metrics(twin)
        assert [r["val_acc"] for r in got] == pytest.approx([r["val_acc"] for r in want], abs=1e-6)
        status = json.loads((path.parent / "status.json").read_text())
        assert status["state"].get("stacked_runs") == 3
    with pytest.raises(ConfigError, match="--stack"):
        Tuner(cfg, [0], tmp_path / "x", stack=0)


def test_knobs_left_out_stay_at_the_configs_value_and_are_reported_untuned(tmp_path: Path) -> None:
    """--knobs train.lr: FedEnt's β and γ are never varied, every point still names them (so its runs are the
    full search's), and tuned.json and tune.md say they were not tuned."""
    fake, asked = _fake(peak=0.03)
    dirs: list[str] = []

    def run(cfg: ExperimentConfig, run_dir: Path, inputs: RunInputs) -> Sequence[Mapping[str, Any]] | None:
        dirs.append(run_dir.relative_to(tmp_path).as_posix())
        algo = cfg.to_dict()["algorithm"]
        assert (algo["beta"], algo["gamma"]) == (0.99, 0.99)
        return fake(cfg, run_dir, inputs)

    tuner = _tuner(tmp_path, run)
    [res] = tuner.tune_all(["fedent"], {"train.lr": [0.01, 0.03, 0.1]}, only=["train.lr"])
    assert sorted(asked) == [0.01, 0.03, 0.1] and tuner.runs == 3
    assert res.chosen == {"train.lr": 0.03, "algorithm.beta": 0.99, "algorithm.gamma": 0.99}
    assert [(k.key, k.tuned, k.tried) for k in res.knobs][1:] == [("algorithm.beta", False, {}),
                                                                   ("algorithm.gamma", False, {})]
    assert sorted(dirs) == [f"runs/fedent/beta0.99_gamma0.99_lr{v}-s0" for v in ("0.01", "0.03", "0.1")]
    write_tuned(tmp_path / "tuned.json", tuner, [res])
    knobs = json.loads((tmp_path / "tuned.json").read_text())["algorithms"]["fedent"]["knobs"]
    assert [k["tuned"] for k in knobs] == [True, False, False]
    table = (tmp_path / "tune.md").read_text()
    assert "| fedent | algorithm.beta | not tuned (--knobs) | 0.99 | - |" in table
    assert "| fedent | train.lr | 0.01 (" in table
    read = Tuned.read(tmp_path / "tuned.json")  # held values are the config's, not tuned ones: --tuned skips them
    assert read.chosen == {"fedent": {"train.lr": 0.03}}
    assert read.config_sets("fedent", "fedent")[0] == "train.lr=0.03"
    assert read.algorithm_options("fedent", "fedent") == {}
    for only, grids, why in (
            (["algorithm.mu"], None, "--knobs: algorithm.mu: not a knob of fedent"),
            ([], None, "--knobs: expected a comma-separated list"),
            (["train.lr", "train.lr"], None, "--knobs: duplicate entries"),
            (["algorithm.beta"], {"fedent.algorithm.gamma": [0.9, 0.99]}, "--grid fedent.algorithm.gamma: that knob "
                                                                            "is not tuned")):
        with pytest.raises(ConfigError, match=why):
            tuner.tune_all(["fedent"], grids, only=only)
    with pytest.raises(ConfigError, match="algorithm.beta: not a knob of fedavg"):  # fedavg would tune nothing
        tuner.tune_all(["fedent", "fedavg"], None, only=["algorithm.beta"])
    assert tuner.runs == 3  # no error trained anything


def test_knobs_reach_every_search_of_a_pool(tmp_path: Path) -> None:
    """tune_all with a pool hands --knobs to each algorithm's thread: FedEnt's β and γ stay untried there too."""
    with ThreadPoolExecutor(4) as pool:
        results = Tuner(tiny_config(), [0], tmp_path, fraction=0.2, tail_k=1, run=lambda c, d, i: _lr_peaked(c),
                        inputs_for=_inputs, pool=pool).tune_all(["fedent", "fedprox"], {"train.lr": [0.01, 0.03, 0.1]},
                                                                only=["train.lr"])
    assert [[(k.key, k.tuned, len(k.tried)) for k in r.knobs] for r in results] == [
        [("train.lr", True, 3), ("algorithm.beta", False, 0), ("algorithm.gamma", False, 0)],
        [("train.lr", True, 3), ("algorithm.mu", False, 0)]]
    assert [r.runs for r in results] == [3, 3]
