"""Your own model, dataset and strategy: found by import path (``pkg.mod:attr``) or by an installed package's
entry point (groups ``fedent.models``, ``fedent.datasets``, ``fedent.strategies``), checked once at config time.

Why here and not in each registry: the three lookups share the rules (import path vs entry-point name, a
missing module, attribute or wrong signature is one ``PluginError`` line naming the config key) and must run
*before* any data loads, when the config is built. The built-in names never reach this module's resolver.
The interfaces (exact signatures) are documented in docs/extending.md.

Only objects of the right kind are accepted (issue 25): a model or dataset is a Python function defined in a
module outside the standard library (``builtins:print`` or ``subprocess:call`` accept any arguments, so a
signature check alone would pass them), a strategy a ``Strategy`` subclass. A plug-in module that escapes at
import (``sys.exit``, any other ``BaseException`` but a Ctrl-C) is one config error, never a silent exit.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

from fedent.config import ConfigError

Kind = Literal["models", "datasets", "strategies"]
GROUPS: dict[Kind, str] = {"models": "fedent.models", "datasets": "fedent.datasets",
                           "strategies": "fedent.strategies"}
KEYS: dict[Kind, str] = {"models": "model.name", "datasets": "data.name", "strategies": "algorithm.name"}
# what a plug-in of each kind is called with (a wrong signature is refused before anything runs)
MODEL_ARGS = ("num_classes", "in_channels", "image_size", "dropout")
DATASET_ARGS = ("cfg", "seed")


class PluginError(ConfigError):
    """A plug-in that cannot be used: missing module/attribute/entry point, wrong kind or signature."""


@dataclass(frozen=True)
class Available:
    """One name ``fedent plugins`` lists: what it is, where it comes from (built-in or a distribution)."""

    kind: Kind
    name: str
    target: str  # "built-in", or the entry point's "module:attr"
    origin: str  # "fedent", or the distribution that declares the entry point


def is_import_path(name: str) -> bool:
    return ":" in name


def _entry_point(kind: Kind, name: str) -> Any:
    for ep in entry_points(group=GROUPS[kind]):
        if ep.name == name:
            return ep
    return None


def _import(kind: Kind, ref: str) -> Any:
    """``module:attr`` (attr may be dotted) -> the object; one-line PluginError otherwise."""
    key = KEYS[kind]
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise PluginError(f"{key}: {ref!r} is not an import path; expected 'package.module:attribute'")
    try:
        obj: Any = _import_module(module)
    except ModuleNotFoundError as e:
        raise PluginError(f"{key}: cannot import module {module!r} ({e}); is it installed or on PYTHONPATH?") \
            from None
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 (the plug-in's own import-time error or sys.exit: one line)
        raise PluginError(f"{key}: importing {module!r} failed: {_escape(e)}") from None
    for part in attr.split("."):
        try:
            found, obj = hasattr(obj, part), getattr(obj, part, None)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 (a module __getattr__ or property that escapes)
            raise PluginError(f"{key}: {ref!r}: reading {part!r} failed: {_escape(e)}") from None
        if not found:
            raise PluginError(f"{key}: module {module!r} has no attribute {attr!r}")
    return obj


def _escape(e: BaseException) -> str:
    """``SystemExit: 3`` (one line) for whatever a plug-in raised."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _import_module(module: str) -> Any:
    """``module``, also from the current directory when it is not on sys.path (as ``python -m`` has it): a
    console script such as ``fedent`` does not put it there, and a project made by ``fedent new`` keeps its
    plug-ins beside its config. Only a module not found otherwise is looked for there."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        top = module.split(".")[0]
        cwd = os.getcwd()
        if e.name != top or cwd in sys.path or "" in sys.path or not (
                Path(cwd, top + ".py").is_file() or Path(cwd, top, "__init__.py").is_file()):
            raise
        sys.path.append(cwd)  # after everything installed: a local file never shadows a package
        return importlib.import_module(module)


def resolve(kind: Kind, name: str) -> Any:
    """The object behind a plug-in ``name`` (an import path or an entry-point name), checked for its kind."""
    if is_import_path(name):
        obj, where = _import(kind, name), name
    else:
        ep = _entry_point(kind, name)
        if ep is None:
            raise PluginError(f"{KEYS[kind]}: unknown {kind[:-1] if kind != 'strategies' else 'strategy'} "
                              f"{name!r}; available: {', '.join(a.name for a in available(kind))} "
                              "(or an import path 'package.module:attribute')")
        try:
            obj = ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 (sys.exit at import included: one config error)
            raise PluginError(f"{KEYS[kind]}: entry point {name!r} ({ep.value}) does not load: "
                              f"{_escape(e)}") from None
        where = f"{name} ({ep.value})"
    CHECKS[kind](obj, where)
    if is_import_path(name):
        _check_named_outside_stdlib(kind, name)
    return obj


def _check_named_outside_stdlib(kind: Kind, ref: str) -> None:
    """A path through the standard library (``builtins:print``) is refused whatever the attribute holds now: a
    library that patches ``builtins.print`` with a function of its own (Ray does) must not make it a plug-in."""
    top = ref.partition(":")[0].partition(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        what = "a strategy" if kind == "strategies" else "a function"
        raise PluginError(f"{KEYS[kind]}: {ref} is not {what} defined in a plug-in module (it is named through "
                          f"the standard library module {top!r})")


def _check_callable(obj: Any, where: str, kind: Kind, args: tuple[str, ...]) -> None:
    key = KEYS[kind]
    if not callable(obj) or isinstance(obj, type):
        raise PluginError(f"{key}: {where} is not a function (got {type(obj).__name__}); "
                          f"expected {_signature_text(args)}")
    home = _plugin_module(obj)
    if not inspect.isfunction(obj) or home is None:
        raise PluginError(f"{key}: {where} is not a function defined in a plug-in module (got "
                          f"{type(obj).__name__} from {getattr(obj, '__module__', None) or '?'}); expected "
                          f"{_signature_text(args)} in a module of yours")
    try:
        inspect.signature(obj).bind(*args)
    except TypeError:
        raise PluginError(f"{key}: {where} has signature {_signature(obj)}, expected {_signature_text(args)}") \
            from None
    except ValueError:  # builtins without a signature: accept, the call will tell
        return


def _plugin_module(obj: Any) -> str | None:
    """The module that defines ``obj`` when it is an importable module outside the standard library (and
    builtins), else None: what a model, dataset or strategy plug-in must come from."""
    module = getattr(obj, "__module__", None)
    if not isinstance(module, str) or not module:
        return None
    top = module.partition(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names or top == "__main__":
        return None
    if module not in sys.modules:
        try:
            importlib.import_module(module)
        except KeyboardInterrupt:
            raise
        except BaseException:  # noqa: BLE001 (not importable: not a plug-in module)
            return None
    return module


def _signature(obj: Any) -> str:
    try:
        return f"{getattr(obj, '__name__', 'f')}{inspect.signature(obj)}"
    except (TypeError, ValueError):
        return "(unknown)"


def _signature_text(args: tuple[str, ...]) -> str:
    return f"f({', '.join(args)})"


def check_model(obj: Any, where: str) -> None:
    _check_callable(obj, where, "models", MODEL_ARGS)


def check_dataset(obj: Any, where: str) -> None:
    _check_callable(obj, where, "datasets", DATASET_ARGS)


def check_strategy(obj: Any, where: str) -> None:
    from fedent.config import StrategyOptions
    from fedent.strategies.base import Strategy

    key = KEYS["strategies"]
    if not (isinstance(obj, type) and issubclass(obj, Strategy)):
        raise PluginError(f"{key}: {where} is not a fedent.strategies.base.Strategy subclass")
    if _plugin_module(obj) is None:
        raise PluginError(f"{key}: {where} is not defined in an importable module ({obj.__module__!r})")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        raise PluginError(f"{key}: {where} leaves abstract method(s) {missing} unimplemented")
    if obj.plan_fit is Strategy.plan_fit and obj.fit is Strategy.fit:
        raise PluginError(f"{key}: {where} defines no client step: implement plan_fit (or subclass "
                          "LocalSGDStrategy for FedAvg's), or override fit")
    opts = getattr(obj, "Options", None)
    if not (isinstance(opts, type) and issubclass(opts, StrategyOptions)):
        raise PluginError(f"{key}: {where} needs an Options class attribute (a StrategyOptions dataclass)")
    if not isinstance(getattr(obj, "name", None), str) or not obj.name:
        raise PluginError(f"{key}: {where} needs a class attribute name = '...' (shown in records)")


CHECKS: dict[Kind, Callable[[Any, str], None]] = {"models": check_model, "datasets": check_dataset,
                                                  "strategies": check_strategy}


def builtin_names(kind: Kind) -> list[str]:
    if kind == "models":
        from fedent.models import MODELS

        return list(MODELS)
    if kind == "datasets":
        from fedent.data.datasets import DATASETS

        return list(DATASETS)
    from fedent.strategies.options import OPTIONS

    return list(OPTIONS)


def available(kind: Kind) -> list[Available]:
    """Built-in names first, then every installed entry point of the kind's group (sorted by name)."""
    out = [Available(kind, n, "built-in", "fedent") for n in builtin_names(kind)]
    for ep in sorted(entry_points(group=GROUPS[kind]), key=lambda e: e.name):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "?"
        out.append(Available(kind, ep.name, ep.value, dist))
    return out


