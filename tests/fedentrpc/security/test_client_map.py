"""The client map: which worker identity alone may host which client; every bad file is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedentrpc.security.client_map import dump_client_map, load_client_map, parse_client_map
from fedentrpc.security.errors import SecurityConfigError


def test_ranges_lists_and_ints_map_each_client_to_its_identity(tmp_path: Path) -> None:
    got = parse_client_map({"worker-0": "0-2,5", "worker-1": [3, 4], "worker-2": 6}, num_clients=7)
    assert got == {0: "worker-0", 1: "worker-0", 2: "worker-0", 5: "worker-0", 3: "worker-1", 4: "worker-1",
                   6: "worker-2"}
    path = tmp_path / "clients.yaml"
    path.write_text(dump_client_map({"a": [0, 1], "b": [2]}))
    assert load_client_map(path, 3) == {0: "a", 1: "a", 2: "b"}


@pytest.mark.parametrize(("raw", "n", "needle"), [
    ({"w0": "0-1", "w1": "1-2"}, 3, "client 1 is mapped to both 'w0' and 'w1'"),
    ({"w0": "0-1"}, 3, "clients [2] are mapped to no worker"),
    ({"w0": "0-3"}, 3, "clients.w0: client 3 is out of range [0, 3)"),
    ({"w0": "x-1"}, 3, "clients.w0: bad client id list 'x-1'"),
    ({"w0": "2-1"}, 3, "bad range '2-1'"),
    ({"w0": True}, 3, "expected client ids"),
    ([0, 1], 3, "expected a mapping"),
    ({"": [0]}, 1, "non-empty strings"),
])
def test_a_bad_map_is_one_error(raw: object, n: int, needle: str) -> None:
    with pytest.raises(SecurityConfigError) as e:
        parse_client_map(raw, n)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_an_unreadable_file_names_itself(tmp_path: Path) -> None:
    with pytest.raises(SecurityConfigError, match="clients file .*missing.yaml: unreadable"):
        load_client_map(tmp_path / "missing.yaml")
