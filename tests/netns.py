"""A real network for cluster tests: every process in its own network namespace, capped links, cut links.

Why: on loopback a link never drops and bandwidth is free. Here the aggregator and each worker get a
namespace of their own, joined through a bridge in a hub namespace by one veth pair each, with their own
address (10.99.0.x), the aggregator's certificate issued for its name and address (no localhost), and a
token-bucket cap (``tc tbf``) on both directions of every worker's link. ``down``/``up`` take a link away
and give it back (the peer sees no carrier: packets are lost, connections stall, as on a pulled cable).

``netem`` is not available on these kernels, so there is no added delay or loss: only bandwidth and outages
are emulated. Everything lives in namespaces this module creates, named with a random tag, and removed by
``close`` (also at interpreter exit); nothing is touched in the caller's namespace. Needs root and
``ip netns``: ``unavailable()`` says why not, for a skip.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from procs import ENV, REPO, Procs

from server.certs import make_dev_pki

SUBNET = "10.99.0"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


def unavailable() -> str | None:
    """Why this machine cannot run the network tests (None: it can)."""
    if os.geteuid() != 0:
        return "network-namespace tests need root (ip netns, veth, tc)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "network-namespace tests need iproute2 (ip, tc)"
    probe = f"fe{secrets.token_hex(3)}probe"
    got = _ip("netns", "add", probe, check=False)
    if got.returncode != 0:
        return f"ip netns add failed: {got.stderr.strip()[:120]}"
    _ip("netns", "del", probe, check=False)
    return None


def netem_available() -> bool:
    """Whether ``tc qdisc ... netem`` works here (it does not on the kernels CI runs: no delay emulation)."""
    ns = f"fe{secrets.token_hex(3)}nm"
    _ip("netns", "add", ns)
    try:
        _ip("-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        got = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "d0", "root", "netem", "delay", "1ms"],
                             capture_output=True, text=True, timeout=20)
        return got.returncode == 0
    finally:
        _ip("netns", "del", ns, check=False)


@dataclass
class Node:
    """One namespace on the network: ``ns`` its name, ``ip`` its address, ``port`` its link's end in the hub."""

    name: str
    ns: str
    ip: str
    port: str
    mbit: float | None


@dataclass
class Network:
    """The hub, a bridge, and a node per process; ``close`` removes every namespace it made."""

    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    nodes: dict[str, Node] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.hub = self._netns("hub")
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        atexit.register(self.close)

    def _netns(self, what: str) -> str:
        ns = f"fe{self.tag}-{what}"
        _ip("netns", "add", ns)
        self.namespaces.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        return ns

    def add(self, name: str, mbit: float | None = None) -> Node:
        """A namespace for ``name`` with address 10.99.0.<n> on a link capped at ``mbit`` each way (None: not
        capped)."""
        i = len(self.nodes) + 1
        ns, port = self._netns(name), f"p{self.tag}{i}"
        _ip("link", "add", port, "netns", self.hub, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", self.hub, "link", "set", port, "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{SUBNET}.{i}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        node = Node(name, ns, f"{SUBNET}.{i}", port, mbit)
        if mbit is not None:  # both directions: the node's egress (upload) and the hub port's (download)
            for where, dev in ((ns, "eth0"), (self.hub, port)):
                subprocess.run(["tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{mbit}mbit",
                                "burst", "64kb", "latency", "100ms"], check=True, capture_output=True, timeout=20)
        self.nodes[name] = node
        return node

    def down(self, name: str) -> None:
        """Cut ``name``'s link (its hub end goes down: no carrier, every packet lost until ``up``)."""
        _ip("-n", self.hub, "link", "set", self.nodes[name].port, "down")

    def up(self, name: str) -> None:
        _ip("-n", self.hub, "link", "set", self.nodes[name].port, "up")

    def bytes_from(self, name: str) -> int:
        """Bytes the hub received from ``name`` so far (its uploads and requests)."""
        got = _ip("-n", self.hub, "-j", "-s", "link", "show", self.nodes[name].port)
        import json

        return int(json.loads(got.stdout)[0]["stats64"]["rx"]["bytes"])

    def spawn(self, procs: Procs, name: str, args: list[str], log: Path) -> subprocess.Popen[str]:
        """``python args`` inside ``name``'s namespace (``ip netns exec`` execs it: the handle is the process)."""
        with log.open("a") as err:
            p = subprocess.Popen(["ip", "netns", "exec", self.nodes[name].ns, sys.executable, *args], cwd=REPO,
                                 env=ENV, stdout=subprocess.DEVNULL, stderr=err, text=True)
        procs.append(p)
        return p

    def close(self) -> None:
        for ns in reversed(self.namespaces):
            _ip("netns", "del", ns, check=False)
        self.namespaces.clear()


def start_cluster(net: Network, tmp: Path, config: str, mbit: float | None, workers: int = 2,
                  server_flags: tuple[str, ...] = (), worker_flags: tuple[str, ...] = (),
                  port: int = 50051) -> tuple[Procs, Path]:
    """An aggregator (uncapped link) and ``workers`` workers (``mbit`` each way; worker i hosts client i),
    each in its own namespace, with mutual TLS and tokens: the server certificate names ``aggregator`` and its
    address, each worker's names the worker. Logs in ``tmp/<name>.log``; returns the processes and run dir."""
    agg = net.add("aggregator")
    names = [f"worker-{i}" for i in range(workers)]
    for name in names:
        net.add(name, mbit=mbit)
    pki = make_dev_pki(tmp / "pki", hosts=["aggregator", agg.ip], workers=names)
    cfg = tmp / "cfg.yaml"
    cfg.write_text(config)
    out = tmp / "run"
    procs: Procs = []
    tls = ["--tls-ca", str(pki.ca_cert)]
    net.spawn(procs, "aggregator", [
        "-m", "server", "--config", str(cfg), "--host", agg.ip, "--port", str(port), "--out", str(out),
        "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), *tls, "--require-client-auth",
        "--token-file", str(pki.tokens_file), "--register-timeout", "90", "--heartbeat", "2",
        "--heartbeat-misses", "15", *server_flags], tmp / "aggregator.log")
    for i, name in enumerate(names):
        crt, key = pki.client_certs[name]
        net.spawn(procs, name, [
            "-m", "client", "--aggregator", f"{agg.ip}:{port}", "--clients", str(i), "--device", "cpu",
            "--name", name, *tls, "--tls-cert", str(crt), "--tls-key", str(key), "--token-file",
            str(pki.token_files[name]), "--connect-timeout", "60", "--reconnect-attempts", "50",
            "--backoff-base", "0.2", "--backoff-cap", "1", "--log-level", "INFO", *worker_flags],
            tmp / f"{name}.log")
    return procs, out
