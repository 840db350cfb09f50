"""``fedent partition``: split a dataset's train labels over clients, write the JSON and an optional heatmap.

The JSON is the same ``partition.json`` the simulator writes into a run directory, so a split can be
inspected (and its md5 compared) before a run. ``--write-clients DIR`` also writes each client's samples as
the per-client files a worker reads with ``--data DIR`` (``data.placement: workers``), in the simulator's
order, so a cluster on those files reproduces the simulation. Errors are one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fedent import yamlio
from fedent.config import ConfigError, DataConfig, dataclass_from_mapping

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

    from fedent.data.datasets import FedDataset

HELP = "split a dataset over clients (iid, pathological, dirichlet) and write partition JSON + heatmap"

# CLI flag (argparse dest) -> DataConfig field; a flag given on the command line beats the --config file.
_FLAG_TO_FIELD = {
    "dataset": "name",
    "data_root": "root",
    "download": "download",
    "scheme": "partition",
    "alpha": "alpha",
    "flavour": "dirichlet_flavour",
    "clients": "num_clients",
    "min_samples": "min_samples",
    "shards_per_client": "shards_per_client",
    "max_train_samples": "max_train_samples",
    "synthetic_train": "synthetic_train",
}


def add_parser(subparsers: Any) -> None:
    from fedent.data.datasets import DATASETS  # torch: only when this command is chosen
    from fedent.data.partition import FLAVOURS, SCHEMES

    p = subparsers.add_parser(
        "partition",
        help=HELP,
        description="Split a dataset's train set over clients; writes label counts per client and an md5.",
    )
    p.add_argument("--config", help="YAML experiment config; its data section gives the defaults")
    p.add_argument("--dataset", choices=DATASETS, default=None, help="dataset name (default fashion-mnist)")
    p.add_argument("--scheme", choices=SCHEMES, default=None, help="partition scheme (default pathological)")
    p.add_argument("--alpha", type=float, default=None, help="Dirichlet concentration alpha_d (default 0.5)")
    p.add_argument("--flavour", choices=FLAVOURS, default=None, help="Dirichlet flavour (default client)")
    p.add_argument("--clients", type=int, default=None, help="number of clients N (default 100)")
    p.add_argument("--seed", type=int, default=None, help="partition seed (default: train.seed of --config, else 0)")
    p.add_argument("--data-root", default=None, help="directory holding the dataset (searched first)")
    p.add_argument("--download", action="store_true", default=None, help="allow torchvision to download it")
    p.add_argument("--min-samples", type=int, default=None, help="minimum samples per client (Dirichlet)")
    p.add_argument("--shards-per-client", type=int, default=None, help="shards per client (pathological)")
    p.add_argument("--max-train-samples", type=int, default=None, help="seeded subsample of the train set first")
    p.add_argument("--synthetic-train", type=int, default=None, help="train size of the synthetic dataset")
    p.add_argument("--out", required=True, help="where to write the partition JSON")
    p.add_argument("--heatmap", default=None, help="also write the clients x classes label heatmap here")
    p.add_argument("--formats", default="png", metavar="png,pdf,svg",
                   help="the heatmap's file formats, comma-separated: one file per format (default: png)")
    p.add_argument("--dpi", type=int, default=300, help="the heatmap's raster resolution (default: 300)")
    p.add_argument("--write-clients", metavar="DIR", default=None,
                   help="also write DIR/client-<cid>/train.npz + test.npz, the files a worker reads with --data DIR")


def _config_data(path: str) -> tuple[dict[str, Any], int | None]:
    """The data section and train.seed of a YAML config file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        raw = yamlio.load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: the top level must be a mapping")
    data = raw.get("data") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: data: expected a mapping")
    seed = (raw.get("train") or {}).get("seed") if isinstance(raw.get("train"), dict) else None
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ConfigError(f"{p}: train.seed: expected an integer, got {seed!r}")
    return dict(data), seed


def resolve(args: argparse.Namespace) -> tuple[DataConfig, int]:
    """DataConfig and seed from --config (if any) overridden by the flags given explicitly."""
    data: dict[str, Any] = {}
    seed: int | None = None
    if args.config:
        data, seed = _config_data(args.config)
    for flag, fname in _FLAG_TO_FIELD.items():
        value = getattr(args, flag, None)
        if value is not None:
            data[fname] = value
    cfg: DataConfig = dataclass_from_mapping(DataConfig, data, "data")
    cfg.validate()
    return cfg, int(args.seed if args.seed is not None else (seed or 0))


