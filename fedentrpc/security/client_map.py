"""Which worker identity may host which client: the client map both services read (issue 25, identity).

A worker's identity is what its credentials name (its token's entry in the tokens file, or its client
certificate's CN/SAN, ``fedentrpc.security.interceptors``). Without a map, the aggregator binds a client to
the identity of the live worker that registered it first, and the estimator follows that binding (the
aggregator sends it with the offline job); with a map, only the mapped identity may ever host a client, in
the aggregator (Register) and in the estimator's oracle hub (an Oracle stream may claim only its own clients).

The file is YAML (or JSON): ``{worker-0: "0-9", worker-1: [10, 11, 12], worker-2: "13,15-19"}``. Every client
of the run must be mapped exactly once. Here and not in a service: both services read the same file, and no
service imports another.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from fedentrpc.security.errors import SecurityConfigError

ClientMap = Mapping[int, str]  # client id -> the worker identity that alone may host it


def _ids(value: Any, where: str) -> list[int]:
    """``[0, 1]``, ``"0-9"``, ``"3,5,7-9"`` or one int -> the ids (a SecurityConfigError naming ``where``)."""
    if isinstance(value, bool):
        raise SecurityConfigError(f"{where}: expected client ids, got {value!r}")
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        out: list[int] = []
        for v in value:
            out.extend(_ids(v, where))
        return out
    if isinstance(value, str):
        out = []
        for part in value.replace(" ", "").split(","):
            if not part:
                continue
            lo, sep, hi = part.partition("-")
            try:
                a, b = int(lo), int(hi if sep else lo)
            except ValueError:
                raise SecurityConfigError(f"{where}: bad client id list {value!r}; use e.g. 0-9 or [1, 4, 7]") \
                    from None
            if b < a:
                raise SecurityConfigError(f"{where}: bad range {part!r} in {value!r}")
            out.extend(range(a, b + 1))
        return out
    raise SecurityConfigError(f"{where}: expected client ids (a list or '0-9'), got {type(value).__name__}")


def parse_client_map(raw: Any, num_clients: int | None = None, where: str = "clients") -> dict[int, str]:
    """``{identity: ids}`` -> ``{cid: identity}``; every problem is one SecurityConfigError naming ``where``.
    With ``num_clients``, every id must be in ``[0, num_clients)`` and every client mapped."""
    if not isinstance(raw, Mapping) or not raw:
        raise SecurityConfigError(f"{where}: expected a mapping {{worker identity: client ids}}, e.g. "
                                  "{worker-0: '0-9', worker-1: '10-19'}")
    owner: dict[int, str] = {}
    for identity, value in raw.items():
        if not isinstance(identity, str) or not identity.strip():
            raise SecurityConfigError(f"{where}: worker identities must be non-empty strings, got {identity!r}")
        ids = _ids(value, f"{where}.{identity}")
        if not ids:
            raise SecurityConfigError(f"{where}.{identity}: names no client")
        for cid in ids:
            if cid < 0 or (num_clients is not None and cid >= num_clients):
                bound = f"[0, {num_clients})" if num_clients is not None else ">= 0"
                raise SecurityConfigError(f"{where}.{identity}: client {cid} is out of range {bound}")
            if cid in owner and owner[cid] != identity:
                raise SecurityConfigError(f"{where}: client {cid} is mapped to both {owner[cid]!r} and {identity!r}")
            owner[cid] = identity
    if num_clients is not None:
        missing = [c for c in range(num_clients) if c not in owner]
        if missing:
            raise SecurityConfigError(f"{where}: clients {missing[:10]} are mapped to no worker; every client of "
                                      "the run needs its worker identity")
    return owner


def load_client_map(path: str | Path, num_clients: int | None = None) -> dict[int, str]:
    """The client map in the YAML/JSON file ``path`` (see the module docstring)."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SecurityConfigError(f"clients file {path}: unreadable ({type(e).__name__})") from None
    return parse_client_map(raw, num_clients, where=f"clients file {path}")


def dump_client_map(groups: Mapping[str, list[int]]) -> str:
    """The file text for ``{identity: [cids]}`` (the local launcher writes one per secured run)."""
    return yaml.safe_dump({k: [int(c) for c in v] for k, v in groups.items()}, sort_keys=False)
