"""A published results page is what its kept run logs generate (issue 29, item 5: every number in the docs traces
to a logged run in the repository): each page's tables are regenerated from its results/run-logs.tar.gz, and the
sha256 the page states is the archive's."""

from __future__ import annotations

import hashlib
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedent.cli import main
from fedent.experiments.reproduce_report import BEGIN, END

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Page:
    profile: str
    rows: str
    runs: int  # run directories in the archive: rows x seeds
    setting: str
    extra: tuple[str, ...] = ()
    folder: str | None = None  # under docs/; None: the profile's name ("": docs/results.md itself)
    seeds: str = "0,1,2"

    @property
    def page(self) -> Path:
        return ROOT / "docs" / (self.profile if self.folder is None else self.folder) / "results.md"

    @property
    def logs(self) -> Path:
        return self.page.parent / "results" / "run-logs.tar.gz"


PAGES = [
    Page("mnist", "fedavg,fedent,fedadam,fedprox,feddyn,fedent-shuffled,fedent-fixed,fedent-cap-none", 24,
         "mnist-pathological", ("--set", "data.root=data/mnist")),
    Page("medium", "fedent,fedavg,fedent-first,fedavg-replay-mean,fedavg-lr5,fedavg-lr10", 18, "pathological"),
    Page("cpu", "fedavg,fedavg-lr2,fedavg-lr5,fedavg-lr10,fedent,fedent-first,fedavg-replay-mean,fedadam,feddyn", 27,
         "pathological", ("--only", "controls"), folder=""),
    Page("cpu", "fedavg,fedprox,fedadam,feddyn,fedcos,fednorm,fedent,fedavg-replay-mean", 40, "pathological",
         ("--only", "main,controls", "--settings", "pathological", "--tuned",
          "pathological=docs/cpu-tuned/results/tuned.json"), folder="cpu-tuned", seeds="0,1,2,3,4"),
]


def _generated(text: str) -> str:
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    # the commit that wrote it, "(uncommitted changes)" included: the rest of that line stays compared
    return re.sub(r"\(report written at .*\)$", "(report written at …)", block, flags=re.M)


def _id(p: Page) -> str:
    return p.profile if p.folder is None else p.folder or "results"


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_the_page_states_its_archives_checksum(page: Page) -> None:
    digest = hashlib.sha256(page.logs.read_bytes()).hexdigest()
    assert digest in page.page.read_text(encoding="utf-8").replace("\n  ", "")


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_the_page_is_what_its_run_logs_generate(tmp_path: Path, page: Page, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # a page's command names files relative to the repository (its tuned.json)
    out, docs = tmp_path / "results" / page.profile, tmp_path / "docs"
    out.mkdir(parents=True)
    docs.mkdir()
    with tarfile.open(page.logs) as tar:
        tar.extractall(out, filter="data")
    assert len(list((out / "runs" / page.setting).iterdir())) == page.runs
    shutil.copyfile(page.page, docs / "results.md")
    rc = main(["reproduce", "--profile", page.profile, "--seeds", page.seeds, "--rows", page.rows, *page.extra,
               "--out", str(out), "--config-dir", str(ROOT / "configs"), "--report-only", "--publish", str(docs)])
    assert rc == 0
    assert _generated((docs / "results.md").read_text(encoding="utf-8")) == _generated(page.page.read_text("utf-8"))
