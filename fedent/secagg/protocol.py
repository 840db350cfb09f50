"""SecAgg+ as two state machines, one client's (``ClientSession``) and the server's (``ServerSession``), exchanging
messages as bytes (so any transport can carry them: a function call in the simulator, the work stream in the
cluster). Semi-honest model of Bonawitz et al. 2017 (Section 4, without the consistency-check round and the
signatures of their active variant); SecAgg+'s sparse graph of Bell et al. 2020.

One round of aggregation, for the round's clients U:

0. advertise: each client makes two X25519 key pairs, (c) for encrypting shares, (s) for pairwise masks, and sends
   both public keys. Responders: U0.
1. share: the server sends each client its neighbours' public keys (``graph``); the client draws its self-mask
   seed b_u, Shamir-shares b_u and its mask key s_u^SK among its neighbours in U0 with threshold t_u, and sends
   each share pair sealed to that neighbour (ChaCha20-Poly1305 under KA(c_u, c_v)). Responders: U1.
2. route: the server hands each client the sealed shares addressed to it; the senders are its neighbours in U1,
   and exactly they enter its pairwise masks.
3. masked input (``ClientSession.mask``): y_u = x_u + PRG(b_u) + Σ_{v ∈ N(u) ∩ U1} ±PRG(KA(s_u, s_v)) mod 2^k,
   + when u < v. Uploaded with the update; the server keeps the ones it accepts: U2.
4. unmask: each survivor reveals, for each neighbour v it holds shares of, b_v's share when v ∈ U2 and s_v^SK's
   when v ∉ U2, never both (it refuses a request that would mix them). The server rebuilds every survivor's
   b_u and every dropped client's s^SK (t shares each), removes the self masks and the dropped clients'
   pairwise masks, and is left with Σ_{u ∈ U2} x_u mod 2^k.

The pairwise masks of two survivors cancel in the sum; the server sees each y_u, which is uniform over the ring
whatever x_u is (one-time pad with PRG(b_u)).
"""

from __future__ import annotations

import base64
import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedent.secagg import crypto, graph, shamir
from fedent.secagg.fixedpoint import ring_mask


class ProtocolError(ValueError):
    """A message out of order, malformed, or one that would make a client reveal too much; one line."""


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _unb64(s: Any, what: str) -> bytes:
    if not isinstance(s, str):
        raise ProtocolError(f"{what}: expected base64 text")
    try:
        return base64.b64decode(s, validate=True)
    except ValueError:
        raise ProtocolError(f"{what}: not base64") from None


def pack(msg: Mapping[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":"), sort_keys=True).encode()


def unpack(data: bytes, step: str) -> dict[str, Any]:
    try:
        msg = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError(f"secagg {step}: not a protocol message") from None
    if not isinstance(msg, dict) or msg.get("step") != step:
        got = msg.get("step") if isinstance(msg, dict) else msg
        raise ProtocolError(f"secagg: expected a {step} message, got {str(got)[:40]}")
    return msg


def _cid_map(raw: Any, what: str) -> dict[int, Any]:
    if not isinstance(raw, dict):
        raise ProtocolError(f"{what}: expected a mapping")
    try:
        return {int(k): v for k, v in raw.items()}
    except ValueError:
        raise ProtocolError(f"{what}: keys must be client ids") from None


def _cid_list(raw: Any, what: str) -> list[int]:
    if not isinstance(raw, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in raw):
        raise ProtocolError(f"{what}: expected a list of client ids")
    return sorted(set(raw))


def enc_info(rnd: int) -> bytes:
    return b"fedent-secagg share key|" + str(rnd).encode()


def mask_info(rnd: int) -> bytes:
    return b"fedent-secagg pairwise mask|" + str(rnd).encode()


def aad(rnd: int, sender: int, receiver: int) -> bytes:
    return f"fedent-secagg|{rnd}|{sender}->{receiver}".encode()


def threshold(num_neighbours: int, fraction: float) -> int:
    """t_u = ceil(fraction · |N(u)|), at least 1."""
    return max(1, math.ceil(fraction * num_neighbours - 1e-9))


def apply_mask(acc: np.ndarray, seed: bytes, sign: int, ring_bits: int) -> None:
    """acc ±= PRG(seed) in place (uint64 arithmetic wraps mod 2^64; the caller reduces mod 2^k once at the end)."""
    m = crypto.prg(seed, int(acc.size), ring_bits)
    if sign > 0:
        np.add(acc, m, out=acc)
    else:
        np.subtract(acc, m, out=acc)


_SHARE = struct.Struct(">qq")


