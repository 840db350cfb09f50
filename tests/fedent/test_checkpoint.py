"""Checkpoints: round trip, keep-K, torn/corrupt fallback, config mismatch, SIGKILL in a tight save loop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from fedent.checkpoint import (
    MAGIC,
    Checkpoint,
    CheckpointMismatchError,
    CorruptStateError,
    checkpoint_path,
    config_fingerprint,
    decode_payload,
    encode_payload,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    save_checkpoint,
)
from fedent.config import ConfigError, config_from_dict
from fedent.strategies.fedadam import FedAdam
from fedent.strategies.registry import STRATEGIES, build_strategy


def _ckpt(rnd: int, fp: str = "fp", value: float | None = None) -> Checkpoint:
    v = float(rnd) if value is None else value
    return Checkpoint(
        round=rnd,
        global_params=[torch.full((3, 2), v), torch.full((4,), -v)],
        config_fingerprint=fp,
        seed=7,
        server_state={"m": [torch.ones(2) * v], "v": [torch.zeros(2)], "step": rnd},
        estimator={"trajectory": [{"round": r, "phi2_pred": 0.5 * r} for r in range(rnd + 1)]},
        clients={"worker-0": {"cids": [0, 1], "last_heartbeat": 12.5}},
        extra={"elapsed_s": 3.25},
    )


def test_round_trip_preserves_everything(tmp_path: Path) -> None:
    ck = _ckpt(4)
    save_checkpoint(tmp_path, ck)
    got = load_latest_checkpoint(tmp_path)
    assert got is not None
    assert got.round == 4 and got.next_round == 5 and got.seed == 7 and got.config_fingerprint == "fp"
    assert all(torch.equal(a, b) for a, b in zip(got.global_params, ck.global_params, strict=True))
    assert torch.equal(got.server_state["m"][0], ck.server_state["m"][0]) and got.server_state["step"] == 4
    assert got.estimator == ck.estimator and got.clients == ck.clients and got.extra == ck.extra
    assert got.created_at > 0


def test_saved_tensors_do_not_alias_the_live_model(tmp_path: Path) -> None:
    live = [torch.zeros(3)]
    save_checkpoint(tmp_path, Checkpoint(round=0, global_params=live, config_fingerprint="fp", seed=0))
    live[0].add_(1.0)
    got = load_latest_checkpoint(tmp_path)
    assert got is not None and torch.equal(got.global_params[0], torch.zeros(3))


def test_keeps_only_latest_k(tmp_path: Path) -> None:
    for r in range(6):
        save_checkpoint(tmp_path, _ckpt(r), keep=2)
    assert [r for r, _ in list_checkpoints(tmp_path)] == [5, 4]
    got = load_latest_checkpoint(tmp_path)
    assert got is not None and got.round == 5


def test_empty_or_missing_dir_gives_none(tmp_path: Path) -> None:
    assert load_latest_checkpoint(tmp_path / "nope") is None
    assert load_latest_checkpoint(tmp_path) is None


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_corrupt_latest_falls_back_to_previous(tmp_path: Path, damage: str) -> None:
    for r in range(3):
        save_checkpoint(tmp_path, _ckpt(r))
    latest = checkpoint_path(tmp_path, 2)
    data = latest.read_bytes()
    if damage == "truncate":
        latest.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        pos = len(data) - 10
        latest.write_bytes(data[:pos] + bytes([data[pos] ^ 0x01]) + data[pos + 1:])
    elif damage == "garbage":
        latest.write_bytes(b"not a checkpoint at all")
    else:
        latest.write_bytes(b"")
    with pytest.raises(CorruptStateError):
        load_checkpoint(latest)
    got = load_latest_checkpoint(tmp_path)
    assert got is not None and got.round == 1
    assert torch.equal(got.global_params[0], torch.full((3, 2), 1.0))


def test_all_corrupt_gives_none(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _ckpt(0))
    checkpoint_path(tmp_path, 0).write_bytes(MAGIC + b"\x00" * 10)
    assert load_latest_checkpoint(tmp_path) is None


def test_stale_temp_files_are_ignored_and_cleaned(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _ckpt(0))
    torn = tmp_path / ".round-00000001.ckpt.abc123.tmp"
    torn.write_bytes(encode_payload({"kind": "checkpoint"})[:20])
    got = load_latest_checkpoint(tmp_path)
    assert got is not None and got.round == 0
    save_checkpoint(tmp_path, _ckpt(1))
    assert not torn.exists()


def test_decode_rejects_bad_length_and_unpickles_nothing(tmp_path: Path) -> None:
    blob = encode_payload({"a": torch.arange(3)})
    assert torch.equal(decode_payload(blob, "x")["a"], torch.arange(3))
    with pytest.raises(CorruptStateError, match="truncated"):
        decode_payload(blob + b"extra", "x")


def test_non_storable_state_is_refused_before_writing(tmp_path: Path) -> None:
    bad = Checkpoint(round=0, global_params=[torch.zeros(1)], config_fingerprint="fp", seed=0,
                     server_state={"fn": object()})
    with pytest.raises(TypeError, match="cannot checkpoint"):
        save_checkpoint(tmp_path, bad)
    assert list_checkpoints(tmp_path) == []


def test_scalar_subclasses_are_stored_plain_or_refused_never_written_unreadable(tmp_path: Path) -> None:
    """numpy scalars and torch's version string pickle fine but ``torch.load(weights_only=True)`` refuses them: a
    checkpoint holding one was written and then skipped as unreadable on resume. A checkpoint stores them as plain
    numbers and strings; a raw payload with one is refused before writing."""
    import enum

    import numpy as np

    class Kind(str, enum.Enum):
        A = "a"

    class Level(enum.IntEnum):
        HIGH = 3

    extra = {"torch": torch.__version__, "f": np.float64(1.5), "i": np.int64(2), "b": np.bool_(True),
             "nested": [np.float32(0.25), {"s": torch.__version__}], "t": True, "k": Kind.A, "l": Level.HIGH,
             np.str_("key"): 1, Level.HIGH: "by enum"}
    save_checkpoint(tmp_path, Checkpoint(round=0, global_params=[torch.zeros(1)], config_fingerprint="fp", seed=0,
                                         extra=extra))
    back = load_latest_checkpoint(tmp_path)
    assert back is not None and back.extra == {"torch": str(torch.__version__), "f": 1.5, "i": 2, "b": True,
                                               "nested": [0.25, {"s": str(torch.__version__)}], "t": True,
                                               "k": "a", "l": 3, "key": 1, 3: "by enum"}
    assert [type(back.extra[k]) for k in ("torch", "f", "i", "b", "t", "k", "l")] == [str, float, int, bool, bool,
                                                                                       str, int]
    assert {type(k) for k in back.extra} == {str, int}
    with pytest.raises(TypeError, match=r"state\.v: cannot checkpoint a TorchVersion \(a subclass of str"):
        encode_payload({"v": torch.__version__})
    with pytest.raises(TypeError, match="cannot checkpoint a float64"):
        encode_payload({"v": [np.float64(1.0)]})
    with pytest.raises(TypeError, match="must be a str or int \\(not a subclass: str_\\)"):
        encode_payload({np.str_("k"): 1})


def test_config_fingerprint_and_mismatch(tmp_path: Path) -> None:
    a = config_from_dict({"train": {"rounds": 3, "seed": 1}})
    same_but_device = config_from_dict({"train": {"rounds": 3, "seed": 1, "device": "cpu"}, "out_dir": "x"})
    other = config_from_dict({"train": {"rounds": 3, "seed": 2}})
    assert config_fingerprint(a) == config_fingerprint(same_but_device)
    assert config_fingerprint(a) != config_fingerprint(other)
    save_checkpoint(tmp_path, _ckpt(0, fp=config_fingerprint(a)))
    resumed = load_latest_checkpoint(tmp_path, expect_fingerprint=config_fingerprint(same_but_device))
    assert resumed is not None
    with pytest.raises(CheckpointMismatchError, match="different config") as ei:
        load_latest_checkpoint(tmp_path, expect_fingerprint=config_fingerprint(other))
    assert isinstance(ei.value, ConfigError) and "\n" not in str(ei.value)


def test_strategy_server_state_resumes_through_a_checkpoint(tmp_path: Path) -> None:
    """A real strategy's server_state() survives save/load and load_server_state() accepts it."""
    cfg = config_from_dict({"algorithm": {"name": "fedadam"}})
    strat = build_strategy(cfg.algorithm)
    assert isinstance(strat, FedAdam)
    params = [torch.randn(4, 3), torch.randn(3)]
    from fedent.strategies.base import ClientUpdate

    ups = [ClientUpdate(cid=c, params=[p + 0.1 * (c + 1) for p in params], num_samples=10 + c, train_loss=1.0)
           for c in range(2)]
    strat.setup(params, [10, 11])
    res = strat.aggregate(0, params, ups)
    save_checkpoint(tmp_path, Checkpoint(round=0, global_params=res.params, config_fingerprint="f", seed=0,
                                         server_state=strat.server_state()))
    got = load_latest_checkpoint(tmp_path)
    assert got is not None
    fresh = build_strategy(cfg.algorithm)
    fresh.setup(params, [10, 11])
    fresh.load_server_state(got.server_state)
    ups2 = [ClientUpdate(cid=c, params=[p - 0.05 * c for p in res.params], num_samples=10 + c, train_loss=1.0)
            for c in range(2)]
    a = strat.aggregate(1, res.params, ups2).params
    b = fresh.aggregate(1, got.global_params, ups2).params
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


