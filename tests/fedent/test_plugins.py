"""Plug-ins by import path and by entry point: resolved when the config is built, before any data loads;
every way to get one wrong is a one-line ConfigError naming the key."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fedent import plugins
from fedent.config import ConfigError, config_from_dict
from fedent.models import build_model
from fedent.strategies.registry import build_strategy

PLUGIN = '''
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fedent.config import StrategyOptions, option
from fedent.data import FedDataset
from fedent.strategies.base import AggregateResult, LocalSGDStrategy, weighted_average

LOADED = Path(__file__).with_name("loaded.marker")


def build(num_classes, in_channels, image_size, dropout):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, num_classes))


def load(cfg, seed):
    LOADED.write_text("loaded")
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(40, 1, 4, 4, generator=g), torch.arange(40) % 3
    return FedDataset("tiny", x[:30], y[:30], x[30:], y[30:], 3, 1, 4, "plugin")


def wrong_signature(a, b, c, d, e):
    return None


@dataclass(frozen=True)
class HalfOptions(StrategyOptions):
    algorithm = "half"
    shrink: float = option(0.5, "how far to move towards the average", gt=0, le=1)


class Half(LocalSGDStrategy):
    name = "half"
    Options = HalfOptions

    def __init__(self, options=None):
        self.options = options or HalfOptions()

    def aggregate(self, rnd, global_params, updates):
        avg = weighted_average(updates)
        s = self.options.shrink
        return AggregateResult([(1 - s) * g + s * a for g, a in zip(global_params, avg)])


class NotAStrategy:
    pass


from fedent.strategies.fedavg import FedAvg


class Shrunk(FedAvg):
    """FedAvg's capability and aggregate_sum inherited, its own aggregate: a sum would not be this."""

    name = "shrunk"

    def aggregate(self, rnd, global_params, updates):
        return AggregateResult([0.5 * (g + a) for g, a in zip(global_params, weighted_average(updates))])


from fedent.strategies.base import Strategy


class NoClientStep(Strategy):
    name = "noclient"
    Options = HalfOptions

    def aggregate(self, rnd, global_params, updates):
        return AggregateResult(list(global_params))
