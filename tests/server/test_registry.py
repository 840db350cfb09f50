"""The worker registry's ownership rules: with a client map only the mapped identity may host a client."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fedent.rounds.clients import ClientBook
from server.registry import WorkerRegistry
from server.settings import AggregatorSettings
from server.work import ClusterError


def _registry(tmp_path: Path, clients_file: str = "") -> WorkerRegistry:
    sizes = [10, 10, 10, 10]
    reg = WorkerRegistry(AggregatorSettings(clients_file=clients_file), sizes, "md5", False, 3, 0, "run", {})
    reg.bind(ClientBook(tmp_path / "clients.json", sizes), threading.Event())
    return reg


def _map(tmp_path: Path) -> str:
    path = tmp_path / "clients.yaml"
    path.write_text("worker-0: 0-1\nworker-1: [2, 3]\n")
    return str(path)


def _code(call: object) -> str:
    with pytest.raises(ClusterError) as e:
        call()  # type: ignore[operator]
    return f"{e.value.code}: {e.value}"


def test_with_a_client_map_unclaimed_clients_belong_to_their_mapped_worker_only(tmp_path: Path) -> None:
    """Issue 25: unclaimed clients could be registered by whichever credentialed worker connected first."""
    reg = _registry(tmp_path, _map(tmp_path))
    # worker-1 connects first and claims worker-0's (still unclaimed) clients: denied, nothing registered
    msg = _code(lambda: reg.register("", "", [0, 1], "cpu", "h", identity="worker-1"))
    assert msg.startswith("permission: ") and "clients [0, 1] are mapped to worker-0" in msg
    msg = _code(lambda: reg.register("", "", [1, 2], "cpu", "h", identity="worker-1"))
    assert "clients [1] are mapped to worker-0" in msg
    assert _code(lambda: reg.register("", "", [0], "cpu", "h", identity="mallory")).startswith("permission: ")
    # without credentials nobody can be matched against the map
    assert "needs worker authentication" in _code(lambda: reg.register("", "", [0], "cpu", "h", identity=None))
    assert reg.owner == {} and reg.workers == {}
    # the mapped workers register their own clients
    r1 = reg.register("", "", [2, 3], "cpu", "h", identity="worker-1")
    r0 = reg.register("", "", [0, 1], "cpu", "h", identity="worker-0")
    assert reg.owner == {0: r0.worker_id, 1: r0.worker_id, 2: r1.worker_id, 3: r1.worker_id}
    assert reg.bound_identities() == {0: "worker-0", 1: "worker-0", 2: "worker-1", 3: "worker-1"}
    # worker-0 gone: its clients stay mapped to it, worker-1 may still not take them
    reg.retire(reg.workers[r0.worker_id], "down", "test")
    assert _code(lambda: reg.register("", "", [0, 1], "cpu", "h", identity="worker-1")).startswith("permission: ")


def test_without_a_map_the_binding_is_the_registering_identity(tmp_path: Path) -> None:
    """The documented default: first come, first served; the estimator is told who registered each client."""
    reg = _registry(tmp_path)
    r = reg.register("", "", [0, 1], "cpu", "h", identity="worker-1")
    reg.register("", "", [2], "cpu", "h", identity=None)
    assert reg.owner[0] == r.worker_id and reg.bound_identities() == {0: "worker-1", 1: "worker-1"}


def test_a_bad_client_map_fails_when_the_registry_is_built(tmp_path: Path) -> None:
    from fedentrpc.security.errors import SecurityConfigError

    path = tmp_path / "clients.yaml"
    path.write_text("worker-0: 0-2\n")
    with pytest.raises(SecurityConfigError, match=r"clients \[3\] are mapped to no worker"):
        _registry(tmp_path, str(path))
