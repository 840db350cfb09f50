"""SecAgg+'s Harary graph: k-regular, symmetric, seeded; the complete graph when k is 0 or large."""

from __future__ import annotations

from fedent.secagg.graph import neighbours


def test_a_k_regular_symmetric_graph_from_the_seed() -> None:
    cids = list(range(0, 40, 2))
    g = neighbours(cids, 6, seed=7)
    assert all(len(v) == 6 and c not in v for c, v in g.items())
    assert all(c in g[v] for c, vs in g.items() for v in vs)
    assert g == neighbours(cids, 6, seed=7) and g != neighbours(cids, 6, seed=8)
    assert len(neighbours(cids, 5, seed=7)[0]) == 6  # odd degree rounds up (a Harary ring)


def test_degree_zero_or_large_is_all_pairs() -> None:
    for k in (0, 4, 9):
        g = neighbours([1, 2, 3, 4, 5], k, seed=0)
        assert g[3] == [1, 2, 4, 5]
