"""provenance.json: commit (or 'unknown' with a reason), host, CPUs, versions; and its report line."""

import os
import subprocess
import time

from fedent import provenance


def test_collect_in_checkout_records_head():
    p = provenance.collect()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=os.path.dirname(provenance.__file__),
                          capture_output=True, text=True).stdout.strip()
    assert p["commit"] == head and len(head) == 40
    assert p["cpu_count"] == os.cpu_count() and p["python"].count(".") == 2
    assert p["torch"] and p["gpu"] and "cuda" in p


def test_each_process_records_when_it_started_and_a_resume_keeps_every_start():
    """A resumed run's status.json holds the last process's start only: the provenance keeps each one's, so a
    row's first rounds can be shown to have begun after the tuning that chose its values ended."""
    before = time.time()
    first = provenance.collect()
    second = provenance.collect()
    assert before <= first["started_at"] <= second["started_at"] <= time.time()
    got = provenance.resumed(first, second, kept=5)
    assert got["started_at"] == second["started_at"] and got["earlier"][0]["started_at"] == first["started_at"]
    assert provenance.describe(got) == provenance.describe(second)  # a start time alone is no other process


def test_outside_a_repo_unknown_with_reason(tmp_path):
    g = provenance.git_commit(tmp_path)
    assert g["commit"] == "unknown" and "not a git checkout" in g["reason"]
    line = provenance.describe({**g, "hostname": "h", "machine": "x86_64", "cpu_count": 2, "gpu": "none",
                                "python": "3.12.1", "torch": "2.1", "cuda": "12.1"})
    assert line.startswith("commit unknown (not a git checkout") and "2 CPUs" in line and "CUDA 12.1" in line
    assert provenance.describe(None).startswith("not recorded")


def test_a_copy_without_git_records_the_commit_its_maker_gave(tmp_path, monkeypatch):
    monkeypatch.setenv(provenance.COMMIT_ENV, "0123456789abcdef0123456789abcdef01234567")
    g = provenance.git_commit(tmp_path)
    assert g["commit"] == "0123456789abcdef0123456789abcdef01234567" and "not a git checkout" in g["source"]
    monkeypatch.setenv(provenance.COMMIT_ENV, "  ")
    assert provenance.git_commit(tmp_path)["commit"] == "unknown"


def test_a_checkout_ignores_the_variable(monkeypatch):
    monkeypatch.setenv(provenance.COMMIT_ENV, "not-this")
    assert provenance.git_commit()["commit"] != "not-this"


def test_a_dirty_copy_with_a_stale_git_records_the_declared_commit_beside_gits(tmp_path, monkeypatch):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f.py").write_text("a = 1\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "-C", str(tmp_path), "add", "f.py"], check=True, env=env)
    subprocess.run(["git", "-C", str(tmp_path), "commit", "-qm", "x"], check=True, env=env)
    monkeypatch.setenv(provenance.COMMIT_ENV, "feedbeef")
    clean = provenance.git_commit(tmp_path)
    assert clean["dirty"] is False and "declared_commit" not in clean  # a clean checkout is what it says
    (tmp_path / "f.py").write_text("a = 2\n")
    dirty = provenance.git_commit(tmp_path)
    assert dirty["dirty"] is True and dirty["declared_commit"] == "feedbeef" and dirty["commit"] != "feedbeef"
    line = provenance.describe({**dirty, "hostname": "h", "machine": "x", "cpu_count": 1, "gpu": "g",
                                "python": "3", "torch": "2", "cuda": "13"})
    assert "with uncommitted changes; declared by its maker: feedbeef" in line


def _prov(commit: str, gpu: str = "none") -> dict:
    return {"commit": commit, "dirty": False, "hostname": "h", "machine": "x86_64", "cpu_count": 2, "gpu": gpu,
            "python": "3.11.7", "torch": "2.14.1", "cuda": "13.0"}


def test_a_resumed_runs_provenance_says_which_rounds_each_process_trained():
    first = _prov("a" * 40)
    second = provenance.resumed(first, _prov("b" * 40, gpu="NVIDIA H100"), kept=10)  # killed after round 10
    assert second == {**_prov("b" * 40, gpu="NVIDIA H100"), "from_round": 11,
                      "earlier": [{**first, "rounds": [1, 10]}]}
    third = provenance.resumed(second, _prov("c" * 40), kept=30)
    assert third["commit"] == "c" * 40 and third["from_round"] == 31
    assert third["earlier"] == [{**first, "rounds": [1, 10]},
                                {**_prov("b" * 40, gpu="NVIDIA H100"), "rounds": [11, 30]}]
    # a saved record whose own rounds start after the kept one (the engine never writes one) adds no entry
    assert provenance.resumed(second, _prov("d" * 40), kept=10)["earlier"] == [{**first, "rounds": [1, 10]}]
    line = provenance.describe(third)
    assert line == (f"rounds 1–10: {provenance.describe(first)} | rounds 11–30: commit {'b' * 40}; host h (x86_64, "
                    f"2 CPUs); GPU NVIDIA H100; python 3.11.7, torch 2.14.1, CUDA 13.0 | rounds 31 on: "
                    f"{provenance.describe(_prov('c' * 40))}")


def test_a_run_resumed_on_the_same_commit_and_machine_reads_as_one():
    same = provenance.resumed(provenance.resumed(_prov("a" * 40), _prov("a" * 40), kept=3), _prov("a" * 40), kept=7)
    assert [e["rounds"] for e in same["earlier"]] == [[1, 3], [4, 7]]  # the file keeps every process
    assert provenance.describe(same) == provenance.describe(_prov("a" * 40))
    mixed = provenance.resumed(provenance.resumed(_prov("a" * 40), _prov("a" * 40), kept=3), _prov("b" * 40), kept=7)
    assert provenance.describe(mixed).startswith("rounds 1–7: commit " + "a" * 40)  # neighbours merged
    assert " | rounds 8 on: commit " + "b" * 40 in provenance.describe(mixed)


def test_a_checkpoint_without_provenance_gives_an_unknown_earlier_entry_with_its_reason():
    got = provenance.resumed(None, _prov("e" * 40), kept=4)
    (entry,) = got["earlier"]
    assert entry["rounds"] == [1, 4] and entry["commit"] == "unknown" and "predates" in entry["reason"]
    assert provenance.describe(got) == ("rounds 1–4: commit unknown (its checkpoint predates provenance in "
                                        "checkpoints) | rounds 5 on: " + provenance.describe(_prov("e" * 40)))
    # with the provenance.json the last process left: that process stands for the rounds, with a note
    old = provenance.resumed(None, _prov("e" * 40), kept=4, fallback=_prov("f" * 40))
    (entry,) = old["earlier"]
    assert {k: v for k, v in entry.items() if k not in ("note", "rounds")} == _prov("f" * 40)
    assert entry["rounds"] == [1, 4] and "not recorded" in entry["note"]
    # a provenance.json that itself holds a history is not taken for one process
    assert provenance.resumed(None, _prov("e" * 40), kept=4, fallback=got)["earlier"][0]["commit"] == "unknown"