def has_entry_point(kind: Kind, name: str) -> bool:
    return _entry_point(kind, name) is not None


def check_placement(data: Any, train: Any) -> None:
    """With ``data.placement: workers`` the aggregator reads no dataset, so it must know the model's input
    without one (a built-in data.name, or data.num_classes/in_channels/image_size), and server-side evaluation
    needs a held-out set it can read (data.server_test, or a built-in data.name's test split)."""
    if data.placement != "workers":
        if data.server_test is not None:
            raise ConfigError("data.server_test: only used with data.placement: workers")
        return
    builtin = is_builtin("datasets", data.name)
    shape = (data.num_classes, data.in_channels, data.image_size)
    if not builtin and None in shape:
        raise ConfigError(f"data.placement: workers with data.name {data.name!r} (not a built-in dataset) needs "
                          "data.num_classes, data.in_channels and data.image_size (the model's input)")
    if train.evaluation == "server" and not builtin and data.server_test is None:
        raise ConfigError("train.evaluation: server with data.placement: workers needs a held-out set at the "
                          "aggregator: set data.server_test (a .npz/.pt file with x and y) or use "
                          "train.evaluation: federated")


def is_builtin(kind: Kind, name: str) -> bool:
    return not is_import_path(name) and name in builtin_names(kind)


def model_factory(name: str) -> Callable[..., Any]:
    """A plug-in model's ``build(num_classes, in_channels, image_size, dropout) -> nn.Module``."""
    fn: Callable[..., Any] = resolve("models", name)
    return fn


def dataset_loader(name: str) -> Callable[..., Any]:
    """A plug-in dataset's ``load(cfg: DataConfig, seed: int) -> FedDataset``."""
    fn: Callable[..., Any] = resolve("datasets", name)
    return fn


def strategy_class(name: str) -> Any:
    """A plug-in strategy class (a ``Strategy`` subclass with ``name`` and ``Options``)."""
    return resolve("strategies", name)


def check_names(data_name: str, model_name: str) -> None:
    """Config-time check of data.name and model.name (the algorithm is checked by AlgorithmConfig): a plug-in
    that cannot be resolved is an error now, before any data loads."""
    problems: list[str] = []
    for kind, name in (("datasets", data_name), ("models", model_name)):
        if is_builtin(kind, name):  # type: ignore[arg-type]
            continue
        try:
            resolve(kind, name)  # type: ignore[arg-type]
        except PluginError as e:
            problems.extend(e.problems)
    if problems:
        raise PluginError(problems=problems) if len(problems) > 1 else PluginError(problems[0])
