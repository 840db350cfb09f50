"""Config loading: strict keys, types and values, one-line errors, --set overrides."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from fedent.config import (
    AlgorithmConfig,
    ConfigError,
    DataConfig,
    ExperimentConfig,
    ModelConfig,
    PrivacyConfig,
    TrainConfig,
    apply_overrides,
    config_from_dict,
    load_config,
)
from fedent.strategies.options import OPTIONS, FedEntOptions, FedNormOptions, FedProxOptions
from fedent.strategies.registry import strategy_class


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_defaults_and_values(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, "name: x\ntrain: {rounds: 3, lr: 0.1}\nalgorithm: {name: fedavg}\n"))
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.train.rounds == 3 and cfg.train.lr == 0.1 and cfg.algorithm.name == "fedavg"
    assert cfg.data.num_clients == 100 and cfg.train.fraction == 0.2


@pytest.mark.parametrize(
    "text, needle",
    [
        ("trian: {rounds: 3}\n", "unknown top-level key(s) trian"),
        ("train: {rounds: 3, lr_: 1}\n", "train: unknown key(s) lr_"),
        ("train: {rounds: three}\n", "train.rounds: expected an integer"),
        ("train: {fraction: 1.5}\n", "train.fraction: must be in (0, 1]"),
        ("data: {partition: random}\n", "data.partition"),
        ("algorithm: {name: fedbogus}\n", "unknown algorithm 'fedbogus'"),
        ("algorithm: {name: fedavg, mu: 0.1}\n", "algorithm: unknown key(s) mu"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("train: [1, 2\n", "not valid YAML"),
        ("train: {upload_encoding: int4}\n", "train.upload_encoding: must be one of none, int8, topk"),
        ("train: {upload_encoding: topk}\nalgorithm: {name: feddyn}\n",
         "train.upload_encoding: topk is not sound with feddyn"),
        ("train: {upload_encoding: topk}\nalgorithm: {name: scaffold}\n",
         "train.upload_encoding: topk is not sound with scaffold"),
        ("train: {topk_fraction: 0}\n", "train.topk_fraction"),
    ],
)
def test_bad_configs_have_one_line_errors(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, text))
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_overrides() -> None:
    raw = apply_overrides({"train": {"rounds": 1}}, ["train.rounds=5", "data.alpha=0.1", "name=y"])
    cfg = config_from_dict(raw)
    assert cfg.train.rounds == 5 and cfg.data.alpha == 0.1 and cfg.name == "y"
    with pytest.raises(ConfigError):
        apply_overrides({}, ["novalue"])


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


# ---- typed algorithm options ----------------------------------------------------------------------

FEDENT_YAML = "algorithm: {name: fedent, beta: 0.9, gamma: 0.5, variant: paper, estimator: online}\n"


def test_algorithm_options_are_the_strategys_typed_options(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, FEDENT_YAML))
    assert type(cfg.algorithm.options) is FedEntOptions
    assert cfg.algorithm.options == FedEntOptions(beta=0.9, gamma=0.5, variant="paper")
    assert cfg.algorithm.options_as(FedEntOptions) is cfg.algorithm.options
    assert cfg.algorithm.options_as(FedNormOptions) is None
    assert type(load_config(_write(tmp_path, "algorithm: {name: fedprox, mu: 1}\n")).algorithm.options.mu) is float
    for name, cls in OPTIONS.items():  # every strategy's Options is the class config loading builds
        assert strategy_class(name).Options is cls  # type: ignore[attr-defined]
        assert all(doc for doc in cls.docs().values()), f"{name}: every option has a doc line"


def test_to_dict_keeps_the_flat_layout_and_round_trips(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, FEDENT_YAML))
    algo = cfg.to_dict()["algorithm"]
    assert algo == {"name": "fedent", **FedEntOptions(beta=0.9, gamma=0.5, variant="paper").to_dict()}
    assert config_from_dict(yaml.safe_load(yaml.safe_dump(cfg.to_dict()))) == cfg
    fedavg = config_from_dict({"algorithm": {"name": "fedavg"}})
    # FedAvg's only options make it a control (a replay of a FedEnt run's rates); off by default
    assert fedavg.to_dict()["algorithm"] == {"name": "fedavg", "replay_rates": None, "replay": "per_client"}


def test_set_algorithm_name_drops_the_previous_algorithms_options(tmp_path: Path) -> None:
    path = _write(tmp_path, FEDENT_YAML)
    assert load_config(path, ["algorithm.name=fedavg"]).algorithm == AlgorithmConfig("fedavg")
    # the same name keeps the file's options; other keys still apply
    same = load_config(path, ["algorithm.name=fedent", "algorithm.gamma=0.7"]).algorithm.options
    assert same == FedEntOptions(beta=0.9, gamma=0.7, variant="paper")
    # options given with --set in the same call belong to the new algorithm, before or after the name
    for sets in (["algorithm.name=fednorm", "algorithm.beta=0.5"], ["algorithm.beta=0.5", "algorithm.name=fednorm"]):
        assert load_config(path, sets).algorithm == AlgorithmConfig("fednorm", FedNormOptions(beta=0.5))
    with pytest.raises(ConfigError, match=r"unknown key\(s\) beta for fedavg; allowed: replay, replay_rates"):
        load_config(path, ["algorithm.beta=0.5", "algorithm.name=fedavg"])
    # no algorithm section means fedent: switching from it starts empty too
    bare = _write(tmp_path, "train: {rounds: 2}\n")
    assert load_config(bare, ["algorithm.name=fedprox"]).algorithm.options == FedProxOptions()


@pytest.mark.parametrize(
    "algorithm, needle",
    [
        ("{name: fedavg, foo: 1}", "algorithm: unknown key(s) foo for fedavg; allowed: replay, replay_rates"),
        ("{name: fedcos, foo: 1}", "algorithm: unknown key(s) foo for fedcos; allowed: (none)"),
        ("{name: fedent, foo: 1, bar: 2}", "algorithm: unknown key(s) bar, foo for fedent; allowed: beta, eps1, eps2, "
                                           "estimator, eta_max, gamma, max_sweeps, offline_clients, phi2_rate, "
                                           "probe_batch_size, rates, shuffle_seed, variant"),
        ("{name: fedprox, mew: 1}", "allowed: mu"),
        ("{name: fedent, beta: 1}", "algorithm.beta: must be in (0, 1), got 1.0"),
        ("{name: fedent, gamma: -0.1}", "algorithm.gamma: must be in [0, 1], got -0.1"),
        ("{name: fedent, variant: magic}", "algorithm.variant: must be one of exact, paper, got 'magic'"),
        ("{name: fedent, estimator: 1}", "algorithm.estimator: must be one of online, offline, got 1"),
        ("{name: fedent, max_sweeps: 2.5}", "algorithm.max_sweeps: expected an integer, got 2.5"),
        ("{name: fedent, probe_batch_size: 0}", "algorithm.probe_batch_size: must be >= 1 or null, got 0"),
        ("{name: fedadam, beta1: true}", "algorithm.beta1: expected a number, got True"),
        ("{name: fedadam, tau: 0}", "algorithm.tau: must be > 0, got 0.0"),
        ("{name: 3}", "algorithm.name: expected a string"),
        ("[fedent]", "algorithm: expected a mapping"),
    ],
)
def test_option_errors_are_one_line_and_name_the_key(tmp_path: Path, algorithm: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, f"algorithm: {algorithm}\n"))
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_options_validate_however_they_are_built() -> None:
    """Direct construction checks too, so a strategy never receives an unchecked object."""
    with pytest.raises(ConfigError, match="algorithm.beta"):
        FedEntOptions(beta=1.5)
    with pytest.raises(ConfigError, match="FedNormOptions given for fedent"):
        AlgorithmConfig("fedent", FedNormOptions())
    assert AlgorithmConfig("fedent", {"beta": 0.5}) == AlgorithmConfig("fedent", FedEntOptions(beta=0.5))
    assert AlgorithmConfig().options == FedEntOptions()


def test_type_errors_name_the_expected_type_in_words() -> None:
    cases = {
        ("train", "rounds", "x"): "train.rounds: expected an integer, got 'x'",
        ("train", "lr", "fast"): "train.lr: expected a number, got 'fast'",
        ("data", "max_train_samples", "lots"): "data.max_train_samples: expected an integer or null, got 'lots'",
        ("train", "target_accuracy", "high"): "train.target_accuracy: expected a number or null, got 'high'",
        ("data", "download", "yes"): "data.download: expected true/false, got 'yes'",
    }
    for (section, key, value), message in cases.items():
        with pytest.raises(ConfigError) as info:
            config_from_dict({section: {key: value}})
        assert str(info.value) == message
        assert "|" not in str(info.value) and "None" not in str(info.value)


def test_every_bad_key_is_reported_at_once() -> None:
    raw = {"data": {"bogus": 1, "num_clients": "many"}, "model": {"dropout": 2.0},
           "train": {"rounds": "x", "lr": -1.0}, "algorithm": {"name": "nope"}}
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw)
    e = info.value
    assert len(e.problems) == 5, e.problems  # train.lr=-1 is range-checked once train.rounds has a type
    text = str(e)
    for needle in ("data: unknown key(s) bogus", "data.num_clients: expected an integer, got 'many'",
                   "train.rounds: expected an integer, got 'x'", "unknown algorithm 'nope'"):
        assert needle in text, text
    assert "\n" not in text


def test_every_out_of_range_value_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict({"train": {"rounds": 0, "lr": -1.0, "fraction": 2.0}, "model": {"dropout": 1.0}})
    assert info.value.problems == ["model.dropout: must be in [0, 1), got 1.0", "train.rounds: must be >= 1, got 0",
                                   "train.fraction: must be in (0, 1], got 2.0", "train.lr: must be > 0, got -1.0"]


# ---- the sections are declared like the strategy options (fedent.config.Declared) -------------------------


@pytest.mark.parametrize("section, key, value, why", [
    (DataConfig, "num_clients", 0, "data.num_clients: must be >= 1, got 0"),
    (DataConfig, "partition", "random", "data.partition: must be one of iid, pathological, dirichlet, got 'random'"),
    (DataConfig, "dirichlet_flavour", "row", "data.dirichlet_flavour: must be one of client, class, got 'row'"),
    (DataConfig, "image_size", 0, "data.image_size: must be >= 1 or null, got 0"),
    (ModelConfig, "dropout", 1.0, "model.dropout: must be in [0, 1), got 1.0"),
    (TrainConfig, "fraction", 0.0, "train.fraction: must be in (0, 1], got 0.0"),
    (TrainConfig, "executor", "threads", "train.executor: must be one of auto, sequential, vectorised, got 'threads'"),
    (TrainConfig, "device", "tpu", "train.device: must be auto, cpu, cuda or cuda:N"),
])
def test_a_section_built_directly_rejects_a_bad_value_naming_it(section: type, key: str, value: object,
                                                                why: str) -> None:
    with pytest.raises(ConfigError) as e:
        section(**{key: value})
    assert str(e.value) == why


@pytest.mark.parametrize("section, name", [(DataConfig, "data"), (ModelConfig, "model"), (TrainConfig, "train"),
                                           (PrivacyConfig, "privacy")])
def test_each_section_rejects_an_unknown_key_naming_it(section: type, name: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{name}: unknown key\(s\) bogus; allowed: "):
        config_from_dict({name: {"bogus": 1}})
    with pytest.raises(ConfigError, match=rf"^{name}: unknown key\(s\) bogus"):
        section.from_mapping({"bogus": 1})


def test_every_declared_field_has_a_doc() -> None:
    for cls in (DataConfig, ModelConfig, TrainConfig, PrivacyConfig, *OPTIONS.values()):
        missing = [k for k, doc in cls.docs().items() if not doc]
        assert not missing, f"{cls.__name__}: undocumented {missing}"


def test_misspelt_keys_get_a_did_you_mean_and_far_ones_none(tmp_path: Path) -> None:
    from fedent.config import did_you_mean, load_config

    assert did_you_mean(["trian"], ["train", "data"]) == " (did you mean train?)"
    assert did_you_mean(["lrr", "round", "xyzzy"], ["lr", "rounds", "seed"]) == \
        " (did you mean lrr -> lr, round -> rounds?)"
    assert did_you_mean(["xyzzy"], ["lr", "rounds"]) == ""
    cfg = tmp_path / "typo.yaml"
    cfg.write_text("name: x\ntrain: {round: 2}\nalgorithm: {name: fedent, betta: 0.5}\n")
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    assert "train: unknown key(s) round (did you mean rounds?)" in str(e.value)
    assert "algorithm: unknown key(s) betta for fedent (did you mean beta?)" in str(e.value)
    cfg.write_text("trian: {rounds: 2}\n")
    with pytest.raises(ConfigError, match=r"unknown top-level key\(s\) trian \(did you mean train\?\)"):
        load_config(cfg)


def test_a_yaml_error_names_its_line_and_column(tmp_path: Path) -> None:
    from fedent.config import load_config

    cfg = tmp_path / "bad.yaml"
    cfg.write_text("name: x\ntrain: {rounds: 2\n  lr: [0.1\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(cfg))}:\d+:\d+: not valid YAML"):
        load_config(cfg)


def test_a_packaged_config_is_found_by_name_outside_the_repository(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The example configs are package data (importlib.resources): from a directory without configs/,
    --config demo, demo.yaml and configs/demo.yaml load the shipped file; an unknown name lists some."""
    from fedent.config import load_config, packaged_config, packaged_config_names

    monkeypatch.chdir(tmp_path)
    assert {"demo", "mnist-iid"} <= set(packaged_config_names())
    for name in ("demo", "demo.yaml", "configs/demo.yaml"):
        cfg = load_config(name)
        assert cfg.name == "demo" and cfg.train.rounds == 5
    assert packaged_config("nope") is None and packaged_config("../demo") is None
    with pytest.raises(ConfigError, match=r"config file not found: nope \(or name a packaged config: .*demo"):
        load_config("nope")


