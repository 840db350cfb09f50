"""The client half on a host: the vector layout, and bad messages or values failing one client, never the host."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedent.secagg.fixedpoint import RangeError
from fedent.secagg.hosted import HostedSecAgg, split_vector, update_vector
from fedent.secagg.protocol import ProtocolError, ServerSession, Setup
from fedent.strategies.base import ClientUpdate


def test_the_vector_is_the_scaled_model_then_the_groups_and_splits_back() -> None:
    like = [torch.zeros(2, 2), torch.zeros(3)]
    u = ClientUpdate(0, [torch.ones(2, 2), torch.full((3,), 2.0)], 5, 0.0, {"g": [torch.ones(2, 2), torch.ones(3)]})
    v = update_vector(u, "samples", ("g",))
    assert v.tolist() == [5.0] * 4 + [10.0] * 3 + [5.0] * 7
    assert update_vector(u, "uniform", ())[:7].tolist() == [1.0] * 4 + [2.0] * 3
    params, groups = split_vector(v, like, ("g",))
    assert params[1].tolist() == [10.0] * 3 and groups["g"][0].shape == (2, 2)
    with pytest.raises(ProtocolError, match="elements"):
        split_vector(v[:-1], like, ("g",))


def test_a_message_without_a_session_or_a_value_too_large_fails_that_client() -> None:
    h = HostedSecAgg(seed=0)
    with pytest.raises(ProtocolError, match="no session"):
        h.handle(0, 1, b'{"step":"route","sealed":{}}')
    with pytest.raises(ProtocolError, match="not a protocol message"):
        h.handle(0, 1, b"\xff")
    srv = ServerSession(Setup(0, 32, 20, "nearest", "samples", (), 2), [0, 1], 0, 0.6, 0)

    def ask(reqs: dict[int, bytes]) -> dict[int, bytes]:
        return {c: h.handle(0, c, r) for c, r in reqs.items()}

    srv.take_advertise(ask(srv.advertise_requests()))
    srv.take_share(ask(srv.share_requests()[0]))
    ask(srv.route_requests())
    assert h.active(0, 0) and not h.active(1, 0)
    with pytest.raises(RangeError):  # 100 samples x 20 x 2^20 > 2^31 / 2: two such clients could wrap Z_2^32
        h.mask(0, ClientUpdate(0, [torch.full((3,), 20.0)], 100, 0.0))
    ok = h.mask(0, ClientUpdate(1, [torch.full((3,), 0.5)], 2, 0.0))
    assert ok.params == [] and ok.masked is not None and ok.masked.dtype == np.uint64 and ok.masked.size == 3
