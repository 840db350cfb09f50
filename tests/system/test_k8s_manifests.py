"""deploy/k8s: the kustomize base and its cpu/gpu overlays, checked offline.

Each overlay is rendered here the way kustomize would for what these files use (resources, namespace,
labels, image tags, strategic-merge patches of containers/env by name, secretGenerator), and every object
is validated against the Kubernetes JSON schemas bundled with kubernetes-validate (no cluster, no network),
strictly (unknown fields fail). Every container command and probe is parsed with the real argparse parser of
the module it runs; the workers' shell line is expanded by a real shell for each ordinal. The Secrets must
hold exactly files that `fedent certs` writes, and every name a container dials must be a Service.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_parsers import ParseError, parse

kubernetes_validate = pytest.importorskip("kubernetes_validate")  # the dev extra

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu")
VERSIONS = ("1.29.0", "1.37.0")  # the oldest and newest Kubernetes this is checked against


# ---- a small kustomize (what deploy/k8s uses) ---------------------------------------------------------


def merge(base: Any, patch: Any) -> Any:
    """Strategic merge as kustomize applies it to these manifests: maps merge, lists of named maps
    (containers, env, volumes, ports) merge by name, other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if (isinstance(base, list) and isinstance(patch, list) and base and patch
            and all(isinstance(x, dict) and "name" in x for x in base + patch)):
        out_list = [copy.deepcopy(x) for x in base]
        for item in patch:
            match = [i for i, x in enumerate(out_list) if x["name"] == item["name"]]
            if match:
                out_list[match[0]] = merge(out_list[match[0]], item)
            else:
                out_list.append(copy.deepcopy(item))
        return out_list
    return copy.deepcopy(patch)


def kustomization(folder: Path) -> dict[str, Any]:
    return dict(yaml.safe_load((folder / "kustomization.yaml").read_text()))


def build(folder: Path) -> list[dict[str, Any]]:
    k = kustomization(folder)
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
    objects: list[dict[str, Any]] = []
    for res in k.get("resources", []):
        path = (folder / res).resolve()
        assert path.exists(), f"{folder}: resource {res} does not exist"
        objects += build(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
    for gen in k.get("secretGenerator", []):
        data = {}
        for spec in gen["files"]:
            key, _, src = spec.rpartition("=") if "=" in spec else (Path(spec).name, "", spec)
            data[key] = src
        objects.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": gen["name"]},
                        "type": "Opaque", "data": {k2: "" for k2 in data}, "x-files": data})
    for p in k.get("patches", []):
        patch = yaml.safe_load((folder / p["path"]).read_text())
        targets = [o for o in objects if (o["kind"], o["metadata"]["name"]) ==
                   (patch["kind"], patch["metadata"]["name"])]
        assert len(targets) == 1, f"{folder}: patch {p['path']} matches {len(targets)} objects"
        objects[objects.index(targets[0])] = merge(targets[0], patch)
    for o in objects:
        if "namespace" in k and o["kind"] != "Namespace":
            o["metadata"]["namespace"] = k["namespace"]
        for lab in k.get("labels", []):
            o["metadata"].setdefault("labels", {}).update(lab["pairs"])
        for c in containers(o):
            for img in k.get("images", []):
                if c["image"] == img["name"]:
                    c["image"] = f"{img.get('newName', img['name'])}:{img['newTag']}"
    return objects