@pytest.mark.parametrize("privacy, needle", [
    ({"secure_aggregation": True, "dp": "central"}, "privacy.secure_aggregation: central DP clips each update"),
    ({"dp": "local", "adaptive_clip": True}, "privacy.adaptive_clip: applies to dp: central only"),
    ({"dp": "global"}, "privacy.dp: must be one of none, central, local"),
    ({"dp": "central", "clip_norm": 0}, "privacy.clip_norm: must be > 0"),
    ({"dp": "central", "delta": 1.0}, "privacy.delta: must be in (0, 1)"),
    ({"dp": "central", "noise_multiplier": 0, "target_epsilon": 3}, "privacy.target_epsilon: noise_multiplier 0"),
    ({"dp": "central", "adaptive_clip": True, "clipped_count_stddev": 0.4}, "privacy.clipped_count_stddev: must "
                                                                             "exceed noise_multiplier / 2 = 0.5"),
    ({"epsilon": 3}, "privacy: unknown key(s) epsilon"),
])
def test_bad_privacy_sections_are_config_errors_naming_the_key(privacy: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict({"privacy": privacy})
    assert needle in str(e.value)


def test_the_privacy_section_round_trips() -> None:
    # local DP runs on either executor (tests/fedent/rounds/test_vectorised.py): no combination refused
    assert config_from_dict({"privacy": {"dp": "local"}, "train": {"executor": "vectorised"}}).privacy.dp == "local"
    cfg = config_from_dict({"privacy": {"dp": "central", "noise_multiplier": 0.8, "target_epsilon": 8}})
    assert cfg.privacy.dp == "central" and cfg.privacy.noise_multiplier == 0.8 and cfg.privacy.target_epsilon == 8.0
    assert config_from_dict(cfg.to_dict()) == cfg
    # without DP the section is left out, so runs (and checkpoints) keep the config they had before it existed
    assert "privacy" not in config_from_dict({}).to_dict()


# ---- privacy: secure aggregation (branch secagg) ----


def test_strategies_that_need_individual_updates_are_config_errors() -> None:
    raw = {"data": {"name": "synthetic"}, "algorithm": {"name": "fedcos"}, "privacy": {"secure_aggregation": True}}
    with pytest.raises(ConfigError, match="privacy.secure_aggregation: fedcos cannot run under secure aggregation: "
                                          "its weights are each client's cosine"):
        config_from_dict(raw)
    raw = {"data": {"name": "synthetic"}, "train": {"local_eval": 2}, "privacy": {"secure_aggregation": True}}
    with pytest.raises(ConfigError, match="train.local_eval"):
        config_from_dict(raw)
    ok = config_from_dict({"data": {"name": "synthetic"}, "algorithm": {"name": "fedcos"}})
    assert ok.privacy.secure_aggregation is False
    on = config_from_dict({"data": {"name": "synthetic"}, "privacy": {"secure_aggregation": True}})
    assert on.privacy.secure_aggregation is True and on.to_dict()["privacy"]["secure_aggregation"] is True


def test_privacy_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="privacy.secagg_threshold"):
        config_from_dict({"privacy": {"secagg_threshold": 0.4}})
    with pytest.raises(ConfigError, match="privacy.secagg_frac_bits"):
        config_from_dict({"privacy": {"secagg_ring_bits": 32, "secagg_frac_bits": 30}})


def test_the_secure_aggregation_threat_model_defaults_to_malicious_and_is_checked() -> None:
    assert config_from_dict({}).privacy.secagg_threat == "malicious"
    hbc = config_from_dict({"privacy": {"secure_aggregation": True, "secagg_threat": "honest-but-curious"}})
    assert hbc.privacy.secagg_threat == "honest-but-curious"
    with pytest.raises(ConfigError, match="privacy.secagg_threat"):
        config_from_dict({"privacy": {"secagg_threat": "paranoid"}})
