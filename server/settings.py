"""Validated settings at the aggregator's process edge: declared like the config (``fedent.config.Declared``).

Each field is an ``option(default, doc, ge=..., ...)`` with its type (``Literal`` for choices); building the
object checks them all and raises one ``SettingsError`` naming every bad setting. Unknown keys are errors.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from fedent.config import Declared, SettingsError, option
from fedentrpc.codec import MAX_CHUNK_BYTES, TransferSpec
from fedentrpc.stream_limit import (
    StreamLimits,
    anonymous_streams_option,
    limits_of,
    open_stream_max_option,
    stream_idle_option,
)

__all__ = ["AggregatorSettings", "SettingsError"]

WireDtypeName = Literal["native", "float16", "bfloat16"]  # fedentrpc.codec.WIRE_DTYPES (a test checks they agree)
CompressionName = Literal["none", "zlib"]  # fedentrpc.codec.COMPRESSIONS
DownloadEncodingName = Literal["full", "delta"]  # fedentrpc.model_delta.DOWNLOAD_ENCODINGS


@dataclass(frozen=True)
class AggregatorSettings(Declared):
    """How the aggregator runs (the experiment itself is the ExperimentConfig)."""

    error_type = SettingsError

    host: str = option("127.0.0.1", "interface to bind")
    port: int = option(0, "port to bind; 0 picks a free port (tests, the launcher)", ge=0, le=65535)
    token: str = option("", "registration token hook; empty = no check")
    round_deadline_s: float = option(600.0, "a round's results after this are ignored (stragglers)", gt=0)
    quorum: float = option(0.5, "fraction of the round's participants that must report for the round to count",
                           ge=0, le=1)
    register_timeout_s: float = option(300.0, "how long to wait until every client is hosted by a ready worker",
                                       gt=0)
    heartbeat_s: float = option(10.0, "seconds between worker heartbeats", gt=0)
    heartbeat_misses: int = option(3, "a worker silent this many heartbeat periods is dead (clients down); "
                                      "0 = never", ge=0)
    round_retries: int = option(-1, "quorum missed: -1 skips the round (model kept); N >= 0 retries it with fresh "
                                    "clients N times, then fails the run", ge=-1)
    wire_dtype: WireDtypeName = option("native", "how uploads encode floating tensors")
    compression: CompressionName = option("none", "how uploads are compressed")
    chunk_bytes: int = option(MAX_CHUNK_BYTES, "upload chunk size in bytes", ge=1, le=MAX_CHUNK_BYTES)
    download_encoding: DownloadEncodingName = option(
        "full", "full: every model download is the whole model (in the wire dtype); delta: a worker that holds a "
                "model of the last delta_history rounds gets the new one as the XOR of their bit patterns in the "
                "wire dtype, byte planes, zlib-compressed (exact: bit-identical to the full download; "
                "fedentrpc.model_delta), or the whole model when that is not smaller")
    delta_history: int = option(1, "download_encoding delta: rounds whose models the aggregator keeps as bases "
                                   "(each costs a model's memory per blob); a worker holding an older model, or "
                                   "none, gets the whole model", ge=1, le=16)
    estimator: str = option("", "HOST:PORT of the estimator service; empty = in-process fallback")
    max_workers: int = option(128, "gRPC thread pool; every connected worker's Work stream holds one thread", ge=8)
    max_streams_per_identity: int = option(16, ("open streaming calls (Work, uploads, health Watch...) one worker "
                                                 "identity may hold at once, callers without credentials sharing "
                                                 "one such budget; more get RESOURCE_EXHAUSTED. Only with worker "
                                                 "authentication; 0 = no limit"), ge=0)
    max_anonymous_streams: int = anonymous_streams_option()
    stream_idle_s: float = stream_idle_option()
    open_stream_max_s: float = open_stream_max_option()
    stop_workers_when_done: bool = option(True, "send the workers Shutdown when the run ends")
    checkpoint_keep: int = option(2, "checkpoints kept in runs/<id>/checkpoint/ (resume); 0 = no checkpoints", ge=0)
    clients_file: str = option("", "client map {worker identity: client ids} (YAML/JSON): only the mapped identity "
                                   "may host a client (needs worker authentication); empty = the first identity "
                                   "to register a client hosts it while it is live")

    def checks(self) -> Iterable[tuple[str, str]]:
        try:  # the declarations above mirror TransferSpec's; this catches the two drifting apart
            self.transfer()
        except ValueError as e:
            yield "transfer", str(e)

    def transfer(self) -> TransferSpec:
        return TransferSpec(wire_dtype=self.wire_dtype, compression=self.compression, chunk_bytes=self.chunk_bytes)

    def stream_limits(self) -> StreamLimits:
        """The limits :func:`fedentrpc.serving.create_server` enforces (docs/security.md, "Resource limits")."""
        return limits_of(self)
