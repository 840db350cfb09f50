"""Datasets, non-IID partitions and the label-distribution heatmap (docs/data.md)."""

from fedent.data.datasets import (
    DATASETS,
    DatasetError,
    DatasetFormatError,
    DatasetNotFoundError,
    FedDataset,
    load_dataset,
)
from fedent.data.partition import Partition, make_partition

__all__ = [
    "DATASETS",
    "DatasetError",
    "DatasetFormatError",
    "DatasetNotFoundError",
    "FedDataset",
    "Partition",
    "load_dataset",
    "make_partition",
]
