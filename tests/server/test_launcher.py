"""server.launcher: the run's PKI across resumes, and the progress a resumed launch reports."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from conftest import tiny_config, tiny_inputs
from cryptography import x509

from client.settings import WorkerSettings
from client.worker import Worker
from fedent.runlog import MetricsLog, metrics_record, read_metrics
from server.app import start_aggregator
from server.launcher import Cluster, LaunchSettings
from server.launcher_cli import finished_line, round_line
from server.settings import AggregatorSettings

SETTINGS = AggregatorSettings(register_timeout_s=20.0, round_deadline_s=20.0)


def test_more_workers_on_resume_keep_the_ca_and_the_existing_credentials(tmp_path: Path) -> None:
    """A resumed `cluster up --workers 3` after `--workers 2` used to regenerate the PKI, CA included, so
    every credential of the run changed; only the new identity is issued now."""
    cluster = Cluster(tiny_config(), tmp_path / "run", LaunchSettings(workers=2))
    first = cluster.ensure_pki(["aggregator", "worker-0", "worker-1"])
    ca, token0 = first.ca_cert.read_bytes(), first.token_files["worker-0"].read_bytes()
    srv = first.server_cert.read_bytes()
    second = cluster.ensure_pki(["aggregator", "worker-0", "worker-1", "worker-2"])
    assert second.ca_cert.read_bytes() == ca and second.server_cert.read_bytes() == srv
    assert second.token_files["worker-0"].read_bytes() == token0
    ca_cert = x509.load_pem_x509_certificate(ca)
    new_cert = x509.load_pem_x509_certificate(second.client_certs["worker-2"][0].read_bytes())
    new_cert.verify_directly_issued_by(ca_cert)
    assert "worker-2" in second.tokens_file.read_text()


def _workers(port: int, inputs: Any) -> list[threading.Thread]:
    threads = []
    for group in [(0, 1), (2, 3)]:
        w = Worker(WorkerSettings(aggregator=f"127.0.0.1:{port}", client_ids=group, device="cpu",
                                  connect_timeout_s=10), inputs=inputs)
        threads.append(threading.Thread(target=w.run, daemon=True))
    return threads


def test_a_resumed_launch_reports_the_new_rounds_not_the_cut_ones(tmp_path: Path) -> None:
    """Killed after logging round 2 but before checkpointing it: the resume cuts that line and runs round 2
    again. The launcher used to count metrics.jsonl lines, print the stale round 2 and never the new one."""
    cfg, inputs = tiny_config("fedavg", rounds=3), tiny_inputs()
    run_dir = tmp_path / "run"
    first = start_aggregator(cfg, SETTINGS, run_dir, inputs=inputs)

    def crash(phase: str) -> None:
        if (phase, first.run.engine.round) == ("aggregating", 2):
            raise RuntimeError("killed")

    first.run.engine.on_phase = crash
    for t in _workers(first.port, inputs):
        t.start()
    assert first.wait(60)
    first.stop(grace_s=0.5)
    MetricsLog(run_dir / "metrics.jsonl").append(metrics_record(round=3, algorithm="fedavg", test_acc=0.0123))

    cluster = Cluster(cfg, run_dir, LaunchSettings(workers=2, dashboard=False, secure=False))
    cluster.aggregator = start_aggregator(cfg, SETTINGS, run_dir, inputs=inputs)
    late = _workers(cluster.aggregator.port, inputs)  # after the launcher's first look at the run
    timer = threading.Timer(1.5, lambda: [t.start() for t in late])
    timer.start()
    lines: list[str] = []
    try:
        assert cluster.wait(on_round=lambda rec: lines.append(round_line(rec, 3)))
    finally:
        timer.join()
        cluster.aggregator.stop(grace_s=0.5)
    new = read_metrics(run_dir / "metrics.jsonl")
    assert [r["round"] for r in new] == [1, 2, 3] and new[2]["test_acc"] != 0.0123
    last = [ln for ln in lines if ln.startswith("fedent cluster: round 3/3")]
    assert last == [round_line(new[2], 3)], lines
    assert f"final test accuracy {new[2]['test_acc']:.4f}" in finished_line(cluster.aggregator.run.engine.records,
                                                                            run_dir / "model_final.pt")



def test_children_output_comes_a_whole_line_at_a_time_with_their_name(tmp_path: Path,
                                                                       capsys: Any) -> None:
    """fedent cluster up's children used to write straight to the terminal, splitting and interleaving with its
    own lines; now each line of theirs (stdout and stderr alike) arrives whole, as ``[name] line``, on stderr."""
    import io

    from server.launcher import prefix_lines

    got = io.StringIO()
    prefix_lines(io.BytesIO(b"first\nsecond half-"), "worker-1", got)
    assert got.getvalue() == "[worker-1] first\n[worker-1] second half-\n"

    cluster = Cluster(tiny_config(), tmp_path / "run", LaunchSettings(workers=1, dashboard=False, secure=False))
    code = "import sys; print('to stdout', flush=True); print('to stderr', file=sys.stderr, flush=True)"
    proc = cluster._spawn(["-c", code], name="worker-0")
    assert proc.stdout is not None and proc.stderr is None  # one pipe, read by the copying thread
    assert proc.wait(timeout=60) == 0
    for t in threading.enumerate():
        if t.name == "output-worker-0":
            t.join(10)
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["[worker-0] to stdout", "[worker-0] to stderr"]
    assert captured.out == ""