@dataclass(frozen=True)
class Setup:
    """What the server announces for the round (in the advertise request)."""

    round: int
    ring_bits: int
    frac_bits: int
    rounding: str
    weighting: str  # "samples": the client scales its vector by n_i; "uniform": by 1
    groups: tuple[str, ...]  # the update's tensor groups, after the model, in this order
    participants: int  # |U|: each client keeps |x| 2^f under 2^(k-1) / participants

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.round, "ring_bits": self.ring_bits, "frac_bits": self.frac_bits,
                "rounding": self.rounding, "weighting": self.weighting, "groups": list(self.groups),
                "participants": self.participants}

    @classmethod
    def from_dict(cls, d: Any) -> Setup:
        try:
            s = cls(int(d["round"]), int(d["ring_bits"]), int(d["frac_bits"]), str(d["rounding"]),
                    str(d["weighting"]), tuple(str(g) for g in d["groups"]), int(d["participants"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"secagg advertise: bad setup ({type(e).__name__}: {e})") from None
        if not 8 <= s.ring_bits <= 64 or not 0 <= s.frac_bits < s.ring_bits or s.participants < 1:
            raise ProtocolError("secagg advertise: ring_bits, frac_bits or participants out of range")
        if s.rounding not in ("nearest", "stochastic") or s.weighting not in ("samples", "uniform"):
            raise ProtocolError("secagg advertise: unknown rounding or weighting")
        return s


class ClientSession:
    """One client's side of one round; each step may run once and in order."""

    def __init__(self, cid: int) -> None:
        self.cid = cid
        self.step = "new"
        self.setup: Setup | None = None
        self.c_sk = self.s_sk = b""
        self.b_seed = b""
        self.s_pub: dict[int, bytes] = {}  # neighbours' mask public keys (from the share request)
        self.held: dict[int, tuple[int, int]] = {}  # neighbour v -> (share of b_v, share of s_v^SK) for me
        self.mask_peers: list[int] = []  # N(u) ∩ U1: whose pairwise masks enter y_u

    def _expect(self, step: str, nxt: str) -> None:
        if self.step != step:
            raise ProtocolError(f"secagg: client {self.cid} got a {nxt} message in state {self.step}")
        self.step = nxt

    def handle(self, request: bytes) -> bytes:
        """Answer one server message (advertise, share, route or unmask) with the response bytes."""
        try:
            step = json.loads(request).get("step")
        except (ValueError, AttributeError, UnicodeDecodeError):
            raise ProtocolError("secagg: not a protocol message") from None
        handlers = {"advertise": self.advertise, "share": self.share, "route": self.route, "unmask": self.unmask}
        if step not in handlers:
            raise ProtocolError(f"secagg: unknown step {str(step)[:40]!r}")
        return handlers[step](unpack(request, step))

    def advertise(self, msg: dict[str, Any]) -> bytes:
        self._expect("new", "advertised")
        self.setup = Setup.from_dict(msg.get("setup"))
        self.c_sk, self.s_sk = crypto.new_private(), crypto.new_private()
        return pack({"step": "advertise", "c_pk": _b64(crypto.public_of(self.c_sk)),
                     "s_pk": _b64(crypto.public_of(self.s_sk))})

    def share(self, msg: dict[str, Any]) -> bytes:
        self._expect("advertised", "shared")
        assert self.setup is not None
        keys = _cid_map(msg.get("neighbours"), "secagg share: neighbours")
        t = msg.get("threshold")
        if not isinstance(t, int) or t < 1:
            raise ProtocolError("secagg share: threshold must be an integer >= 1")
        if self.cid in keys:
            raise ProtocolError("secagg share: a client is not its own neighbour")
        if len(keys) < t:
            raise ProtocolError(f"secagg share: {len(keys)} live neighbour(s), fewer than the threshold {t}")
        c_pub = {}
        for v, pair in keys.items():
            if not isinstance(pair, list) or len(pair) != 2:
                raise ProtocolError("secagg share: each neighbour needs [c_pk, s_pk]")
            c_pub[v], self.s_pub[v] = _unb64(pair[0], "c_pk"), _unb64(pair[1], "s_pk")
        if len({*c_pub.values(), *self.s_pub.values()}) != 2 * len(keys):
            raise ProtocolError("secagg share: neighbours' public keys must all differ")
        self.b_seed = os.urandom(shamir.SECRET_BYTES)
        holders = [v + 1 for v in sorted(keys)]  # Shamir x = cid + 1 (x = 0 is the secret)
        b_sh, s_sh = shamir.split(self.b_seed, holders, t), shamir.split(self.s_sk, holders, t)
        rnd = self.setup.round
        sealed = {}
        for v in sorted(keys):
            plain = (_SHARE.pack(self.cid, v) + b_sh[v + 1].to_bytes(shamir.SHARE_BYTES, "big")
                     + s_sh[v + 1].to_bytes(shamir.SHARE_BYTES, "big"))
            key = crypto.agree(self.c_sk, c_pub[v], enc_info(rnd))
            sealed[str(v)] = _b64(crypto.seal(key, plain, aad(rnd, self.cid, v)))
        self._c_pub = c_pub
        return pack({"step": "share", "sealed": sealed})

    def route(self, msg: dict[str, Any]) -> bytes:
        self._expect("shared", "routed")
        assert self.setup is not None
        sealed = _cid_map(msg.get("sealed"), "secagg route: sealed")
        rnd = self.setup.round
        for v, blob in sealed.items():
            if v not in self._c_pub:
                raise ProtocolError(f"secagg route: client {v} is not a neighbour of client {self.cid}")
            key = crypto.agree(self.c_sk, self._c_pub[v], enc_info(rnd))
            plain = crypto.open_sealed(key, _unb64(blob, "sealed share"), aad(rnd, v, self.cid))
            if len(plain) != _SHARE.size + 2 * shamir.SHARE_BYTES or _SHARE.unpack_from(plain) != (v, self.cid):
                raise ProtocolError(f"secagg route: the share from client {v} is malformed")
            o = _SHARE.size
            self.held[v] = (int.from_bytes(plain[o:o + shamir.SHARE_BYTES], "big"),
                            int.from_bytes(plain[o + shamir.SHARE_BYTES:], "big"))
        self.mask_peers = sorted(self.held)
        return pack({"step": "route"})

    def mask(self, x_ring: np.ndarray) -> np.ndarray:
        """y_u: the client's ring vector plus its self mask and its pairwise masks (after ``route``)."""
        self._expect("routed", "masked")
        assert self.setup is not None
        k, rnd = self.setup.ring_bits, self.setup.round
        y = np.array(x_ring, dtype=np.uint64)  # a copy: the masks are added in place
        apply_mask(y, self.b_seed, 1, k)
        for v in self.mask_peers:
            apply_mask(y, crypto.agree(self.s_sk, self.s_pub[v], mask_info(rnd)), 1 if self.cid < v else -1, k)
        np.bitwise_and(y, ring_mask(k), out=y)  # mod 2^k (2^64 wraps by itself)
        return y

    def unmask(self, msg: dict[str, Any]) -> bytes:
        self._expect("masked", "unmasked")
        survivors = _cid_list(msg.get("survivors"), "secagg unmask: survivors")
        dropped = _cid_list(msg.get("dropped"), "secagg unmask: dropped")
        if set(survivors) & set(dropped):
            raise ProtocolError("secagg unmask: a client cannot be both a survivor and dropped (that would reveal "
                                "its input)")
        if self.cid not in survivors:
            raise ProtocolError(f"secagg unmask: client {self.cid} sent its masked input but is not a survivor")
        if set(self.held) - set(survivors) - set(dropped):
            raise ProtocolError("secagg unmask: every neighbour must be named a survivor or dropped")
        out = {}
        for v in sorted(self.held):
            b_share, s_share = self.held[v]
            out[str(v)] = ["b", hex(b_share)] if v in survivors else ["s", hex(s_share)]
        return pack({"step": "unmask", "shares": out})


class ServerSession:
    """The server's side of one round: it builds every request, routes the sealed shares, and unmasks the sum."""

    def __init__(self, setup: Setup, cids: Sequence[int], degree: int, fraction: float, graph_seed: int) -> None:
        self.setup = setup
        self.cids = sorted(int(c) for c in cids)
        self.graph = graph.neighbours(self.cids, degree, graph_seed)
        self.t = {u: threshold(len(self.graph[u]), fraction) for u in self.cids}
        self.keys: dict[int, tuple[bytes, bytes]] = {}  # U0: (c_pk, s_pk)
        self.sealed: dict[int, dict[int, str]] = {}  # U1: sender -> receiver -> sealed share
        self.routed: dict[int, list[int]] = {}  # receiver -> senders routed to it (its mask peers)

    # ---- requests and responses, in order ---------------------------------------------------------------
    def advertise_requests(self) -> dict[int, bytes]:
        return {u: pack({"step": "advertise", "setup": self.setup.to_dict()}) for u in self.cids}

    def take_advertise(self, responses: Mapping[int, bytes]) -> dict[int, str]:
        """Keep the well-formed key pairs (U0); returns the clients it could not use, and why."""
        bad: dict[int, str] = {}
        for u, data in responses.items():
            try:
                msg = unpack(data, "advertise")
                c_pk, s_pk = _unb64(msg.get("c_pk"), "c_pk"), _unb64(msg.get("s_pk"), "s_pk")
                if len(c_pk) != 32 or len(s_pk) != 32 or c_pk == s_pk:
                    raise ProtocolError("secagg advertise: public keys must be two distinct 32-byte keys")
                self.keys[u] = (c_pk, s_pk)
            except ProtocolError as e:
                bad[u] = str(e)
        return bad

    def share_requests(self) -> tuple[dict[int, bytes], dict[int, str]]:
        """Each U0 client's neighbours in U0 with their keys; clients with fewer than t_u of them are out."""
        out, bad = {}, {}
        for u in sorted(self.keys):
            live = [v for v in self.graph[u] if v in self.keys]
            if len(live) < self.t[u]:
                bad[u] = f"secagg: {len(live)} live neighbour(s), fewer than the threshold {self.t[u]}"
                continue
            out[u] = pack({"step": "share", "threshold": self.t[u],
                           "neighbours": {str(v): [_b64(self.keys[v][0]), _b64(self.keys[v][1])] for v in live}})
        return out, bad

    def take_share(self, responses: Mapping[int, bytes]) -> dict[int, str]:
        bad: dict[int, str] = {}
        for u, data in responses.items():
            try:
                sealed = _cid_map(unpack(data, "share").get("sealed"), "secagg share: sealed")
                if not set(sealed) <= set(self.graph[u]) or not all(isinstance(s, str) for s in sealed.values()):
                    raise ProtocolError("secagg share: shares addressed outside the client's neighbours")
                self.sealed[u] = sealed
            except ProtocolError as e:
                bad[u] = str(e)
        return bad

    def route_requests(self) -> dict[int, bytes]:
        """Each U1 client gets the sealed shares its U1 neighbours addressed to it."""
        out = {}
        for u in sorted(self.sealed):
            got = {v: self.sealed[v][u] for v in self.graph[u]  # pairs that sealed to each other: masks cancel
                   if v in self.sealed and u in self.sealed[v] and v in self.sealed[u]}
            self.routed[u] = sorted(got)
            out[u] = pack({"step": "route", "sealed": {str(v): s for v, s in got.items()}})
        return out

    def unmask_requests(self, survivors: Sequence[int]) -> dict[int, bytes]:
        alive = set(survivors)
        return {u: pack({"step": "unmask", "survivors": sorted(({u} | set(self.routed[u])) & alive),
                         "dropped": sorted(set(self.routed[u]) - alive)})
                for u in sorted(alive)}

    def unmask(self, masked: Mapping[int, np.ndarray], responses: Mapping[int, bytes]) -> np.ndarray:
        """Σ x_u mod 2^k over the clients in ``masked`` (U2), from the unmask responses of the survivors that
        answered. ``ProtocolError`` when some secret has fewer than t shares (the round cannot be unmasked)."""
        k = self.setup.ring_bits
        alive = sorted(masked)
        if not alive:
            raise ProtocolError("secagg: no masked input to unmask")
        n = int(next(iter(masked.values())).size)
        b_shares: dict[int, dict[int, int]] = {}
        s_shares: dict[int, dict[int, int]] = {}
        for v, data in responses.items():
            if v not in masked:
                continue
            shares = _cid_map(unpack(data, "unmask").get("shares"), "secagg unmask: shares")
            for u, pair in shares.items():
                if u not in self.routed.get(v, []) or not isinstance(pair, list) or len(pair) != 2:
                    continue  # a share v never held, or malformed: ignored
                kind, val = pair
                try:
                    share = int(val, 16)
                except (TypeError, ValueError):
                    continue
                if kind == "b" and u in masked:
                    b_shares.setdefault(u, {})[v + 1] = share
                elif kind == "s" and u not in masked:
                    s_shares.setdefault(u, {})[v + 1] = share
        total = np.zeros(n, dtype=np.uint64)
        for u in alive:
            y = np.asarray(masked[u], dtype=np.uint64)
            if y.size != n:
                raise ProtocolError(f"secagg: client {u}'s masked input has {y.size} elements, expected {n}")
            np.add(total, y, out=total)
        for u in alive:
            try:
                b = shamir.combine(b_shares.get(u, {}), self.t[u])
            except shamir.ShamirError as e:
                raise ProtocolError(f"secagg: cannot remove client {u}'s self mask: {e}") from None
            apply_mask(total, b, -1, k)
        dropped = sorted({d for u in alive for d in self.routed.get(u, []) if d not in masked})
        for d in dropped:
            try:
                s_sk = shamir.combine(s_shares.get(d, {}), self.t[d])
            except shamir.ShamirError as e:
                raise ProtocolError(f"secagg: cannot remove dropped client {d}'s pairwise masks: {e}") from None
            if crypto.public_of(s_sk) != self.keys[d][1]:
                raise ProtocolError(f"secagg: the shares of dropped client {d}'s key are inconsistent")
            for u in alive:
                if d in self.routed.get(u, []):
                    seed = crypto.agree(s_sk, self.keys[u][1], mask_info(self.setup.round))
                    apply_mask(total, seed, -1 if u < d else 1, k)  # remove u's ±PRG(s_ud)
        np.bitwise_and(total, ring_mask(k), out=total)
        return total
