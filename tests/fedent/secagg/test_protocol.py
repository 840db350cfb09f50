"""SecAgg+ end to end over the pure state machines: the right sum, with dropouts up to the threshold, in both
threat models; a masked input that looks uniform whatever the input; clients that refuse requests revealing too
much. The malicious server's attacks and the consistency check are in test_consistency.py."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from scipy import stats

from fedent.secagg.fixedpoint import decode, encode, limit_for
from fedent.secagg.identity import SeededPKI
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
