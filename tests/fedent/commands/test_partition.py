"""``fedent partition`` end to end: subprocesses of the real CLI for every scheme, and its one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from datafiles import write_mnist_like

from fedent.cli import main

SCHEMES = {
    "iid": ["--scheme", "iid"],
    "pathological": ["--scheme", "pathological", "--shards-per-client", "2"],
    "dirichlet-client": ["--scheme", "dirichlet", "--alpha", "0.5", "--flavour", "client"],
    "dirichlet-class": ["--scheme", "dirichlet", "--alpha", "0.5", "--flavour", "class", "--min-samples", "5"],
}
HEATMAP_SCHEME = "dirichlet-client"  # drawing costs ~0.5 s, so only one scheme per dataset draws
FASHION = Path("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz")


def _env() -> dict[str, str]:
    """One thread per child: the CI box has two cores and torch would otherwise oversubscribe them."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _run_all_schemes(tmp_path: Path, dataset_args: list[str], clients: int) -> dict[str, tuple[int, str, str]]:
    """Every scheme through ``fedent.cli.main`` in ONE fresh interpreter (importing torch costs seconds).

    The child prints one JSON line per scheme with the return code and what the CLI wrote to stdout/stderr.
    """
    argvs = {
        name: ["partition", *dataset_args, *args, "--clients", str(clients), "--seed", "0",
               "--out", str(tmp_path / f"{name}.json")]
        + (["--heatmap", str(tmp_path / f"{name}.png")] if name == HEATMAP_SCHEME else [])
        for name, args in SCHEMES.items()
    }
    driver = (
        "import contextlib, io, json, sys\n"
        "from fedent.cli import main\n"
        "for name, argv in json.loads(sys.argv[1]).items():\n"
        "    out, err = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "        rc = main(argv)\n"
        "    print(json.dumps([name, rc, out.getvalue(), err.getvalue()]))\n"
    )
    res = subprocess.run([sys.executable, "-c", driver, json.dumps(argvs)], capture_output=True, text=True,
                         timeout=300, env=_env())
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    return {name: (rc, out, err) for name, rc, out, err in rows}


def _check_outputs(tmp_path: Path, results: dict[str, tuple[int, str, str]], clients: int, total: int) -> None:
    assert set(results) == set(SCHEMES)
    for name, (rc, stdout, stderr) in results.items():
        assert rc == 0, f"{name}: {stderr}"
        assert len(stdout.strip().splitlines()) == 1 and "md5" in stdout
        doc = json.loads((tmp_path / f"{name}.json").read_text())
        assert doc["num_clients"] == clients and len(doc["sizes"]) == clients
        counts = np.array(doc["label_counts"])
        assert counts.shape == (clients, doc["num_classes"])
        assert counts.sum(axis=1).tolist() == doc["sizes"]
        assert counts.sum() == total, name  # every scheme uses all samples for these sizes
        assert doc["md5"] in stdout
        assert (tmp_path / f"{name}.png").is_file() == (name == HEATMAP_SCHEME)
    assert (tmp_path / f"{HEATMAP_SCHEME}.png").read_bytes()[:4] == b"\x89PNG"
    patho = np.array(json.loads((tmp_path / "pathological.json").read_text())["label_counts"])
    assert ((patho > 0).sum(axis=1) <= 2).all()


def test_real_entry_point(tmp_path: Path) -> None:
    """``python -m fedent.cli partition`` itself: exit 0, one summary line, the JSON and the PNG."""
    out = tmp_path / "p.json"
    res = subprocess.run(
        [sys.executable, "-m", "fedent.cli", "partition", "--dataset", "synthetic", "--synthetic-train", "400",
         "--scheme", "dirichlet", "--alpha", "0.1", "--clients", "8", "--out", str(out), "--heatmap",
         str(tmp_path / "p.png")],
        capture_output=True, text=True, timeout=120, env=_env(),
    )
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.strip().splitlines()) == 1 and res.stdout.startswith("partition dirichlet(alpha=0.1")
    assert json.loads(out.read_text())["md5"] in res.stdout
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_all_schemes_on_synthetic(tmp_path: Path) -> None:
    results = _run_all_schemes(tmp_path, ["--dataset", "synthetic", "--synthetic-train", "600"], clients=10)
    _check_outputs(tmp_path, results, clients=10, total=600)


@pytest.mark.skipif(not FASHION.is_file(), reason="dataset-fashion-mnist is not installed")
def test_all_schemes_on_system_fashion_mnist(tmp_path: Path) -> None:
    results = _run_all_schemes(tmp_path, ["--dataset", "fashion-mnist"], clients=100)
    _check_outputs(tmp_path, results, clients=100, total=60_000)
    doc = json.loads((tmp_path / "pathological.json").read_text())
    assert doc["source"].startswith("system:") and doc["sizes"] == [600] * 100


def test_same_seed_same_md5_different_seed_differs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["partition", "--dataset", "synthetic", "--synthetic-train", "300", "--clients", "5"]
    base += ["--scheme", "dirichlet"]
    md5s = []
    for i, seed in enumerate(["1", "1", "2"]):
        out = tmp_path / f"{i}.json"
        assert main([*base, "--seed", seed, "--out", str(out)]) == 0
        md5s.append(json.loads(out.read_text())["md5"])
    assert md5s[0] == md5s[1] != md5s[2]


