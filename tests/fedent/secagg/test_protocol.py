"""SecAgg+ end to end over the pure state machines: the right sum, with dropouts up to the threshold, in both
threat models; a masked input that looks uniform whatever the input; clients that refuse requests revealing too
much; and a malicious server's lies (different survivor sets, forged keys or signatures) refused by the signed
keys and the consistency check."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from scipy import stats

from fedent.secagg import crypto
from fedent.secagg.fixedpoint import decode, encode, limit_for
from fedent.secagg.identity import SeededPKI, advertise_message
from fedent.secagg.protocol import ClientSession, ProtocolError, ServerSession, Setup

PKI = SeededPKI.from_seed(7)


def setup_round(cids: Sequence[int], degree: int = 0, fraction: float = 0.6, ring_bits: int = 64,
                frac_bits: int = 24, threat: str = "malicious") -> tuple[ServerSession, dict[int, ClientSession]]:
    """Advertise, share and route for every client (none drops before masking)."""
    srv = ServerSession(Setup(5, ring_bits, frac_bits, "nearest", "samples", (), len(cids), threat), cids, degree,
                        fraction, graph_seed=11, pki=PKI)
    clients = {c: ClientSession(c, PKI, threat) for c in cids}

    def ask(reqs: Mapping[int, bytes]) -> dict[int, bytes]:
        return {c: clients[c].handle(r) for c, r in reqs.items()}

    assert srv.take_advertise(ask(srv.advertise_requests())) == {}
    reqs, short = srv.share_requests()
    assert short == {}
    assert srv.take_share(ask(reqs)) == {}
    ask(srv.route_requests())
    return srv, clients


def secure_sum(srv: ServerSession, clients: Mapping[int, ClientSession], xs: Mapping[int, np.ndarray],
               drop: set[int]) -> np.ndarray:
    """Every client masks; those in ``drop`` never deliver; the survivors answer the unmask request."""
    k, f = srv.setup.ring_bits, srv.setup.frac_bits
    masked = {c: clients[c].mask(encode(xs[c], f, k, limit_for(k, len(xs)))) for c in xs}
    alive = {c: y for c, y in masked.items() if c not in drop}
    if srv.setup.checked:
        assert srv.take_consistency({c: clients[c].handle(r)
                                     for c, r in srv.consistency_requests(sorted(alive)).items()}) == {}
    resp = {c: clients[c].handle(r) for c, r in srv.unmask_requests(sorted(alive)).items()}
    return decode(srv.unmask(alive, resp), f, k)


def inputs(cids: Sequence[int], n: int = 300) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(3)
    return {c: rng.normal(scale=50.0, size=n) for c in cids}


@pytest.mark.parametrize("threat", ["malicious", "honest-but-curious"])
@pytest.mark.parametrize(("cids", "degree"), [(list(range(10)), 0), (list(range(3, 43, 2)), 6)])
def test_the_unmasked_sum_is_the_plain_sum_within_the_resolution(cids: list[int], degree: int, threat: str) -> None:
    srv, clients = setup_round(cids, degree, threat=threat)
    xs = inputs(cids)
    got = secure_sum(srv, clients, xs, set())
    want = sum(xs.values())
    assert np.abs(got - want).max() <= len(cids) * 2.0 ** -25 + 1e-9
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


@pytest.mark.parametrize("threat", ["malicious", "honest-but-curious"])
def test_dropping_up_to_degree_minus_threshold_after_masking_still_gives_the_survivors_sum(threat: str) -> None:
    cids = list(range(10))  # all pairs: 9 neighbours each, t = ceil(0.6 * 9) = 6: 3 may drop
    srv, clients = setup_round(cids, threat=threat)
    assert set(srv.t.values()) == {6}
    xs = inputs(cids)
    drop = {1, 4, 8}
    got = secure_sum(srv, clients, xs, drop)
    want = sum(x for c, x in xs.items() if c not in drop)
    assert np.abs(got - want).max() <= 10 * 2.0 ** -25 + 1e-9


def test_dropouts_in_a_sparse_graph_are_recovered_from_the_neighbours_shares() -> None:
    cids = list(range(20))  # degree 6, t = ceil(0.6 * 6) = 4: up to 2 of any neighbourhood may drop
    srv, clients = setup_round(cids, degree=6)
    xs = inputs(cids)
    drop = {c for c in cids if c % 7 == 0}  # 0, 7, 14: at most 2 in one neighbourhood (checked below)
    assert max(len(set(srv.graph[c]) & drop) for c in cids) <= 2
    got = secure_sum(srv, clients, xs, drop)
    assert np.abs(got - sum(x for c, x in xs.items() if c not in drop)).max() <= 20 * 2.0 ** -25 + 1e-9


def test_one_drop_too_many_cannot_be_unmasked_and_says_why() -> None:
    cids = list(range(10))
    srv, clients = setup_round(cids)
    with pytest.raises(ProtocolError, match="fewer|cannot"):
        secure_sum(srv, clients, inputs(cids), {0, 1, 2, 3})


def test_a_masked_input_is_uniform_over_the_ring_and_independent_of_the_input() -> None:
    """What reaches the server from one client: 2^16 coordinates of y_u in Z_2^16, for an all-zero input and for a
    large constant one. Both pass a chi-square test of uniformity (256 bins) and a KS test against U[0, 2^16), and
    a two-sample KS test cannot tell them apart; the plain encodings are as far from uniform as can be."""
    n, k = 1 << 16, 16
    samples = []
    for value in (0.0, 100.0):
        srv, clients = setup_round([0, 1, 2], ring_bits=k, frac_bits=4)
        x = np.full(n, value)
        plain = encode(x, 4, k, limit_for(k, 3))
        assert len(np.unique(plain)) == 1  # the input itself: one value
        y = clients[0].mask(plain).astype(np.float64)
        counts = np.bincount((y // 256).astype(np.int64), minlength=256)
        assert stats.chisquare(counts).pvalue > 1e-4
        assert stats.kstest(y / 2 ** k, "uniform").pvalue > 1e-4
        samples.append(y)
    assert stats.ks_2samp(samples[0], samples[1]).pvalue > 1e-4


def test_a_client_never_reveals_both_secrets_of_a_neighbour() -> None:
    srv, clients = setup_round([0, 1, 2, 3], threat="honest-but-curious")
    clients[0].mask(np.zeros(4, dtype=np.uint64))
    bad = json.dumps({"step": "unmask", "survivors": [0, 1, 2], "dropped": [2, 3]}).encode()
    with pytest.raises(ProtocolError, match="both a survivor and dropped"):
        clients[0].handle(bad)


def test_messages_out_of_order_or_re_addressed_are_refused() -> None:
    c = ClientSession(0, PKI)
    with pytest.raises(ProtocolError, match="state new"):
        c.handle(json.dumps({"step": "route", "sealed": {}}).encode())
    srv = ServerSession(Setup(1, 64, 24, "nearest", "samples", (), 3), [0, 1, 2], 0, 0.6, 0)
    cl = {i: ClientSession(i, PKI) for i in range(3)}
    srv.take_advertise({i: cl[i].handle(r) for i, r in srv.advertise_requests().items()})
    reqs, _ = srv.share_requests()
    srv.take_share({i: cl[i].handle(r) for i, r in reqs.items()})
    swapped = {"step": "route", "sealed": {"1": srv.sealed[2][0]}}  # client 2's share to 0, claimed as 1's
    with pytest.raises(ValueError, match="authenticate"):
        cl[0].handle(json.dumps(swapped).encode())


# ---- the malicious-server variant: signed keys and the consistency check (Bonawitz et al. 2017, Section 6) ----

def masked_round(cids: Sequence[int]) -> tuple[ServerSession, dict[int, ClientSession], dict[int, np.ndarray]]:
    """Every client set up and masked (malicious variant); returns the server, the clients and the masked inputs."""
    srv, clients = setup_round(cids)
    xs = inputs(cids, 8)
    k, f = srv.setup.ring_bits, srv.setup.frac_bits
    return srv, clients, {c: clients[c].mask(encode(xs[c], f, k, limit_for(k, len(cids)))) for c in cids}


def sign_each(clients: Mapping[int, ClientSession], views: Mapping[int, list[int]]) -> dict[int, str]:
    """Each client signs the U3 the (lying) server showed it; its signature, base64."""
    out = {}
    for c, u3 in views.items():
        out[c] = json.loads(clients[c].handle(json.dumps({"step": "consistency", "survivors": u3}).encode()))["sig"]
    return out


def unmask_request(srv: ServerSession, u: int, u3: list[int], sigs: Mapping[int, str]) -> bytes:
    held = set(srv.routed[u])
    return json.dumps({"step": "unmask", "survivors": sorted(({u} | held) & set(u3)), "dropped": sorted(held - set(u3)),
                       "u3": u3, "signatures": {str(v): s for v, s in sigs.items()}}).encode()


def test_the_check_changes_nothing_in_an_honest_round() -> None:
    """The same inputs summed with and without the consistency check: the same ring sum, bit for bit."""
    cids, xs = list(range(8)), inputs(list(range(8)))
    sums = [secure_sum(*setup_round(cids, threat=threat), xs, {2}) for threat in ("malicious", "honest-but-curious")]
    assert np.array_equal(sums[0], sums[1])
    assert np.abs(sums[0] - sum(x for c, x in xs.items() if c != 2)).max() <= 8 * 2.0 ** -25 + 1e-9


def test_different_survivor_sets_for_different_clients_are_refused_before_any_share_leaves() -> None:
    """The server tells clients 0-4 that everyone survived and 5-8 that client 9 dropped (to get b_9's shares from
    the first and s_9's from the second; 9 itself refuses to sign a U3 without it). Each group has fewer than t = 6
    signatures on its set: every client aborts; handing a client the other group's signatures too fails their
    verification, and a U3 other than the one it signed is refused. No client answers."""
    cids = list(range(10))
    srv, clients, _ = masked_round(cids)
    with pytest.raises(ProtocolError, match="client 9 sent its masked input but is not in U3"):
        sign_each(clients, {9: cids[:9]})
    views = {c: cids if c < 5 else cids[:9] for c in cids[:9]}
    sigs = sign_each(clients, views)
    for c in cids[:9]:
        own = {v: s for v, s in sigs.items() if views[v] == views[c]}
        with pytest.raises(ProtocolError, match=f"{5 if c < 5 else 4} valid signature.*fewer than the threshold 6"):
            clients[c].unmask(json.loads(unmask_request(srv, c, views[c], own)))
        clients[c].step = "checked"  # the refusal left it unanswered; try the other lie on the same client
        with pytest.raises(ProtocolError, match="signature on U3 is not valid"):
            clients[c].unmask(json.loads(unmask_request(srv, c, views[c], sigs)))
        clients[c].step = "checked"
        other = cids[:9] if c < 5 else cids
        with pytest.raises(ProtocolError, match="differs from the one client"):
            clients[c].unmask(json.loads(unmask_request(srv, c, other, sigs)))


def test_a_request_for_both_shares_of_a_peer_or_a_second_request_is_refused() -> None:
    cids = list(range(6))  # 5 neighbours, t = 3
    srv, clients, masked = masked_round(cids)
    u3 = cids[:5]  # client 5 dropped after masking: its pairwise key's shares are due, never its self mask's
    sigs = sign_each(clients, {c: u3 for c in u3})
    both = json.loads(unmask_request(srv, 0, u3, sigs))
    both["survivors"].append(5)  # b_5's share as well as s_5's
    with pytest.raises(ProtocolError, match="both a survivor and dropped"):
        clients[0].unmask(both)
    clients[0].step = "checked"
    swapped = json.loads(unmask_request(srv, 0, u3, sigs))
    swapped["survivors"], swapped["dropped"] = [0, 1, 2, 3, 5], [4]  # 5 alive, 4 dropped: not the U3 it signed
    with pytest.raises(ProtocolError, match="do not match the U3"):
        clients[0].unmask(swapped)
    clients[0].step = "checked"
    first = json.loads(clients[0].handle(unmask_request(srv, 0, u3, sigs)))["shares"]
    assert first["5"][0] == "s" and {first[str(v)][0] for v in range(1, 5)} == {"b"}
    with pytest.raises(ProtocolError, match="in state unmasked"):  # asked again, e.g. with 5 now a survivor
        clients[0].handle(unmask_request(srv, 0, cids, sigs))
    # the honest run of the same round still unmasks
    alive = {c: masked[c] for c in u3}
    resp = {c: clients[c].handle(unmask_request(srv, c, u3, sigs)) for c in range(1, 5)}
    resp[0] = pack_shares(first)
    assert srv.unmask(alive, resp).shape == (8,)


def pack_shares(shares: dict[str, list[str]]) -> bytes:
    return json.dumps({"step": "unmask", "shares": shares}).encode()


def test_forged_signatures_and_forged_keys_are_refused() -> None:
    """A server without the clients' identity keys: its own signatures on U3, and its own keys advertised in
    client 1's name (to read the shares sealed to client 1), are both caught."""
    cids = list(range(5))
    srv, clients, _ = masked_round(cids)
    sigs = sign_each(clients, {c: cids for c in cids[:2]})  # 2 real signatures, t = 3
    fake = SeededPKI(b"not the clients' identity secret")
    sigs[2] = base64.b64encode(fake.sign(2, b"fedent-secagg consistency|5|0,1,2,3,4")).decode()
    with pytest.raises(ProtocolError, match="client 2's signature on U3 is not valid"):
        clients[0].unmask(json.loads(unmask_request(srv, 0, cids, sigs)))

    srv = ServerSession(Setup(5, 64, 24, "nearest", "samples", (), 3), [0, 1, 2], 0, 0.6, 1)
    cl = {c: ClientSession(c, PKI) for c in range(3)}
    assert srv.take_advertise({c: cl[c].handle(r) for c, r in srv.advertise_requests().items()}) == {}
    evil_c, evil_s = crypto.public_of(crypto.new_private()), crypto.public_of(crypto.new_private())
    srv.keys[1] = (evil_c, evil_s)
    srv.ad_sigs[1] = base64.b64encode(fake.sign(1, advertise_message(5, 1, evil_c, evil_s))).decode()
    reqs, _ = srv.share_requests()
    with pytest.raises(ProtocolError, match="client 1's keys are not signed by its identity key"):
        cl[0].handle(reqs[0])


def test_a_client_cannot_be_talked_down_to_the_honest_but_curious_protocol_or_a_low_threshold() -> None:
    srv = ServerSession(Setup(5, 64, 24, "nearest", "samples", (), 3, "honest-but-curious"), [0, 1, 2], 0, 0.6, 1)
    with pytest.raises(ProtocolError, match="requires the malicious-server protocol"):
        ClientSession(0, PKI).handle(srv.advertise_requests()[0])
    assert json.loads(ClientSession(0, PKI, "honest-but-curious").handle(srv.advertise_requests()[0]))["c_pk"]
    srv = ServerSession(Setup(5, 64, 24, "nearest", "samples", (), 5), list(range(5)), 0, 0.6, 1)
    cl = {c: ClientSession(c, PKI) for c in range(5)}
    srv.take_advertise({c: cl[c].handle(r) for c, r in srv.advertise_requests().items()})
    req = json.loads(srv.share_requests()[0][0])
    req["threshold"] = 2  # 2 of 4 neighbours: two disjoint pairs could rebuild b_v and s_v^SK
    with pytest.raises(ProtocolError, match="at most half"):
        cl[0].handle(json.dumps(req).encode())


def test_the_server_drops_a_badly_signed_client_and_asks_only_the_signers_to_unmask() -> None:
    cids = list(range(6))
    srv, clients, masked = masked_round(cids)
    reqs = srv.consistency_requests(cids)
    got = {c: clients[c].handle(r) for c, r in reqs.items() if c != 3}  # 3 never answers
    got[4] = json.dumps({"step": "consistency", "sig": got[5].decode() and json.loads(got[5])["sig"]}).encode()
    assert set(srv.take_consistency(got)) == {4}  # 4's answer carries 5's signature
    assert sorted(srv.unmask_requests(cids)) == [0, 1, 2, 5]
    with pytest.raises(ProtocolError, match="not the U3"):
        srv.unmask_requests(cids[:5])


def test_a_survivor_set_too_small_or_naming_a_peer_that_never_shared_is_not_signed() -> None:
    cids = list(range(6))  # t = 3
    srv, clients, _ = masked_round(cids)
    with pytest.raises(ProtocolError, match="U3 has 2 client.*fewer than the threshold 3"):
        sign_each(clients, {0: [0, 1]})
    del clients[1].held[2]  # as if client 2's shares had never been routed to client 1
    with pytest.raises(ProtocolError, match=r"names neighbour\(s\) \[2\] whose shares never reached client 1"):
        sign_each(clients, {1: cids})
    assert sign_each(clients, {2: cids})[2]  # a consistent U3 is signed


def test_the_server_drops_an_unsigned_or_badly_signed_advertisement_and_clients_will_not_skip_the_check() -> None:
    srv = ServerSession(Setup(5, 64, 24, "nearest", "samples", (), 4), list(range(4)), 0, 0.6, 1, pki=PKI)
    cl = {c: ClientSession(c, PKI) for c in range(4)}
    got = {c: cl[c].handle(r) for c, r in srv.advertise_requests().items()}
    unsigned = json.loads(got[1])
    del unsigned["sig"]
    forged = json.loads(got[2])
    forged["sig"] = json.loads(got[3])["sig"]  # client 3's signature on client 3's keys, claimed for client 2
    bad = srv.take_advertise({**got, 1: json.dumps(unsigned).encode(), 2: json.dumps(forged).encode()})
    assert sorted(bad) == [1, 2] and "not signed" in bad[1] and "identity" in bad[2] and sorted(srv.keys) == [0, 3]
    srv, clients, _ = masked_round(list(range(4)))  # no consistency check: no answer
    with pytest.raises(ProtocolError, match="client 0 got a unmasked message in state masked"):
        clients[0].handle(unmask_request(srv, 0, list(range(4)), {}))