_WRITER = textwrap.dedent(
    """
    import sys, torch
    from fedent.checkpoint import Checkpoint, save_checkpoint
    from fedent.client_store import ClientStateStore
    from fedent.strategies.base import ClientState
    ck_dir, cs_dir = sys.argv[1], sys.argv[2]
    store = ClientStateStore(cs_dir, keep=2)
    big = 200_000  # big enough that a write takes a while, so the kill lands mid-write sometimes
    r = 0
    while True:
        v = float(r)
        save_checkpoint(ck_dir, Checkpoint(round=r, global_params=[torch.full((big,), v)],
                                           config_fingerprint="fp", seed=0, extra={"v": v}), keep=2)
        store.save(3, ClientState(tensors={"h": [torch.full((big,), v)]}, scalars={"eta": v}), r)
        r += 1
    """
)


def test_sigkill_in_tight_save_loop_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    from fedent.client_store import ClientStateStore

    ck_dir, cs_dir = tmp_path / "ck", tmp_path / "cs"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(ck_dir), str(cs_dir)], env=env)
    try:
        deadline = time.monotonic() + 60
        while len(list_checkpoints(ck_dir)) < 2:
            assert proc.poll() is None, "writer exited early"
            assert time.monotonic() < deadline, "writer made no checkpoints"
            time.sleep(0.01)
        time.sleep(0.137)  # land somewhere inside a later write
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    newest_name = list_checkpoints(ck_dir)[0][0]
    got = load_latest_checkpoint(ck_dir)
    assert got is not None
    assert got.round == newest_name  # every checkpoint-named file is complete (rename is atomic)
    assert torch.equal(got.global_params[0], torch.full((200_000,), float(got.round)))
    assert got.extra == {"v": float(got.round)}
    store = ClientStateStore(cs_dir, keep=2)  # also removes any temp file the kill left
    state = store.load(3)
    assert state is not None
    newest_state = store.versions(3)[0]
    assert state.scalars["eta"] == float(newest_state)
    assert torch.equal(state.tensors["h"][0], torch.full((200_000,), float(newest_state)))
    assert not list(cs_dir.glob(".*.tmp"))


