"""docker-compose.yml and the Dockerfile, checked statically (no Docker engine runs here).

Each service's command is parsed with the real argparse parser of the module it runs, so a renamed or
removed flag breaks this test; ports, addresses, healthchecks, depends_on conditions, GPU reservations,
token files and volumes must agree with each other; the Dockerfile gets a basic lint.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
WORKERS = sorted(n for n in SERVICES if n.startswith("worker"))


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def parser_of(main: Callable[[list[str]], Any]) -> argparse.ArgumentParser:
    """The parser a ``main(argv)`` builds, caught at its first ``parse_args`` (for mains without a builder)."""
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *a: Any, **k: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        main([])
    except _Captured as c:
        return c.parser
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    raise AssertionError("main() never parsed its arguments")


def module_parser(module: str) -> argparse.ArgumentParser:
    mod = importlib.import_module(module)
    if hasattr(mod, "build_parser"):
        return mod.build_parser()
    return parser_of(mod.main)


def fedent_parser(subcommand: str) -> argparse.ArgumentParser:
    """``fedent``'s parser with the one subcommand used (registered by the module fedent.cli dispatches to)."""
    from fedent.cli import subcommands

    commands = subcommands()
    assert subcommand in commands, f"fedent has no subcommand {subcommand!r}"
    p = argparse.ArgumentParser(prog="fedent")
    sub = p.add_subparsers(dest="command", required=True)
    importlib.import_module(commands[subcommand]).add_parser(sub)
    return p


class _ParseError(Exception):
    pass


def parse(argv: list[str]) -> tuple[str, argparse.Namespace]:
    """(module or 'fedent', parsed namespace) for a container command, with the real parser."""
    if argv[:2] == ["python", "-m"]:
        module, rest = argv[2], argv[3:]
        parser = module_parser(module + ".__main__" if module in ("server", "client", "estimator") else module)
    elif argv[0] == "fedent":
        module, rest, parser = "fedent", argv[1:], fedent_parser(argv[1])
    else:
        raise AssertionError(f"unexpected command {argv}")

    def fail(message: str) -> None:
        raise _ParseError(f"{module}: {message}")

    parser.error = fail  # type: ignore[method-assign]
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        for sp in getattr(action, "choices", {}).values():
            sp.error = fail
    return module, parser.parse_args(rest)


def command(service: str) -> list[str]:
    cmd = SERVICES[service]["command"]
    return shlex.split(cmd) if isinstance(cmd, str) else [str(x) for x in cmd]


PARSED = {name: parse(command(name)) for name in SERVICES}


