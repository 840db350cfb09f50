"""SecAgg+ as two state machines, one client's (``ClientSession``) and the server's (``ServerSession``), exchanging
messages as bytes (so any transport can carry them: a function call in the simulator, the work stream in the
cluster). Bonawitz et al. 2017 with SecAgg+'s sparse graph of Bell et al. 2020, in either threat model of
``Setup.threat``: ``honest-but-curious`` (their Section 4: steps 0-4 below) or ``malicious`` (their Section 6,
the default: advertised keys are signed with each client's long-term Ed25519 identity, ``fedent.secagg.identity``,
and step 3b, the consistency check, comes before any share is revealed).

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
3b. consistency check (malicious only): the server sends each client of U2 (= U3 in Bonawitz's numbering: the
   clients whose masked input it holds) that set; each signs (round, U3) and returns the signature. Responders:
   U4. The unmask request then carries U3 and the signatures of U4; a client reveals nothing unless U3 is the
   set it signed, at least t_u of the signatures are valid signatures of members of U3 on that same set (none
   invalid), and the request's survivors and dropped are exactly its neighbours in U3 and outside it. A server
   that told two clients different U3s (to learn b_v from some and s_v^SK from others, which unmasks v) cannot
   collect t signatures on both, as honest clients sign once.
4. unmask: each survivor reveals, for each neighbour v it holds shares of, b_v's share when v ∈ U2 and s_v^SK's
   when v ∉ U2, never both (it refuses a request that would mix them). The server rebuilds every survivor's
   b_u and every dropped client's s^SK (t shares each), removes the self masks and the dropped clients'
   pairwise masks, and is left with Σ_{u ∈ U2} x_u mod 2^k.

The pairwise masks of two survivors cancel in the sum; the server sees each y_u, which is uniform over the ring
whatever x_u is (one-time pad with PRG(b_u)).

Why over 400 lines: the two state machines are one protocol, each message built on one side and checked on the
other; splitting them apart would separate every check from the message it guards.
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
from fedent.secagg.identity import SeededPKI, advertise_message, consistency_message


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
THREATS = ("honest-but-curious", "malicious")


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
    threat: str = "malicious"  # "malicious": signed keys and the consistency check; "honest-but-curious": neither

    @property
    def checked(self) -> bool:
        return self.threat == "malicious"

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.round, "ring_bits": self.ring_bits, "frac_bits": self.frac_bits,
                "rounding": self.rounding, "weighting": self.weighting, "groups": list(self.groups),
                "participants": self.participants, "threat": self.threat}

    @classmethod
    def from_dict(cls, d: Any) -> Setup:
        try:
            s = cls(int(d["round"]), int(d["ring_bits"]), int(d["frac_bits"]), str(d["rounding"]),
                    str(d["weighting"]), tuple(str(g) for g in d["groups"]), int(d["participants"]),
                    str(d["threat"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"secagg advertise: bad setup ({type(e).__name__}: {e})") from None
        if not 8 <= s.ring_bits <= 64 or not 0 <= s.frac_bits < s.ring_bits or s.participants < 1:
            raise ProtocolError("secagg advertise: ring_bits, frac_bits or participants out of range")
        if s.rounding not in ("nearest", "stochastic") or s.weighting not in ("samples", "uniform"):
            raise ProtocolError("secagg advertise: unknown rounding or weighting")
        if s.threat not in THREATS:
            raise ProtocolError(f"secagg advertise: unknown threat model {s.threat[:40]!r}")
        return s


class ClientSession:
    """One client's side of one round; each step may run once and in order. ``pki``: the client's identity
    (signing) and its peers' verification keys, needed under the malicious threat model; ``require``: the
    weakest threat model this client accepts (a server cannot talk it down to ``honest-but-curious``)."""

    def __init__(self, cid: int, pki: SeededPKI | None = None, require: str = "malicious") -> None:
        if require not in THREATS:
            raise ValueError(f"unknown secure-aggregation threat model {require!r}")
        self.cid, self.pki, self.require = cid, pki, require
        self.step = "new"
        self.t = 0  # t_u: this client's Shamir threshold (from the share request)
        self.u3: list[int] | None = None  # the survivor set this client signed (consistency check)
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
        handlers = {"advertise": self.advertise, "share": self.share, "route": self.route,
                    "consistency": self.consistency, "unmask": self.unmask}
        if step not in handlers:
            raise ProtocolError(f"secagg: unknown step {str(step)[:40]!r}")
        return handlers[step](unpack(request, step))

    def advertise(self, msg: dict[str, Any]) -> bytes:
        self._expect("new", "advertised")
        self.setup = Setup.from_dict(msg.get("setup"))
        if self.require == "malicious" and not self.setup.checked:
            raise ProtocolError(f"secagg advertise: client {self.cid} requires the malicious-server protocol "
                                f"(signed keys and the consistency check), the server announced {self.setup.threat}")
        if self.setup.checked and self.pki is None:
            raise ProtocolError(f"secagg advertise: client {self.cid} has no identity key to sign with")
        self.c_sk, self.s_sk = crypto.new_private(), crypto.new_private()
        c_pk, s_pk = crypto.public_of(self.c_sk), crypto.public_of(self.s_sk)
        out = {"step": "advertise", "c_pk": _b64(c_pk), "s_pk": _b64(s_pk)}
        if self.setup.checked:
            assert self.pki is not None
            out["sig"] = _b64(self.pki.sign(self.cid, advertise_message(self.setup.round, self.cid, c_pk, s_pk)))
        return pack(out)

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
        if 2 * t <= len(keys):  # two disjoint halves could each rebuild a secret: b_v from one, s_v^SK from the other
            raise ProtocolError(f"secagg share: a threshold of {t} of {len(keys)} neighbours is at most half; client "
                                f"{self.cid} refuses (a server could collect both secrets of a peer)")
        checked = self.setup.checked
        c_pub = {}
        for v, pair in keys.items():
            if not isinstance(pair, list) or len(pair) != (3 if checked else 2):
                raise ProtocolError(f"secagg share: each neighbour needs [c_pk, s_pk{', sig' if checked else ''}]")
            c_pub[v], self.s_pub[v] = _unb64(pair[0], "c_pk"), _unb64(pair[1], "s_pk")
            if checked:
                assert self.pki is not None
                sig = _unb64(pair[2], "sig")
                if not self.pki.verify(v, advertise_message(self.setup.round, v, c_pub[v], self.s_pub[v]), sig):
                    raise ProtocolError(f"secagg share: client {v}'s keys are not signed by its identity key (a "
                                        f"forged or altered advertisement); client {self.cid} aborts")
        if len({*c_pub.values(), *self.s_pub.values()}) != 2 * len(keys):
            raise ProtocolError("secagg share: neighbours' public keys must all differ")
        self.t = t
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

    def consistency(self, msg: dict[str, Any]) -> bytes:
        """Step 3b (malicious only): sign the server's U3 once, after checking it against what this client knows."""
        self._expect("masked", "checked")
        assert self.setup is not None
        if not self.setup.checked:
            raise ProtocolError("secagg consistency: the round was announced honest-but-curious")
        u3 = _cid_list(msg.get("survivors"), "secagg consistency: survivors")
        if self.cid not in u3:
            raise ProtocolError(f"secagg consistency: client {self.cid} sent its masked input but is not in U3")
        if len(u3) < self.t:
            raise ProtocolError(f"secagg consistency: U3 has {len(u3)} client(s), fewer than the threshold {self.t}")
        phantom = sorted((set(u3) & set(self._c_pub)) - set(self.held))
        if phantom:
            raise ProtocolError(f"secagg consistency: U3 names neighbour(s) {phantom[:5]} whose shares never "
                                f"reached client {self.cid} (they cannot have masked with it)")
        assert self.pki is not None
        self.u3 = u3
        return pack({"step": "consistency", "sig": _b64(self.pki.sign(self.cid,
                                                                     consistency_message(self.setup.round, u3)))})

    def _check_signed(self, msg: dict[str, Any], survivors: list[int], dropped: list[int]) -> None:
        """The unmask request of the malicious variant: the U3 this client signed, >= t_u valid signatures of
        members of U3 on it (no invalid one), and survivors/dropped exactly its neighbours in and outside U3."""
        assert self.setup is not None and self.pki is not None
        if self.u3 is None:
            raise ProtocolError(f"secagg unmask: client {self.cid} signed no survivor set; it reveals nothing")
        if _cid_list(msg.get("u3"), "secagg unmask: u3") != self.u3:
            raise ProtocolError(f"secagg unmask: the server's U3 differs from the one client {self.cid} signed "
                                "(inconsistent survivor sets); it aborts")
        sigs = _cid_map(msg.get("signatures"), "secagg unmask: signatures")
        text = consistency_message(self.setup.round, self.u3)
        for v, sig in sigs.items():
            if v not in self.u3 or not self.pki.verify(v, text, _unb64(sig, "signature")):
                raise ProtocolError(f"secagg unmask: client {v}'s signature on U3 is not valid (a different "
                                    f"survivor set, or forged); client {self.cid} aborts")
        if len(sigs) < self.t:
            raise ProtocolError(f"secagg unmask: {len(sigs)} valid signature(s) on U3, fewer than the threshold "
                                f"{self.t}; client {self.cid} aborts")
        want_s = sorted(({self.cid} | set(self.held)) & set(self.u3))
        want_d = sorted(set(self.held) - set(self.u3))
        if survivors != want_s or dropped != want_d:
            raise ProtocolError(f"secagg unmask: the survivors and dropped asked of client {self.cid} do not match "
                                "the U3 it signed (a request for both shares of a peer?); it aborts")

    def unmask(self, msg: dict[str, Any]) -> bytes:
        checked = self.setup is not None and self.setup.checked
        self._expect("checked" if checked else "masked", "unmasked")
        survivors = _cid_list(msg.get("survivors"), "secagg unmask: survivors")
        dropped = _cid_list(msg.get("dropped"), "secagg unmask: dropped")
        if set(survivors) & set(dropped):
            raise ProtocolError("secagg unmask: a client cannot be both a survivor and dropped (that would reveal "
                                "its input)")
        if self.cid not in survivors:
            raise ProtocolError(f"secagg unmask: client {self.cid} sent its masked input but is not a survivor")
        if set(self.held) - set(survivors) - set(dropped):
            raise ProtocolError("secagg unmask: every neighbour must be named a survivor or dropped")
        if checked:
            self._check_signed(msg, survivors, dropped)
        out = {}
        for v in sorted(self.held):
            b_share, s_share = self.held[v]
            out[str(v)] = ["b", hex(b_share)] if v in survivors else ["s", hex(s_share)]
        return pack({"step": "unmask", "shares": out})