def _dumps_one_key_per_line(obj: dict[str, Any]) -> str:
    """Valid JSON with one top-level key per line: readable, yet a 100 x 10 count matrix stays one line."""
    body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in obj.items())
    return "{\n" + body + "\n}\n"


def _write_json_atomic(path: Path, obj: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(_dumps_one_key_per_line(obj))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def refuse_taken(out: Path) -> None:
    """ConfigError if ``out`` already holds client folders (checked before anything is loaded or written)."""
    taken = sorted(p.name for p in out.glob("client-*")) if out.is_dir() else []
    if taken:
        raise ConfigError(f"--write-clients: {out} already holds {', '.join(taken[:3])}"
                          f"{', ...' if len(taken) > 3 else ''}; choose a new or empty folder")


def write_clients(out: Path, ds: FedDataset, client_indices: Sequence[np.ndarray], seed: int) -> int:
    """Every client's files under ``out`` (``fedent.data.local.export_partition``), written into a scratch
    folder first and moved in client by client, so a failure leaves no half-written client behind. Refuses a
    folder that already holds client folders: nothing is overwritten."""
    from fedent.data.local import export_partition

    refuse_taken(out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".partial-", dir=out))
    try:
        files = export_partition(ds.x_train, ds.y_train, ds.x_test, ds.y_test, client_indices, seed, scratch)
        for d in sorted(scratch.iterdir()):
            os.replace(d, out / d.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return len(files)


def run(args: argparse.Namespace) -> int:
    from fedent.data.datasets import DatasetError, load_dataset
    from fedent.data.partition import PartitionError, make_partition

    try:
        cfg, seed = resolve(args)
        if args.write_clients:
            refuse_taken(Path(args.write_clients))
        ds = load_dataset(cfg, seed=seed)
        labels = ds.y_train.numpy()
        part = make_partition(labels, cfg, seed, num_classes=ds.num_classes)
        doc = part.to_json(labels)
        doc = {
            "dataset": ds.name,
            "source": ds.source,
            "num_samples": int(labels.size),
            **doc,
            "data_config": dataclasses.asdict(cfg),
        }
        out = Path(args.out)
        _write_json_atomic(out, doc)
        if args.heatmap:
            from fedent.data.heatmap import plot_label_heatmap  # matplotlib only when asked for

            title = f"{ds.name} {part.scheme}" + (
                f" (alpha={cfg.alpha}, {cfg.dirichlet_flavour})" if part.scheme == "dirichlet" else ""
            )
            fmts = tuple(dict.fromkeys(f.strip().lower().lstrip(".") for f in args.formats.split(",") if f.strip()))
            try:
                heatmaps = plot_label_heatmap(part.label_counts(labels), Path(args.heatmap), title=title,
                                              formats=fmts, dpi=args.dpi)
            except ValueError as e:
                raise ConfigError(f"--formats/--dpi: {e}") from None
            args.heatmap = ", ".join(str(h) for h in heatmaps)
        written = write_clients(Path(args.write_clients), ds, part.client_indices, seed) if args.write_clients else 0
    except (DatasetError, PartitionError, ConfigError, OSError) as e:
        msg = " ".join(str(e).split())
        print(f"fedent partition: error: {msg}", file=sys.stderr)
        return 2
    sizes = part.sizes()
    counts = part.label_counts(labels)
    classes_per_client = (counts > 0).sum(axis=1)
    desc = part.scheme + (f"(alpha={cfg.alpha}, flavour={cfg.dirichlet_flavour})" if part.scheme == "dirichlet" else "")
    print(
        f"partition {desc} of {ds.name} ({ds.source}), seed {seed}: {part.num_clients} clients, "
        f"sizes {min(sizes)}..{max(sizes)}, classes/client {classes_per_client.min()}..{classes_per_client.max()}, "
        f"{sum(sizes)}/{labels.size} samples used, md5 {part.md5()} -> {out}"
        + (f" + {args.heatmap}" if args.heatmap else "")
        + (f" + {written} client files under {args.write_clients}" if args.write_clients else "")
    )
    return 0
