"""A published results page is what its kept run logs generate (issue 29, item 5: every number in the docs traces
to a logged run in the repository): docs/mnist's tables are regenerated from results/run-logs.tar.gz, and the
sha256 the page states is the archive's."""

from __future__ import annotations

import hashlib
import re
import shutil
import tarfile
from pathlib import Path

from fedent.cli import main
from fedent.experiments.reproduce_report import BEGIN, END

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "mnist" / "results.md"
LOGS = ROOT / "docs" / "mnist" / "results" / "run-logs.tar.gz"
ROWS = "fedavg,fedent,fedadam,fedprox,feddyn,fedent-shuffled,fedent-fixed,fedent-cap-none"


def _generated(text: str) -> str:
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    # the commit that wrote it, "(uncommitted changes)" included: the rest of that line stays compared
    return re.sub(r"\(report written at .*\)$", "(report written at …)", block, flags=re.M)


def test_the_page_states_its_archives_checksum() -> None:
    digest = hashlib.sha256(LOGS.read_bytes()).hexdigest()
    assert digest in PAGE.read_text(encoding="utf-8").replace("\n  ", "")


def test_the_mnist_page_is_what_its_run_logs_generate(tmp_path: Path) -> None:
    out, docs = tmp_path / "results" / "mnist", tmp_path / "docs"
    out.mkdir(parents=True)
    docs.mkdir()
    with tarfile.open(LOGS) as tar:
        tar.extractall(out, filter="data")
    assert len(list((out / "runs" / "mnist-pathological").iterdir())) == 24  # 8 rows x 3 seeds
    shutil.copyfile(PAGE, docs / "results.md")
    rc = main(["reproduce", "--profile", "mnist", "--seeds", "0,1,2", "--rows", ROWS, "--set", "data.root=data/mnist",
               "--out", str(out), "--config-dir", str(ROOT / "configs"), "--report-only", "--publish", str(docs)])
    assert rc == 0
    assert _generated((docs / "results.md").read_text(encoding="utf-8")) == _generated(PAGE.read_text(encoding="utf-8"))