class ServerSession:
    """The server's side of one round: it builds every request, routes the sealed shares, and unmasks the sum.
    ``pki`` (optional): verification keys, so that a badly signed client is dropped at once rather than making
    its neighbours abort; the clients check every signature themselves either way."""

    def __init__(self, setup: Setup, cids: Sequence[int], degree: int, fraction: float, graph_seed: int,
                 pki: SeededPKI | None = None) -> None:
        self.setup, self.pki = setup, pki
        self.cids = sorted(int(c) for c in cids)
        self.graph = graph.neighbours(self.cids, degree, graph_seed)
        self.t = {u: threshold(len(self.graph[u]), fraction) for u in self.cids}
        self.keys: dict[int, tuple[bytes, bytes]] = {}  # U0: (c_pk, s_pk)
        self.sealed: dict[int, dict[int, str]] = {}  # U1: sender -> receiver -> sealed share
        self.routed: dict[int, list[int]] = {}  # receiver -> senders routed to it (its mask peers)
        self.ad_sigs: dict[int, str] = {}  # U0's signatures on their advertised keys (malicious variant)
        self.u3: list[int] = []  # the survivor set of the consistency check (malicious variant)
        self.signatures: dict[int, str] = {}  # U4: their signatures on U3

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
                if self.setup.checked:
                    sig = msg.get("sig")
                    if not isinstance(sig, str):
                        raise ProtocolError("secagg advertise: the keys are not signed")
                    if self.pki is not None and not self.pki.verify(
                            u, advertise_message(self.setup.round, u, c_pk, s_pk), _unb64(sig, "sig")):
                        raise ProtocolError("secagg advertise: the keys are not signed by the client's identity")
                    self.ad_sigs[u] = sig
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
                           "neighbours": {str(v): [_b64(self.keys[v][0]), _b64(self.keys[v][1]),
                                                   *([self.ad_sigs[v]] if self.setup.checked else [])]
                                          for v in live}})
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

    def consistency_requests(self, survivors: Sequence[int]) -> dict[int, bytes]:
        """Step 3b: every client whose masked input the server holds gets that set, U3, to sign."""
        if not self.setup.checked:
            raise ProtocolError("secagg: no consistency check in the honest-but-curious variant")
        self.u3, self.signatures = sorted(int(c) for c in survivors), {}
        return {u: pack({"step": "consistency", "survivors": self.u3}) for u in self.u3}

    def take_consistency(self, responses: Mapping[int, bytes]) -> dict[int, str]:
        """Keep U4's signatures on U3; returns the clients whose answer is unusable, and why."""
        bad: dict[int, str] = {}
        text = consistency_message(self.setup.round, self.u3)
        for u, data in responses.items():
            try:
                sig = unpack(data, "consistency").get("sig")
                if u not in self.u3 or not isinstance(sig, str):
                    raise ProtocolError("secagg consistency: no signature, or not a client of U3")
                if self.pki is not None and not self.pki.verify(u, text, _unb64(sig, "sig")):
                    raise ProtocolError("secagg consistency: the signature on U3 is not valid")
                self.signatures[u] = sig
            except ProtocolError as e:
                bad[u] = str(e)
        return bad

    def unmask_requests(self, survivors: Sequence[int]) -> dict[int, bytes]:
        """Each survivor's unmask request; in the malicious variant only U4's (they signed), with U3 and every
        signature, and ``survivors`` must be the U3 they signed."""
        alive = set(survivors)
        if self.setup.checked and sorted(alive) != self.u3:
            raise ProtocolError("secagg: the survivors to unmask are not the U3 of the consistency check")
        extra = {"u3": self.u3, "signatures": {str(v): s for v, s in sorted(self.signatures.items())}}
        return {u: pack({"step": "unmask", "survivors": sorted(({u} | set(self.routed[u])) & alive),
                         "dropped": sorted(set(self.routed[u]) - alive), **(extra if self.setup.checked else {})})
                for u in sorted(alive) if not self.setup.checked or u in self.signatures}

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