'''


@pytest.fixture
def plugin_pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module ``myplug`` importable from tmp_path, and a distribution there declaring entry points."""
    (tmp_path / "myplug.py").write_text(textwrap.dedent(PLUGIN))
    dist = tmp_path / "myplug-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[fedent.models]\ntiny-linear = myplug:build\n\n"
                                           "[fedent.datasets]\ntiny = myplug:load\n\n"
                                           "[fedent.strategies]\nhalf = myplug:Half\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("myplug", None)


def _cfg(**sections: object) -> dict[str, object]:
    base: dict[str, object] = {"data": {"name": "myplug:load", "num_clients": 3, "partition": "iid"},
                               "model": {"name": "myplug:build"}, "algorithm": {"name": "myplug:Half"}}
    base.update(sections)
    return base


def test_import_paths_build_model_dataset_and_strategy(plugin_pkg: Path) -> None:
    from fedent.inputs import load_inputs

    cfg = config_from_dict(_cfg(algorithm={"name": "myplug:Half", "shrink": 0.25}))
    assert type(cfg.algorithm.options).__name__ == "HalfOptions" and cfg.algorithm.options.shrink == 0.25  # type: ignore[attr-defined]
    assert not (plugin_pkg / "loaded.marker").exists(), "resolving must not load data"
    inputs = load_inputs(cfg)
    assert inputs.data.num_classes == 3 and inputs.num_clients == 3
    model = inputs.make_model()
    assert model(torch.zeros(2, 1, 4, 4)).shape == (2, 3)
    assert build_strategy(cfg.algorithm).name == "half"


def test_entry_point_names_work_like_built_ins(plugin_pkg: Path) -> None:
    cfg = config_from_dict(_cfg(data={"name": "tiny", "num_clients": 2, "partition": "iid"},
                                model={"name": "tiny-linear"}, algorithm={"name": "half"}))
    assert build_strategy(cfg.algorithm).options.shrink == 0.5  # type: ignore[attr-defined]
    assert build_model("tiny-linear", 3, 1, 4, 0.0, seed=1)(torch.zeros(1, 1, 4, 4)).shape == (1, 3)
    listed = {(a.kind, a.name, a.origin) for k in ("models", "datasets", "strategies") for a in plugins.available(k)}
    assert {("models", "tiny-linear", "myplug"), ("datasets", "tiny", "myplug"), ("strategies", "half", "myplug"),
            ("models", "mnist-cnn", "fedent")} <= listed


@pytest.mark.parametrize(("section", "needle"), [
    ({"model": {"name": "nosuchmod:build"}}, "model.name: cannot import module 'nosuchmod'"),
    ({"model": {"name": "myplug:nothing"}}, "model.name: module 'myplug' has no attribute 'nothing'"),
    ({"model": {"name": "myplug:wrong_signature"}}, "expected f(num_classes, in_channels, image_size, dropout)"),
    ({"data": {"name": "myplug:build"}}, "data.name: myplug:build has signature build("),
    ({"algorithm": {"name": "myplug:NotAStrategy"}}, "is not a fedent.strategies.base.Strategy subclass"),
    ({"algorithm": {"name": "myplug:Half", "shrink": 2}}, "algorithm.shrink: must be in (0, 1]"),
    ({"algorithm": {"name": "myplug:NoClientStep"}}, "defines no client step"),
    ({"algorithm": {"name": "nope"}}, "unknown algorithm 'nope'"),
    ({"model": {"name": "no-such-entry"}}, "model.name: unknown model 'no-such-entry'"),
])
def test_a_bad_plugin_is_one_config_error_before_data_loads(plugin_pkg: Path, section: dict[str, object],
                                                             needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict(_cfg(**section))
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (plugin_pkg / "loaded.marker").exists()


def test_worker_placement_needs_the_model_input_without_a_dataset(plugin_pkg: Path) -> None:
    data = {"name": "myplug:load", "num_clients": 3, "placement": "workers"}
    with pytest.raises(ConfigError, match="needs data.num_classes, data.in_channels and data.image_size"):
        config_from_dict(_cfg(data=data))
    with pytest.raises(ConfigError, match="needs a held-out set at the aggregator"):
        config_from_dict(_cfg(data={**data, "num_classes": 3, "in_channels": 1, "image_size": 4}))
    cfg = config_from_dict(_cfg(data={**data, "num_classes": 3, "in_channels": 1, "image_size": 4},
                                train={"evaluation": "federated"}))
    assert cfg.data.placement == "workers" and cfg.train.evaluation == "federated"


@pytest.mark.parametrize(("section", "needle"), [
    ({"model": {"name": "builtins:print"}}, "model.name: builtins:print is not a function defined in a plug-in"),
    ({"data": {"name": "subprocess:call"}}, "data.name: subprocess:call is not a function defined in a plug-in"),
    ({"model": {"name": "os:system"}}, "model.name: os:system is not a function defined in a plug-in"),
    ({"algorithm": {"name": "builtins:object"}}, "is not a fedent.strategies.base.Strategy subclass"),
])
def test_standard_library_and_builtin_callables_are_not_plugins(plugin_pkg: Path, section: dict[str, object],
                                                                needle: str) -> None:
    """``builtins:print`` and ``subprocess:call`` accept any arguments, so a signature check alone passes them:
    only a function defined in an importable module outside the standard library is a model or dataset."""
    with pytest.raises(ConfigError) as e:
        config_from_dict(_cfg(**section))
    assert needle in str(e.value) and "\n" not in str(e.value)


def _patched_print(*args: object, **kwargs: object) -> None:
    """What a library that patches ``builtins.print`` installs: a plain function of a non-stdlib module."""


def test_a_patched_builtin_is_still_not_a_plugin(plugin_pkg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray replaces ``builtins.print`` with a function of its own; ``builtins:print`` must stay refused, named
    through the standard library whatever the attribute holds (this failed in a full run with Ray installed)."""
    import builtins

    monkeypatch.setattr(builtins, "print", _patched_print)
    with pytest.raises(ConfigError) as e:
        config_from_dict(_cfg(model={"name": "builtins:print"}))
    assert "model.name: builtins:print is not a function defined in a plug-in" in str(e.value)
    assert "standard library module 'builtins'" in str(e.value)


@pytest.mark.parametrize(("body", "needle"), [
    ("import sys\nsys.exit(3)\n", "importing 'escapes' failed: SystemExit: 3"),
    ("raise SystemExit\n", "importing 'escapes' failed: SystemExit"),
    ("class Escape(BaseException):\n    pass\nraise Escape('out')\n", "importing 'escapes' failed: Escape: out"),
    ("raise GeneratorExit('gen')\n", "importing 'escapes' failed: GeneratorExit: gen"),
])
def test_import_time_escapes_are_one_config_error(plugin_pkg: Path, body: str, needle: str) -> None:
    """A plug-in module that calls sys.exit (or raises another BaseException) at import must not end the
    process silently: it is one config error naming the key."""
    (plugin_pkg / "escapes.py").write_text(body)
    try:
        with pytest.raises(ConfigError) as e:
            config_from_dict(_cfg(model={"name": "escapes:build"}))
    finally:
        sys.modules.pop("escapes", None)
    assert str(e.value).startswith("model.name: ") and needle in str(e.value) and "\n" not in str(e.value)


def test_an_entry_point_that_exits_at_load_is_one_config_error(plugin_pkg: Path) -> None:
    (plugin_pkg / "exitplug.py").write_text("import sys\nsys.exit('bye')\n")
    dist = plugin_pkg / "exitplug-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: exitplug\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[fedent.models]\nexits = exitplug:build\n")
    try:
        with pytest.raises(ConfigError) as e:
            config_from_dict(_cfg(model={"name": "exits"}))
    finally:
        sys.modules.pop("exitplug", None)
    assert "model.name: entry point 'exits' (exitplug:build) does not load: SystemExit: bye" in str(e.value)


def test_an_import_path_is_found_in_the_current_directory_after_the_installed_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A console script (fedent) has no current directory on sys.path; a project's plug-in beside its config
    (fedent new) is found there anyway, appended last so it never shadows an installed module."""
    (tmp_path / "cwd_only_model.py").write_text("def build(num_classes, in_channels, image_size, dropout):\n"
                                                "    import torch\n    return torch.nn.Linear(1, num_classes)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cwd_only_model", raising=False)
    obj = plugins.resolve("models", "cwd_only_model:build")
    assert obj.__module__ == "cwd_only_model" and sys.path[-1] == str(tmp_path)
    with pytest.raises(plugins.PluginError, match="cannot import module 'not_here_at_all'"):
        plugins.resolve("models", "not_here_at_all:build")
    sys.modules.pop("cwd_only_model", None)


def test_a_plugin_that_overrides_aggregate_but_inherits_the_sum_is_refused_secure_aggregation(
        plugin_pkg: Path) -> None:
    """It inherits FedAvg's ``secure_weighting`` and ``aggregate_sum``: under secure aggregation (or in a reduced
    multi-process round, ``sum_blocker``) it would silently run FedAvg's server step."""
    from fedent.rounds.distributed import sum_blocker
    from fedent.strategies.registry import strategy_class

    with pytest.raises(ConfigError, match="myplug:Shrunk cannot run under secure aggregation: shrunk overrides "
                                          "aggregate \\(Shrunk\\) without its own aggregate_sum \\(FedAvg's\\)"):
        config_from_dict(_cfg(algorithm={"name": "myplug:Shrunk"}, privacy={"secure_aggregation": True}))
    cfg = config_from_dict(_cfg(algorithm={"name": "myplug:Shrunk"}))
    why = sum_blocker(cfg, strategy_class("myplug:Shrunk"), 0)
    assert why is not None and "without its own aggregate_sum" in why