def _same_state(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict):
        return isinstance(b, dict) and set(a) == set(b) and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same_state, a, b))
    return a == b


@pytest.mark.parametrize("algorithm", sorted(STRATEGIES))
def test_every_strategys_server_state_survives_a_checkpoint(tmp_path: Path, algorithm: str) -> None:
    """Whatever Strategy.server_state() holds after real rounds is storable and loads back unchanged."""
    from conftest import tiny_config, tiny_inputs

    from fedent.sim.simulator import run_simulation

    cfg = tiny_config(algorithm, rounds=1)
    inputs = tiny_inputs()
    strat = build_strategy(cfg.algorithm)
    res = run_simulation(cfg, tmp_path / "run", progress=False, inputs=inputs, strategy=strat, plots=False)
    state = strat.server_state()
    save_checkpoint(tmp_path / "ck", Checkpoint(round=1, global_params=res.params, config_fingerprint="f",
                                                seed=cfg.train.seed, server_state=state))
    got = load_latest_checkpoint(tmp_path / "ck")
    assert got is not None and _same_state(got.server_state, state)
    fresh = build_strategy(cfg.algorithm)
    fresh.setup([p.detach() for p in inputs.make_model().parameters()], inputs.client_sizes())
    fresh.load_server_state(got.server_state)
    assert _same_state(fresh.server_state(), state)


def test_saving_an_earlier_round_drops_later_checkpoints_not_the_new_one(tmp_path: Path) -> None:
    """After a resume from an older checkpoint (the newer ones torn), the round just saved is kept and the
    abandoned later rounds go; keep-newest-K by round number used to delete the new file at once."""
    for r in (3, 4):
        save_checkpoint(tmp_path, _ckpt(r), keep=2)
    save_checkpoint(tmp_path, _ckpt(2, value=7.0), keep=2)
    assert [r for r, _ in list_checkpoints(tmp_path)] == [2]
    got = load_latest_checkpoint(tmp_path)
    assert got is not None and got.round == 2 and float(got.global_params[0][0, 0]) == 7.0
