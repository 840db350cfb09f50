"""Name -> strategy class. Each strategy's ``Options`` is its class in fedent.strategies.options (typed, validated
when built), so a strategy is built from ``AlgorithmConfig.options`` without parsing anything again."""

from __future__ import annotations

from typing import Any

from fedent.config import AlgorithmConfig, ConfigError
from fedent.strategies.base import Strategy
from fedent.strategies.fedavg import FedAvg

STRATEGIES: dict[str, type[Strategy]] = {
    FedAvg.name: FedAvg,
}


def _register_optional() -> None:
    """Import the other algorithm modules; each is one file (see fedent/strategies/)."""
    import importlib

    for mod in ("fedadam", "fedyogi", "fedprox", "feddyn", "fedcos", "fednorm", "fedent", "scaffold"):
        try:
            m = importlib.import_module(f"fedent.strategies.{mod}")
        except ModuleNotFoundError as e:
            if e.name == f"fedent.strategies.{mod}":
                continue
            raise
        cls = m.STRATEGY
        STRATEGIES[cls.name] = cls


_register_optional()


def strategy_class(name: str) -> type[Strategy]:
    """A built-in strategy by name, else a plug-in (import path or entry point ``fedent.strategies``)."""
    if name in STRATEGIES:
        return STRATEGIES[name]
    from fedent import plugins

    if plugins.is_import_path(name) or plugins.has_entry_point("strategies", name):
        cls: type[Strategy] = plugins.strategy_class(name)
        return cls
    listed = ", ".join(sorted(STRATEGIES))
    raise ConfigError(f"algorithm.name: unknown algorithm {name!r}; available: {listed}")


def build_strategy(spec: AlgorithmConfig, **kwargs: Any) -> Strategy:
    """Instantiate with the config's typed options; kwargs carry runtime collaborators (e.g. an estimator)."""
    return strategy_class(spec.name)(spec.options, **kwargs)  # type: ignore[call-arg]