def normalized(value: Any) -> Any:
    """Lists of named maps in name order (a strategic merge may put a patched env entry first)."""
    if isinstance(value, dict):
        return {k: normalized(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [normalized(v) for v in value]
        if items and all(isinstance(v, dict) and "name" in v for v in items):
            return sorted(items, key=lambda v: v["name"])
        return items
    return value


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers", []))


RENDERED = {name: build(K8S / "overlays" / name) for name in OVERLAYS}


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def worker_argv(objects: list[dict[str, Any]], ordinal: int) -> list[str]:
    """The worker's command line for pod ``fedent-worker-<ordinal>``, as the real shell expands it."""
    (c,) = containers(find(objects, "StatefulSet", "fedent-worker"))
    assert c["command"][:2] == ["sh", "-c"]
    script = c["command"][2]
    assert script.count("exec python -m client") == 1
    env = {"PATH": "/usr/bin:/bin", "HOSTNAME": f"fedent-worker-{ordinal}", **env_of(c)}
    out = subprocess.run(["sh", "-c", script.replace("exec python", "exec printf '%s\\n' python")],
                         env=env, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


# ---- tests -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schema(overlay: str, version: str) -> None:
    kinds = set()
    for obj in RENDERED[overlay]:
        obj = {k: v for k, v in obj.items() if not k.startswith("x-")}
        kubernetes_validate.validate(obj, version, strict=True)
        kinds.add((obj["kind"], obj["metadata"]["name"]))
    assert {("Service", "fedent-aggregator"), ("StatefulSet", "fedent-aggregator"), ("Service", "fedent-dashboard"),
            ("Service", "fedent-estimator"), ("Deployment", "fedent-estimator"), ("StatefulSet", "fedent-worker"),
            ("Secret", "fedent-server-pki"), ("Secret", "fedent-worker-tokens")} <= kinds


def test_the_validation_catches_a_broken_object() -> None:
    bad = copy.deepcopy(find(RENDERED["cpu"], "Deployment", "fedent-estimator"))
    bad["spec"]["template"]["spec"]["containers"][0]["portz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_server_commands_and_probes_parse_with_the_real_parsers(overlay: str) -> None:
    objs = RENDERED[overlay]
    (agg,) = containers(find(objs, "StatefulSet", "fedent-aggregator"))
    (est,) = containers(find(objs, "Deployment", "fedent-estimator"))
    a_mod, a = parse(agg["command"])
    e_mod, e = parse(est["command"])
    assert (a_mod, e_mod) == ("server", "estimator")
    assert a.keep_serving and (ROOT / a.config).is_file()
    for c, args in ((agg, a), (est, e)):
        for probe in ("readinessProbe", "livenessProbe"):
            module, p = parse(c[probe]["exec"]["command"])
            assert module == "server.healthcheck" and p.address == f"localhost:{args.port}"
            assert p.tls_ca == args.tls_ca
        assert {pt["containerPort"] for pt in c["ports"]} >= {args.port}
    assert {pt["containerPort"] for pt in agg["ports"]} == {a.port, a.dashboard_port}


def test_a_bad_flag_in_a_manifest_would_fail() -> None:
    with pytest.raises(ParseError):
        parse(["python", "-m", "client", "--aggregator", "x:1", "--clients", "0-1", "--worker-id", "w"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_cover_every_client_once_each_with_its_own_token(overlay: str) -> None:
    from client.worker import parse_client_ids
    from fedent.config import load_config

    objs = RENDERED[overlay]
    sts = find(objs, "StatefulSet", "fedent-worker")
    (agg,) = containers(find(objs, "StatefulSet", "fedent-aggregator"))
    a = parse(agg["command"])[1]
    cfg = load_config(str(ROOT / a.config), a.set)
    hosted = []
    tokens = find(objs, "Secret", "fedent-worker-tokens")["x-files"]
    for n in range(sts["spec"]["replicas"]):
        module, w = parse(worker_argv(objs, n))
        assert module == "client" and w.name == f"worker-{n}"
        hosted += parse_client_ids(w.clients)
        assert w.token_file == Path("/pki") / f"worker-{n}.token" and w.token_file.name in tokens
        assert w.tls_ca == Path("/pki/ca.crt") and not w.insecure
        assert w.device == ("cuda" if overlay == "gpu" else "cpu")
    assert sorted(hosted) == list(range(cfg.data.num_clients))


def test_services_match_what_the_containers_dial_and_serve() -> None:
    objs = RENDERED["cpu"]
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    (agg,) = containers(find(objs, "StatefulSet", "fedent-aggregator"))
    a = parse(agg["command"])[1]
    w = parse(worker_argv(objs, 0))[1]

    def port_of(service: str) -> int:
        (p,) = services[service]["spec"]["ports"]
        return int(p["port"])

    est_host, _, est_port = a.estimator.rpartition(":")
    assert port_of(est_host) == int(est_port)
    for address in (w.aggregator, w.estimator):
        host, _, port = address.rpartition(":")
        assert port_of(host) == int(port)
    assert port_of("fedent-dashboard") == a.dashboard_port
    for svc in services.values():
        owners = [o for o in objs if o["kind"] in ("StatefulSet", "Deployment")
                  and svc["spec"]["selector"].items() <= o["spec"]["template"]["metadata"]["labels"].items()]
        assert owners, f"Service {svc['metadata']['name']} selects no pods"
        for p in svc["spec"].get("ports", []):
            names = {cp.get("name") for o in owners for c in containers(o) for cp in c.get("ports", [])}
            assert p["targetPort"] in names


def test_secrets_hold_exactly_what_make_pki_writes(tmp_path: Path) -> None:
    """The base's secretGenerator reads pki/...: deploy/k8s/make-pki.sh (fedent certs) must write each file."""
    import os
    import sys

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "WORKERS": str(find(RENDERED["cpu"], "StatefulSet", "fedent-worker")["spec"]["replicas"])}
    subprocess.run([str(K8S / "make-pki.sh"), str(tmp_path / "pki")], env=env, check=True, capture_output=True)
    k = kustomization(K8S / "base")
    for gen in k["secretGenerator"]:
        for spec in gen["files"]:
            src = spec.rpartition("=")[2]
            assert src.startswith("pki/")
            assert (tmp_path / src).is_file(), f"{gen['name']}: make-pki.sh writes no {src}"
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((tmp_path / "pki" / "server.crt").read_bytes())
    names = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName))
    assert {"fedent-aggregator", "fedent-estimator"} <= names  # the Services the pods dial
    server = {s.rpartition("=")[0] or Path(s).name for s in k["secretGenerator"][0]["files"]}
    workers = {s.rpartition("=")[0] or Path(s).name for s in k["secretGenerator"][1]["files"]}
    assert "ca.key" not in server | workers  # the CA key never leaves the machine that made the PKI
    assert not {"server.key", "tokens.json", "dashboard.token"} & workers


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mounts_use_declared_secrets_and_paths_the_commands_read(overlay: str) -> None:
    objs = RENDERED[overlay]
    secrets = {o["metadata"]["name"]: o["x-files"] for o in objs if o["kind"] == "Secret"}
    for o in objs:
        if o["kind"] not in ("StatefulSet", "Deployment"):
            continue
        spec = o["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        vols.update({t["metadata"]["name"]: {"pvc": True} for t in o["spec"].get("volumeClaimTemplates", [])})
        for c in spec["containers"]:
            for m in c["volumeMounts"]:
                assert m["name"] in vols, f"{o['metadata']['name']}: undeclared volume {m['name']}"
                sec = vols[m["name"]].get("secret")
                if sec:
                    assert sec["secretName"] in secrets
                    assert m["mountPath"] == "/pki" and m.get("readOnly")
            if o["metadata"]["name"] != "fedent-worker":
                args = parse(c["command"])[1]
                mounted = secrets[next(v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v)]
                for path in (args.tls_cert, args.tls_key, args.tls_ca, args.token_file):
                    assert path.parent == Path("/pki") and path.name in mounted


def test_only_the_gpu_overlay_asks_for_gpus() -> None:
    def gpu_limit(overlay: str) -> Any:
        (c,) = containers(find(RENDERED[overlay], "StatefulSet", "fedent-worker"))
        return c["resources"].get("limits", {}).get("nvidia.com/gpu")

    assert gpu_limit("gpu") == 1 and gpu_limit("cpu") is None
    (w,) = containers(find(RENDERED["gpu"], "StatefulSet", "fedent-worker"))
    assert w["image"] == "fedent:local"  # CUDA torch for workers
    for name, kind in (("fedent-aggregator", "StatefulSet"), ("fedent-estimator", "Deployment")):
        (c,) = containers(find(RENDERED["gpu"], kind, name))
        assert c["image"] == "fedent-cpu:local"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_real_kustomize_renders_the_same_objects_and_they_validate(overlay: str, tmp_path: Path) -> None:
    """With kubectl on the machine (it embeds kustomize): the real rendering, PKI made by make-pki.sh,
    validates too and agrees with the one the other tests check (every container spec, every object)."""
    import os
    import shutil
    import sys

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (kustomize) is not installed; the rendering above is checked instead")
    shutil.copytree(K8S, tmp_path / "k8s")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([str(tmp_path / "k8s" / "make-pki.sh")], env=env, check=True, capture_output=True)
    out = subprocess.run([kubectl, "kustomize", str(tmp_path / "k8s" / "overlays" / overlay)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    real = [d for d in yaml.safe_load_all(out) if d]
    for obj in real:
        kubernetes_validate.validate(obj, VERSIONS[-1], strict=True)
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    ours = {key(o): o for o in RENDERED[overlay]}
    assert {key(o) for o in real} == set(ours)
    for obj in real:
        assert obj["metadata"].get("namespace") == ours[key(obj)]["metadata"].get("namespace")
        assert normalized(containers(obj)) == normalized(containers(ours[key(obj)])), key(obj)
        if obj["kind"] == "Secret":
            assert set(obj["data"]) == set(ours[key(obj)]["data"])
