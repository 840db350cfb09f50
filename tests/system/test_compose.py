"""docker-compose.yml, docker-compose.gpu.yml and the Dockerfile, checked statically (tools/compose_check.py,
``make compose-check``, runs them for real).

Each service's command is parsed with the real argparse parser of the module it runs, so a renamed or
removed flag breaks this test; ports, addresses, healthchecks, depends_on conditions, GPU reservations,
token files and volumes must agree with each other; the Dockerfile gets a basic lint. Variables
(``${VAR:-default}``) are read with their defaults, as Compose does on a host that sets none.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml
from cli_parsers import ParseError as _ParseError
from cli_parsers import parse

ROOT = Path(__file__).resolve().parents[2]
_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(value: Any, env: dict[str, str] | None = None) -> Any:
    """Compose's ``${VAR}`` / ``${VAR:-default}`` substitution (``$$`` is a literal ``$``), recursively."""
    env = env or {}
    if isinstance(value, str):
        return _VAR.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value.replace("$$", "\0")
                        ).replace("\0", "$")
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def load_compose(*names: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The files merged as ``-f a -f b`` does for what these files use: services' keys replaced, maps merged."""
    merged: dict[str, Any] = {}
    for name in names:
        doc = interpolate(yaml.safe_load((ROOT / name).read_text()), env)
        for key, value in doc.items():
            if key == "services":
                for svc, conf in value.items():
                    merged.setdefault("services", {}).setdefault(svc, {}).update(conf)
            elif isinstance(value, dict):
                merged.setdefault(key, {}).update(value)
            else:
                merged[key] = value
    return merged


COMPOSE = load_compose("docker-compose.yml")
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
GPU = load_compose("docker-compose.yml", "docker-compose.gpu.yml")
WORKERS = sorted(n for n in SERVICES if n.startswith("worker"))


def commands(service: str, services: dict[str, dict[str, Any]] | None = None) -> list[list[str]]:
    """The commands a service runs: one, or the ``&&`` steps of an ``sh -c`` line (``exec`` dropped)."""
    cmd = (services or SERVICES)[service]["command"]
    argv = shlex.split(cmd) if isinstance(cmd, str) else [str(x) for x in cmd]
    if argv[:2] != ["sh", "-c"]:
        return [argv]
    assert len(argv) == 3, f"{service}: sh -c takes one script"
    steps = [shlex.split(part) for part in argv[2].split("&&")]
    assert all(";" not in part and "||" not in part for part in argv[2].split("&&")), "only && chains"
    return [step[1:] if step[0] == "exec" else step for step in steps]


def command(service: str, services: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """The service's own process: the last step (the one ``exec``'d)."""
    return commands(service, services)[-1]


PARSED = {name: parse(command(name)) for name in SERVICES}
CERTS = parse(commands("estimator")[0])[1]  # the estimator's first step makes the PKI


def _port_of(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _published(service: str) -> dict[int, tuple[str, int]]:
    """container port -> (host address, host port)."""
    out = {}
    for spec in SERVICES[service].get("ports", []):
        parts = str(spec).split(":")
        assert len(parts) == 3, f"{service}: publish ports as ADDRESS:HOST_PORT:CONTAINER_PORT, got {spec}"
        out[int(parts[2])] = (parts[0], int(parts[1]))
    return out


def _mounts(service: str) -> dict[str, str]:
    """container path -> volume name (with ':ro' when read-only)."""
    out = {}
    for v in SERVICES[service].get("volumes", []):
        parts = str(v).split(":")
        out[parts[1]] = parts[0] + (":ro" if parts[2:] == ["ro"] else "")
    return out


def _under_mount(service: str, path: str | Path) -> bool:
    return any(str(path) == m or str(path).startswith(m.rstrip("/") + "/") for m in _mounts(service))


# ---- commands against the real CLIs ------------------------------------------------------------------


def test_every_command_parses_with_the_real_parser() -> None:
    assert {"estimator", "aggregator"} <= set(SERVICES) and len(WORKERS) >= 1
    assert PARSED["estimator"][0] == "estimator" and PARSED["aggregator"][0] == "server"
    assert all(PARSED[w][0] == "client" for w in WORKERS)
    assert [parse(c)[0] for c in commands("estimator")] == ["fedent", "estimator"]
    assert CERTS.command == "certs"
    gpu = GPU["services"]
    for w in WORKERS:
        assert parse(command(w, gpu))[0] == "client"


def test_the_parse_check_catches_a_bad_flag() -> None:
    with pytest.raises(_ParseError, match="unrecognized arguments: --no-such-flag"):
        parse(["python", "-m", "estimator", "--no-such-flag"])
    with pytest.raises(_ParseError):
        parse(["python", "-m", "server", "--port", "1"])  # --config is required
    with pytest.raises(_ParseError):
        parse(["fedent", "certs", "--out", "/pki", "--if-missing", "--force"])  # exclusive


def test_the_sh_steps_are_split_as_the_shell_runs_them() -> None:
    services = {"x": {"command": ["sh", "-c", "fedent certs --out /p --if-missing && exec python -m estimator"]}}
    assert commands("x", services) == [["fedent", "certs", "--out", "/p", "--if-missing"],
                                       ["python", "-m", "estimator"]]


def test_variables_take_their_defaults_or_the_environment() -> None:
    assert interpolate("${A:-x}:${B-y}:$${C}") == "x:y:${C}"
    assert interpolate(["${A:-x}"], {"A": "z"}) == ["z"]
    raw = (ROOT / "docker-compose.yml").read_text()
    assert "!reset" not in raw and "!override" not in raw  # Compose v1 cannot read these tags
    changed = load_compose("docker-compose.yml", env={"FEDENT_ROUNDS": "3", "FEDENT_DASHBOARD_PORT": "9000",
                                                      "FEDENT_BIND": "0.0.0.0"})["services"]
    assert "train.rounds=3" in changed["aggregator"]["command"]
    assert "0.0.0.0:9000:8080" in changed["aggregator"]["ports"]


def test_ports_addresses_and_published_ports_agree() -> None:
    est, agg = PARSED["estimator"][1], PARSED["aggregator"][1]
    assert est.host == agg.host == "0.0.0.0"  # reachable from the other containers
    assert _port_of(agg.estimator) == ("estimator", est.port)
    assert set(_published("estimator")) == {est.port}
    assert set(_published("aggregator")) == {agg.port, agg.dashboard_port}
    for w in WORKERS:
        args = PARSED[w][1]
        assert _port_of(args.aggregator) == ("aggregator", agg.port)
        assert _port_of(args.estimator) == ("estimator", est.port)
        assert not SERVICES[w].get("ports"), "workers serve nothing"


def test_ports_are_published_on_loopback_unless_asked() -> None:
    for name in ("estimator", "aggregator"):
        for container, (address, host_port) in _published(name).items():
            assert address == "127.0.0.1", f"{name}:{container} published on {address}"
            assert host_port == container
    raw = (ROOT / "docker-compose.yml").read_text()
    assert raw.count("${FEDENT_BIND:-127.0.0.1}:") == 3


def test_workers_cover_every_client_of_the_config_once() -> None:
    from client.worker import parse_client_ids
    from fedent.config import load_config

    agg = PARSED["aggregator"][1]
    cfg = load_config(str(ROOT / agg.config), agg.set)
    hosted = [c for w in WORKERS for c in parse_client_ids(PARSED[w][1].clients)]
    assert sorted(hosted) == list(range(cfg.data.num_clients))
    names = [PARSED[w][1].name for w in WORKERS]
    assert names == WORKERS  # worker names are their token identities below
    assert cfg.train.rounds == int(agg.set[0].split("=")[1]) == 5  # FEDENT_ROUNDS' default is the demo's


def test_tls_material_and_tokens_come_from_the_pki_step() -> None:
    pki = Path(CERTS.out)
    assert {"aggregator", "estimator"} <= set(CERTS.hosts)  # the names the others dial
    assert CERTS.if_missing and not CERTS.force, "the PKI is made once and kept (running servers hold it)"
    assert CERTS.dashboard_token
    for w in WORKERS:
        args = PARSED[w][1]
        assert args.token_file == pki / "tokens" / f"{args.name}.token" and args.name in CERTS.workers
        assert args.tls_ca == pki / "ca.crt" and not args.insecure
    for name in ("estimator", "aggregator"):
        args = PARSED[name][1]
        assert (args.tls_cert, args.tls_key, args.tls_ca) == (pki / "server.crt", pki / "server.key", pki / "ca.crt")
        assert args.token_file == pki / "tokens.json" and not args.insecure
    agg = PARSED["aggregator"][1]
    assert agg.estimator_token_file == str(pki / "tokens" / "aggregator.token") and "aggregator" in CERTS.workers
    assert agg.dashboard_token_file == pki / "dashboard.token"
    assert _mounts("estimator")[str(pki)] == "pki"  # the one writer
    for name in SERVICES:
        if name != "estimator":
            assert _mounts(name).get(str(pki)) == "pki:ro", f"{name} must mount the PKI volume read-only"


def test_run_state_lives_in_volumes() -> None:
    assert _under_mount("aggregator", PARSED["aggregator"][1].out)
    assert _under_mount("estimator", PARSED["estimator"][1].run_dir)
    for w in WORKERS:
        assert _under_mount(w, PARSED[w][1].state_dir)
    declared = set(COMPOSE.get("volumes", {}))
    for name in SERVICES:
        assert {v.split(":")[0] for v in _mounts(name).values()} <= declared, name


def test_aggregator_config_exists_in_the_image() -> None:
    agg = PARSED["aggregator"][1]
    assert (ROOT / agg.config).is_file()
    assert "COPY configs ./configs" in (ROOT / "Dockerfile").read_text()


# ---- lifecycle: healthchecks, start order, restarts ---------------------------------------------------


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


def test_depends_on_waits_for_health_and_nothing_is_one_shot() -> None:
    conds = {n: {d: c["condition"] for d, c in SERVICES[n].get("depends_on", {}).items()} for n in SERVICES}
    assert conds["estimator"] == {}
    assert conds["aggregator"] == {"estimator": "service_healthy"}
    for w in WORKERS:
        assert conds[w] == {"aggregator": "service_healthy", "estimator": "service_healthy"}
    for n, deps in conds.items():
        for dep, cond in deps.items():
            assert dep in SERVICES, f"{n} depends on unknown service {dep}"
            assert cond == "service_healthy", "a one-shot dependency breaks `up --exit-code-from`"
            assert "healthcheck" in SERVICES[dep], f"{n} waits for {dep}'s health but it has no healthcheck"


def test_a_finished_run_is_neither_restarted_nor_rewritten() -> None:
    assert SERVICES["aggregator"]["restart"] == "on-failure"  # exit 0 after done is final
    assert PARSED["aggregator"][1].keep_serving  # the dashboard stays up after done; a restart serves read-only
    for w in WORKERS:
        assert SERVICES[w]["restart"] == "on-failure"  # a worker exits 0 when the run is over


# ---- CPU by default, GPUs in the overlay ---------------------------------------------------------------


@pytest.mark.parametrize("worker", WORKERS)
def test_workers_run_on_cpu_by_default(worker: str) -> None:
    assert "deploy" not in SERVICES[worker], "a GPU reservation fails on a host without one"
    assert PARSED[worker][1].device == "cpu"


@pytest.mark.parametrize("worker", WORKERS)
def test_the_gpu_overlay_reserves_a_gpu_and_changes_only_the_device(worker: str) -> None:
    gpu = GPU["services"][worker]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    base, over = command(worker), command(worker, GPU["services"])
    assert parse(over)[1].device == "cuda"
    i = base.index("--device")
    assert over[:i + 1] == base[:i + 1] and over[i + 2:] == base[i + 2:]


def test_servers_and_workers_images_build_from_the_one_dockerfile() -> None:
    images = {n: SERVICES[n].get("image") for n in SERVICES}
    for build in (SERVICES[n]["build"] for n in SERVICES):
        assert build["dockerfile"] == "Dockerfile" and build["context"] == "."
        assert build["args"]["BASE"] == "python:3.11-slim-bookworm"
    assert images["estimator"] == images["aggregator"] == "fedent-cpu:local"
    assert {images[w] for w in WORKERS} == {"fedent:local"}
    assert SERVICES["worker-0"]["build"]["args"]["TORCH_INDEX_URL"] == ""  # CUDA-capable torch
    assert "TORCH_INDEX_URL" in SERVICES["aggregator"]["build"]["args"]
    dockerfile_args = {a.split("=")[0] for instr, a in DOCKERFILE if instr == "ARG"}
    for n in SERVICES:
        assert set(SERVICES[n]["build"]["args"]) <= dockerfile_args, n


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


def test_dockerfile_base_is_an_argument_defaulting_to_a_pinned_python_slim() -> None:
    assert DOCKERFILE[0][0] == "ARG" and DOCKERFILE[1] == ("FROM", "${BASE}")
    name, _, default = DOCKERFILE[0][1].partition("=")
    assert name == "BASE"
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", default), default
    assert sum(instr == "FROM" for instr, _ in DOCKERFILE) == 1


def test_dockerfile_installs_into_a_virtualenv_on_path() -> None:
    env = " ".join(args for instr, args in DOCKERFILE if instr == "ENV")
    assert "VIRTUAL_ENV=/opt/venv" in env and "PATH=/opt/venv/bin:$PATH" in env  # `python` is the venv's
    runs = " ".join(args for instr, args in DOCKERFILE if instr == "RUN")
    assert "python3 -m venv /opt/venv" in runs
    assert (ROOT / "docker" / "build" / "pip.sh").is_file()


def test_dockerfile_copies_only_existing_sources() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    copies = [args.split() for instr, args in DOCKERFILE if instr in ("COPY", "ADD")]
    assert copies
    for parts in copies:
        for src in parts[:-1]:
            assert not src.startswith("--"), "no COPY --from stages expected"
            assert (ROOT / src).exists(), f"COPY source {src} does not exist"
            assert src.rstrip("/") not in ignored, f"COPY source {src} is excluded by .dockerignore"
            assert src not in ignored, f"COPY source {src} is excluded by .dockerignore"
    copied = {p[0] for p in copies}
    for pkg in ("fedent", "fedentrpc", "server", "client", "estimator", "pyproject.toml"):
        assert pkg in copied, f"the image lacks {pkg}"


def test_dockerfile_installs_the_dataset_and_the_pinned_project() -> None:
    runs = " ".join(args for instr, args in DOCKERFILE if instr == "RUN")
    assert re.search(r"apt-get install [^&]*\bdataset-fashion-mnist\b", runs) or (
        re.search(r"\bpkgs=dataset-fashion-mnist\b", runs) and re.search(r"apt-get install [^&]*\$pkgs\b", runs))
    assert "apt-get update" in runs
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {d.split("==")[0]: d for d in deps if d.startswith(("torch==", "torchvision=="))}
    assert set(pins) == {"torch", "torchvision"}
    for pin in pins.values():
        assert f'"{pin}"' in runs or f" {pin} " in f" {runs} ", f"the image must install {pin} (pyproject's pin)"
    project = re.search(r"pip(\.sh)? install (\S+ )*\"?\.(\[[a-z,]+\])?\"?(\s|$)", runs)
    assert project, "the project itself must be installed"
    assert set((project.group(3) or "[]")[1:-1].split(",")) >= {"cluster", "dashboard"}, "the services' extras too"
    users = [args for instr, args in DOCKERFILE if instr == "USER"]
    assert users and users[-1] not in ("root", "0")


def test_dockerignore_keeps_local_state_out_of_the_build_context() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "runs"} <= ignored


# ---- the real run: make compose-check, in CI ----------------------------------------------------------


def test_ci_runs_compose_check_after_the_suite_with_docker_installed() -> None:
    import subprocess

    ci = "\n".join(line for line in (ROOT / ".ci" / "run").read_text().splitlines() if not line.startswith("#"))
    assert ci.index("make test") < ci.index("tools/ensure_docker.sh") < ci.index("make compose-check")
    assert "FEDENT_BASE_CACHE" in ci  # the local base image is kept between CI runs
    for script in ("tools/ensure_docker.sh", "tools/docker_base.sh", "tools/compose_check.py"):
        assert (ROOT / script).stat().st_mode & 0o111, f"{script} must be executable"
        if script.endswith(".sh"):
            subprocess.run(["bash", "-n", str(ROOT / script)], check=True)
    r = subprocess.run(["make", "-s", "-n", "compose-check"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.stdout.strip().endswith("tools/compose_check.py"), r.stdout


def test_compose_check_uses_the_compose_file_names_and_defaults() -> None:
    """tools/compose_check.py addresses services, the dashboard token and the run directory by the names this
    compose file gives them; a rename here must break this, not only the (CI-only) real check."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compose_check", ROOT / "tools" / "compose_check.py")
    assert spec and spec.loader
    cc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cc)
    assert set(cc.SERVERS) | set(cc.WORKERS) == set(SERVICES)
    agg = PARSED["aggregator"][1]
    assert str(agg.dashboard_token_file) == "/pki/dashboard.token"
    raw = (ROOT / "tools" / "compose_check.py").read_text()
    assert '"/pki/dashboard.token"' in raw and 'f"/runs/{self.run_name}' in raw
    assert agg.out == "/runs/demo" and "/runs/${FEDENT_RUN:-demo}" in (ROOT / "docker-compose.yml").read_text()
    for var in ("FEDENT_DASHBOARD_PORT", "FEDENT_AGGREGATOR_PORT", "FEDENT_ESTIMATOR_PORT", "FEDENT_ROUNDS",
                "FEDENT_RUN", "FEDENT_BIND", "FEDENT_BASE"):
        assert f"${{{var}:-" in (ROOT / "docker-compose.yml").read_text() and var in raw, var