def _port_of(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _published(service: str) -> set[int]:
    out = set()
    for spec in SERVICES[service].get("ports", []):
        host, _, container = str(spec).rpartition(":")
        assert host, f"{service}: publish ports as HOST:CONTAINER, got {spec}"
        out.add(int(container))
    return out


def _mounts(service: str) -> dict[str, str]:
    """container path -> volume name."""
    out = {}
    for v in SERVICES[service].get("volumes", []):
        src, dst = str(v).split(":")[:2]
        out[dst] = src
    return out


def _under_mount(service: str, path: str | Path) -> bool:
    return any(str(path) == m or str(path).startswith(m.rstrip("/") + "/") for m in _mounts(service))


# ---- commands against the real CLIs ------------------------------------------------------------------


def test_every_command_parses_with_the_real_parser() -> None:
    assert {"certs", "estimator", "aggregator"} <= set(SERVICES) and len(WORKERS) >= 1
    assert PARSED["estimator"][0] == "estimator" and PARSED["aggregator"][0] == "server"
    assert all(PARSED[w][0] == "client" for w in WORKERS)
    assert PARSED["certs"][0] == "fedent" and PARSED["certs"][1].command == "certs"


def test_the_parse_check_catches_a_bad_flag() -> None:
    with pytest.raises(_ParseError, match="unrecognized arguments: --no-such-flag"):
        parse(["python", "-m", "estimator", "--no-such-flag"])
    with pytest.raises(_ParseError):
        parse(["python", "-m", "server", "--port", "1"])  # --config is required


def test_ports_addresses_and_published_ports_agree() -> None:
    est, agg = PARSED["estimator"][1], PARSED["aggregator"][1]
    assert est.host == agg.host == "0.0.0.0"  # reachable from the other containers
    assert _port_of(agg.estimator) == ("estimator", est.port)
    assert _published("estimator") == {est.port}
    assert _published("aggregator") == {agg.port, agg.dashboard_port}
    for w in WORKERS:
        args = PARSED[w][1]
        assert _port_of(args.aggregator) == ("aggregator", agg.port)
        assert _port_of(args.estimator) == ("estimator", est.port)


def test_workers_cover_every_client_of_the_config_once() -> None:
    from client.worker import parse_client_ids
    from fedent.config import load_config

    agg = PARSED["aggregator"][1]
    cfg = load_config(str(ROOT / agg.config), agg.set)
    hosted = [c for w in WORKERS for c in parse_client_ids(PARSED[w][1].clients)]
    assert sorted(hosted) == list(range(cfg.data.num_clients))
    names = [PARSED[w][1].name for w in WORKERS]
    assert names == WORKERS  # worker names are their token identities below


def test_tls_material_and_tokens_come_from_the_certs_service() -> None:
    certs = PARSED["certs"][1]
    pki = Path(certs.out)
    assert {"aggregator", "estimator"} <= set(certs.hosts)  # the names the others dial
    for w in WORKERS:
        args = PARSED[w][1]
        assert args.token_file == pki / "tokens" / f"{args.name}.token" and args.name in certs.workers
        assert args.tls_ca == pki / "ca.crt" and not args.insecure
    for name in ("estimator", "aggregator"):
        args = PARSED[name][1]
        assert (args.tls_cert, args.tls_key, args.tls_ca) == (pki / "server.crt", pki / "server.key", pki / "ca.crt")
        assert args.token_file == pki / "tokens.json" and not args.insecure
    agg = PARSED["aggregator"][1]
    assert agg.estimator_token_file == str(pki / "tokens" / "aggregator.token") and "aggregator" in certs.workers
    for name in SERVICES:
        assert _mounts(name).get(str(pki)) == _mounts("certs")[str(pki)], f"{name} must mount the PKI volume"


def test_run_state_lives_in_volumes() -> None:
    assert _under_mount("aggregator", PARSED["aggregator"][1].out)
    assert _under_mount("estimator", PARSED["estimator"][1].run_dir)
    for w in WORKERS:
        assert _under_mount(w, PARSED[w][1].state_dir)
    declared = set(COMPOSE.get("volumes", {}))
    for name in SERVICES:
        assert set(_mounts(name).values()) <= declared, name


def test_aggregator_config_exists_in_the_image() -> None:
    agg = PARSED["aggregator"][1]
    assert (ROOT / agg.config).is_file()
    assert "COPY configs ./configs" in (ROOT / "Dockerfile").read_text()


# ---- healthchecks, start order, GPUs -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["estimator", "aggregator"])
def test_healthchecks_probe_the_service_port_with_the_real_probe(name: str) -> None:
    hc = SERVICES[name]["healthcheck"]
    test = hc["test"]
    assert test[0] == "CMD"
    module, args = parse(test[1:])
    assert module == "server.healthcheck"
    assert _port_of(args.address) == ("localhost", PARSED[name][1].port)
    assert args.tls_ca == PARSED[name][1].tls_ca  # TLS servers need the CA to be probed
    for key in ("interval", "timeout", "retries"):
        assert key in hc


def test_depends_on_waits_for_health() -> None:
    conds = {n: {d: c["condition"] for d, c in SERVICES[n].get("depends_on", {}).items()} for n in SERVICES}
    assert conds["estimator"] == {"certs": "service_completed_successfully"}
    assert conds["aggregator"] == {"estimator": "service_healthy"}
    for w in WORKERS:
        assert conds[w] == {"aggregator": "service_healthy", "estimator": "service_healthy"}
    for n, deps in conds.items():
        for dep, cond in deps.items():
            assert dep in SERVICES, f"{n} depends on unknown service {dep}"
            if cond == "service_healthy":
                assert "healthcheck" in SERVICES[dep], f"{n} waits for {dep}'s health but it has no healthcheck"


@pytest.mark.parametrize("worker", WORKERS)
def test_workers_reserve_an_nvidia_gpu_and_use_cuda(worker: str) -> None:
    devices = SERVICES[worker]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert PARSED[worker][1].device == "cuda"


def test_every_service_builds_the_one_image() -> None:
    images = {SERVICES[n].get("image") for n in SERVICES}
    builds = {str(SERVICES[n]["build"]["dockerfile"]) for n in SERVICES}
    assert len(images) == 1 and builds == {"Dockerfile"}
    (image,) = images
    assert image and not image.endswith(":latest") and ":" in image


# ---- Dockerfile lint ----------------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


DOCKERFILE = dockerfile_instructions((ROOT / "Dockerfile").read_text())


def test_dockerfile_starts_from_a_pinned_python_slim() -> None:
    assert DOCKERFILE[0][0] == "FROM"
    image = DOCKERFILE[0][1]
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", image), image
    for instr, args in DOCKERFILE:
        if instr == "FROM":
            assert ":" in args and not args.endswith(":latest"), args


def test_dockerfile_copies_only_existing_sources() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    copies = [args.split() for instr, args in DOCKERFILE if instr in ("COPY", "ADD")]
    assert copies
    for parts in copies:
        for src in parts[:-1]:
            assert not src.startswith("--"), "no COPY --from stages expected"
            assert (ROOT / src).exists(), f"COPY source {src} does not exist"
            assert src not in ignored, f"COPY source {src} is excluded by .dockerignore"
    copied = {p[0] for p in copies}
    for pkg in ("fedent", "fedentrpc", "server", "client", "estimator", "pyproject.toml"):
        assert pkg in copied, f"the image lacks {pkg}"


def test_dockerfile_installs_the_dataset_and_the_pinned_project() -> None:
    runs = " ".join(args for instr, args in DOCKERFILE if instr == "RUN")
    assert re.search(r"apt-get install [^&]*\bdataset-fashion-mnist\b", runs)
    assert "apt-get update" in runs
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {d.split("==")[0]: d for d in deps if d.startswith(("torch==", "torchvision=="))}
    assert set(pins) == {"torch", "torchvision"}
    for pin in pins.values():
        assert f'"{pin}"' in runs or f" {pin} " in f" {runs} ", f"the image must install {pin} (pyproject's pin)"
    assert re.search(r"pip install (\S+ )*\.(\s|$)", runs), "the project itself must be installed"
    users = [args for instr, args in DOCKERFILE if instr == "USER"]
    assert users and users[-1] not in ("root", "0")


def test_dockerignore_keeps_local_state_out_of_the_build_context() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "runs"} <= ignored