def test_config_file_gives_defaults_and_flags_win(tmp_path: Path) -> None:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(
        "data:\n  name: synthetic\n  synthetic_train: 400\n  num_clients: 8\n  partition: dirichlet\n"
        "  alpha: 0.2\n  dirichlet_flavour: class\ntrain:\n  seed: 7\n"
    )
    out = tmp_path / "p.json"
    assert main(["partition", "--config", str(cfg), "--clients", "4", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["num_clients"] == 4 and doc["seed"] == 7 and doc["num_samples"] == 400
    assert doc["params"]["alpha"] == 0.2 and doc["params"]["flavour"] == "class"


def test_data_root_flat_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_mnist_like(tmp_path / "d", n_train=200)
    out = tmp_path / "p.json"
    rc = main(["partition", "--dataset", "mnist", "--data-root", str(tmp_path / "d"), "--clients", "4",
               "--scheme", "iid", "--out", str(out)])
    assert rc == 0
    assert json.loads(out.read_text())["source"] == f"root:{tmp_path / 'd'}"


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    return lines[0]


def test_missing_dataset_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import fedent.data.datasets as datasets

    monkeypatch.setattr(datasets, "DEFAULT_SYSTEM_DIRS", (tmp_path / "sys",))
    out = str(tmp_path / "p.json")
    rc = main(["partition", "--dataset", "fashion-mnist", "--data-root", str(tmp_path), "--out", out])
    assert rc == 2
    line = _error_line(capsys)
    assert line.startswith("fedent partition: error: dataset 'fashion-mnist' not found")
    assert "--data-root" in line and "OS package" in line and "data.download: true" in line
    assert not (tmp_path / "p.json").exists()


def test_missing_dataset_subprocess_exit_2(tmp_path: Path) -> None:
    """The real entry point: one line on stderr, exit code 2 (CIFAR-100 is not packaged by any OS here)."""
    if Path("/usr/share/datasets/cifar100").exists():
        pytest.skip("a system copy of cifar100 exists")
    res = subprocess.run(
        [sys.executable, "-m", "fedent.cli", "partition", "--dataset", "cifar100", "--data-root", str(tmp_path),
         "--out", str(tmp_path / "p.json")],
        capture_output=True, text=True, timeout=120, env=_env(),
    )
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "not found" in res.stderr
    assert res.stdout == ""


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--clients", "5000"], "300 samples cannot be split over 5000 clients"),
        (["--clients", "100", "--min-samples", "10"], "cannot give 100 clients 10 samples each"),
        (["--clients", "0"], "data.num_clients"),
        (["--alpha", "-1"], "data.alpha"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], match: str
) -> None:
    args = ["partition", "--dataset", "synthetic", "--synthetic-train", "300", "--scheme", "dirichlet", *extra,
            "--out", str(tmp_path / "p.json")]
    assert main(args) == 2
    assert match in _error_line(capsys)


def test_bad_config_file_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("data:\n  nmae: mnist\n")
    assert main(["partition", "--config", str(cfg), "--out", str(tmp_path / "p.json")]) == 2
    assert "unknown key(s) nmae" in _error_line(capsys)


def test_unwritable_output_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("x")
    args = ["partition", "--dataset", "synthetic", "--synthetic-train", "100", "--clients", "2",
            "--out", str(tmp_path / "afile" / "p.json")]
    assert main(args) == 2
    assert "afile" in _error_line(capsys)


WORKER_CONFIG = """\
data: {name: synthetic, num_clients: 4, partition: dirichlet, dirichlet_flavour: class, alpha: 0.5, min_samples: 10,
       synthetic_train: 160, synthetic_test: 60}
model: {name: mnist-cnn}
train: {rounds: 1, batch_size: 20, lr: 0.05, seed: 7, device: cpu}
algorithm: {name: fedavg}
"""


def test_write_clients_gives_the_simulators_samples_as_worker_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedent.config import load_config
    from fedent.data.local import LocalDataSpec, read_local
    from fedent.inputs import load_inputs
    from fedent.rounds.evaluation import test_shards

    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(WORKER_CONFIG)
    out = tmp_path / "clients"
    assert main(["partition", "--config", str(cfg_path), "--out", str(tmp_path / "p.json"),
                 "--write-clients", str(out)]) == 0
    assert "8 client files under" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == [f"client-{k}" for k in range(4)]  # no scratch left
    inputs = load_inputs(load_config(cfg_path))
    d = inputs.data
    shards = test_shards(int(d.y_test.shape[0]), 4, 7)
    raw = read_local(LocalDataSpec.parse(str(out)), range(4))  # what a worker given --data DIR reads
    for k, ix in enumerate(inputs.client_indices):
        with np.load(out / f"client-{k}" / "train.npz") as f:
            assert np.array_equal(f["x"], d.x_train.numpy()[ix]) and np.array_equal(f["y"], d.y_train.numpy()[ix])
        with np.load(out / f"client-{k}" / "test.npz") as f:
            assert np.array_equal(f["y"], d.y_test.numpy()[shards[k]])
        assert len(raw.clients[k].train.y) == len(ix)


def test_write_clients_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(WORKER_CONFIG)
    out = tmp_path / "clients"
    (out / "client-2").mkdir(parents=True)
    (out / "client-2" / "train.npz").write_bytes(b"theirs")
    code = main(["partition", "--config", str(cfg_path), "--out", str(tmp_path / "p.json"),
                 "--write-clients", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "already holds client-2" in err and len(err.strip().splitlines()) == 1
    assert (out / "client-2" / "train.npz").read_bytes() == b"theirs"
    assert not (tmp_path / "p.json").exists()  # refused before anything was written
