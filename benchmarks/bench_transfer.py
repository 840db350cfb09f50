"""Tensor transfer throughput over loopback gRPC, as a ratio to an in-process memory copy.

A real estimator service (``python -m estimator``, a separate process on port 0) stores and serves tensor
lists through the real chunked codec (``fedentrpc.convert``: raw bytes, ≤4 MiB chunks, crc32 checksum by default).
For each size the benchmark times

* ``memcpy``: one in-process copy of the same number of bytes (``Tensor.copy_``), the ceiling;
* ``upload``: ``stream_wire`` into ``PutBlob``, each chunk's message built with one copy and checksummed as
  gRPC sends it (the way a worker uploads its update); the service verifies every chunk's checksum and
  the header's shapes and stores the chunks (it does not build tensors it would not use);
* ``download``: ``FetchBlob`` + ``decode_tensors`` (every chunk's checksum verified), checked equal to the
  original (the way a worker fetches the round's model);
* ``encode``/``decode``: the codec alone in-process (no gRPC), to show how much of the cost is the codec;
* ``raw``: the transport's own ceiling, the same bytes as bare 4 MiB ``bytes`` messages (identity
  serialisers: no protobuf, no checksum, nothing decoded) to and from a bare gRPC server in another
  process, so ``up/raw`` and ``down/raw`` say how much of what gRPC-in-Python can move the codec keeps;

and reports GB/s (10^9 bytes/s) and each as a fraction of memcpy. ``--big-gb`` then streams one synthetic
parameter list larger than 2 GB (protobuf's and gRPC's message limits) up and down and verifies it.

Both processes tune glibc malloc the way ``python -m server|client|estimator`` do
(``fedentrpc/allocator.py``); ``--malloc default`` runs both with glibc's defaults instead, for comparison.

    python benchmarks/bench_transfer.py                       # 1, 16, 256, 1024 MB + a 2.2 GB model
    python benchmarks/bench_transfer.py --sizes-mb 1,16 --big-gb 0 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fedentrpc import allocator, convert, rpc  # noqa: E402
from fedentrpc.options import grpc_options  # noqa: E402
from fedentrpc.v1 import estimator_pb2_grpc as est_grpc  # noqa: E402
from fedentrpc.v1 import tensor_pb2 as tpb  # noqa: E402

GB = 1e9
MB = 2**20
OPTIONS = grpc_options()  # the services' message-size limits


MALLOC_OPT_OUT = {allocator.OPT_OUT: "off"}  # both processes keep glibc's own (dynamic) settings


RAW_SERVICE = "fedent.bench.Raw"


def serve_raw() -> int:
    """The bare gRPC peer for the ``raw`` baseline: Down streams N bytes as 4 MiB messages, Up counts them."""
    from concurrent import futures

    allocator.tune_for_streaming(os.environ)
    piece = bytes(convert.MAX_CHUNK_BYTES)

    def down(req: bytes, ctx: grpc.ServicerContext) -> Any:
        left = int(req)
        while left > 0:
            yield piece if left >= len(piece) else piece[:left]
            left -= len(piece)

    def up(it: Any, ctx: grpc.ServicerContext) -> bytes:
        return str(sum(len(b) for b in it)).encode()

    def ident(b: bytes) -> bytes:
        return b

    server = grpc.server(futures.ThreadPoolExecutor(4), options=OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(RAW_SERVICE, {
        "Down": grpc.unary_stream_rpc_method_handler(down, ident, ident),
        "Up": grpc.stream_unary_rpc_method_handler(up, ident, ident)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"LISTENING port={port}", flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin
    server.stop(0)
    return 0


def spawn(args: list[str], what: str, extra_env: dict[str, str] | None = None,
          stdin: int | None = None) -> tuple[subprocess.Popen[str], int]:
    """Start a Python process that prints ``LISTENING port=N`` once serving; returns it and N."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdin=stdin, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("LISTENING port="):
        proc.kill()
        raise SystemExit(f"bench_transfer: {what} did not start ({line!r})")
    return proc, int(line.split("=", 1)[1])


def start_raw(extra_env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    return spawn([str(Path(__file__).resolve()), "--serve-raw"], "the raw gRPC peer", extra_env, subprocess.PIPE)


def raw_times(ch: grpc.Channel, nbytes: int, repeat: int) -> tuple[float, float]:
    """Best upload and download seconds for ``nbytes`` as bare bytes messages (the transport ceiling)."""
    def ident(b: bytes) -> bytes:
        return b

    down_rpc = ch.unary_stream(f"/{RAW_SERVICE}/Down", request_serializer=ident, response_deserializer=ident)
    up_rpc = ch.stream_unary(f"/{RAW_SERVICE}/Up", request_serializer=ident, response_deserializer=ident)
    piece = bytes(convert.MAX_CHUNK_BYTES)
    pieces = [piece] * (nbytes // len(piece)) + ([piece[: nbytes % len(piece)]] if nbytes % len(piece) else [])

    def down() -> None:
        assert sum(len(b) for b in down_rpc(str(nbytes).encode(), timeout=3600)) == nbytes

    def up() -> None:
        assert int(up_rpc(iter(pieces), timeout=3600)) == nbytes

    return best_of(repeat, up), best_of(repeat, down)


def start_service(extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    return spawn(["-m", "estimator", "--host", "127.0.0.1", "--port", "0", "--insecure", "--blob-cache-mb", "1",
                  "--log-level", "WARNING"], "the estimator service", extra_env)


def peak_rss_gb(pid: int) -> float:
    """VmHWM (peak resident set) of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / GB
    return float("nan")


def make_params(nbytes: int, pieces: int = 4) -> list[torch.Tensor]:
    """A synthetic float32 parameter list of ``nbytes`` in ``pieces`` tensors with a checkable pattern."""
    numel = nbytes // 4
    sizes = [numel // pieces] * (pieces - 1) + [numel - (numel // pieces) * (pieces - 1)]
    return [pattern(i, n) for i, n in enumerate(sizes)]


def pattern(i: int, n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32).mul_(1.0 / 1024).add_(float(i))


def timed(repeat: int, fn: Callable[[], Any]) -> list[float]:
    """Wall seconds of ``repeat`` calls; the first is cold (fresh pages), later ones reuse freed memory."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def best_of(repeat: int, fn: Callable[[], Any]) -> float:
    return min(timed(repeat, fn))


def memcpy_s(nbytes: int, repeat: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(7)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: first touch of the destination pages is not a copy cost
    return best_of(max(repeat, 5), lambda: dst.copy_(src))


def upload(stub: est_grpc.EstimatorStub, params: list[torch.Tensor]) -> str:
    ref = stub.PutBlob(convert.stream_wire({convert.PARAMS_GROUP: params}), timeout=3600)
    return str(ref.blob_id)


def download(stub: est_grpc.EstimatorStub, blob_id: str) -> list[torch.Tensor]:
    bundle = convert.decode_tensors(stub.FetchBlob(tpb.FetchBlobRequest(blob_id=blob_id), timeout=3600))
    return bundle[convert.PARAMS_GROUP]


def bench_size(stub: est_grpc.EstimatorStub, raw: grpc.Channel, size_mb: int, repeat: int) -> dict[str, float]:
    nbytes = size_mb * MB
    params = make_params(nbytes)
    mem = memcpy_s(nbytes, repeat)
    raw_up, raw_down = raw_times(raw, nbytes, repeat)
    ids: list[str] = []
    up = timed(repeat, lambda: ids.append(upload(stub, params)))
    got: list[list[torch.Tensor]] = []
    down = timed(repeat, lambda: (got.clear(), got.append(download(stub, ids[-1]))))  # keep only the last
    assert all(torch.equal(a, b) for a, b in zip(got[-1], params, strict=True)), "download differs"
    got.clear()
    encs: list[convert.EncodedTensors] = []
    enc = best_of(repeat, lambda: encs.append(convert.encode_tensors({convert.PARAMS_GROUP: params})))
    dec = best_of(repeat, lambda: convert.decode_tensors(encs[-1].views()))
    encs.clear()
    return {"size_mb": size_mb, "bytes": nbytes, "memcpy_gbps": nbytes / mem / GB,
            "upload_gbps": nbytes / min(up) / GB, "download_gbps": nbytes / min(down) / GB,
            "upload_median_gbps": nbytes / statistics.median(up) / GB,
            "download_median_gbps": nbytes / statistics.median(down) / GB,
            "upload_first_gbps": nbytes / up[0] / GB, "download_first_gbps": nbytes / down[0] / GB,
            "upload_ratio": mem / min(up), "download_ratio": mem / min(down),
            "raw_upload_gbps": nbytes / raw_up / GB, "raw_download_gbps": nbytes / raw_down / GB,
            "upload_vs_raw": raw_up / min(up), "download_vs_raw": raw_down / min(down),
            "codec_encode_gbps": nbytes / enc / GB, "codec_decode_gbps": nbytes / dec / GB}


def bench_big(stub: est_grpc.EstimatorStub, gb: float, service_pid: int) -> dict[str, Any]:
    """A parameter list over 2 GB, up and down through the codec and the service, verified element-wise.

    The upload streams (chunks cut and checksummed as they are sent, as a worker's update does); the
    download verifies every chunk's checksum, and the result is compared with the generating pattern.
    """
    nbytes = int(gb * GB) // 4 * 4
    pieces = 3  # a few tensors, together > 2 GB
    params = make_params(nbytes, pieces)
    shapes = [t.numel() for t in params]
    t0 = time.perf_counter()
    ref = stub.PutBlob(convert.stream_wire({convert.PARAMS_GROUP: params}), timeout=3600)
    t_up = time.perf_counter() - t0
    del params
    t0 = time.perf_counter()
    asm = convert.TensorAssembler()
    for c in stub.FetchBlob(tpb.FetchBlobRequest(blob_id=ref.blob_id), timeout=3600):
        asm.add(c)
    got = asm.finish()[convert.PARAMS_GROUP]  # raises unless sizes and every chunk's checksum check out
    t_down = time.perf_counter() - t0
    ok = [t.numel() for t in got] == shapes and all(
        torch.equal(t, pattern(i, t.numel())) for i, t in enumerate(got))
    h = asm.header
    assert h is not None
    return {"bytes": nbytes, "gb": nbytes / GB, "tensors": len(shapes), "chunks": int(h.num_chunks),
            "checksum": h.chunk_checksum or h.checksum, "checksum_verified": True, "content_equal": ok,
            "upload_s": t_up, "download_s": t_down, "upload_gbps": nbytes / t_up / GB,
            "download_gbps": nbytes / t_down / GB, "client_peak_rss_gb": peak_rss_gb(os.getpid()),
            "service_peak_rss_gb": peak_rss_gb(service_pid)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", default="1,16,256,1024", help="comma-separated sizes in MiB")
    p.add_argument("--repeat", type=int, default=3, help="best of this many runs per size")
    p.add_argument("--big-gb", type=float, default=2.2, help="size of the >2 GB proof (0 skips it)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--malloc", choices=["tuned", "default"], default="tuned",
                   help="tuned: both processes keep freed chunk buffers (as the services do); default: glibc's")
    p.add_argument("--serve-raw", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_raw:
        return serve_raw()
    extra_env = MALLOC_OPT_OUT if args.malloc == "default" else {}
    malloc = allocator.tune_for_streaming({**os.environ, **extra_env})
    try:
        sizes = [int(s) for s in args.sizes_mb.split(",") if s.strip()]
    except ValueError:
        print(f"bench_transfer: bad --sizes-mb {args.sizes_mb!r}", file=sys.stderr)
        return 2
    proc, port = start_service(extra_env)
    raw_proc, raw_port = start_raw(extra_env)
    results: dict[str, Any] = {"torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(), "malloc": malloc,
                               "checksum": convert.TransferSpec().checksum, "sizes": []}
    print(f"{malloc}; checksum {results['checksum']}")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS) as ch, \
                grpc.insecure_channel(f"127.0.0.1:{raw_port}", options=OPTIONS) as raw:
            stub = rpc.estimator_stub(ch)  # the stub workers use: pre-serialised uploads, zero-copy reads
            print(f"GB/s: best of {args.repeat} (median, first/cold run); ratios use the best")
            print(f"{'size':>8} {'memcpy':>7} {'upload':>21} {'download':>21} {'raw up':>7} {'raw down':>8} "
                  f"{'up/raw':>7} {'down/raw':>8} {'up/mem':>7} {'down/mem':>8} {'encode':>7} {'decode':>7}")
            for s in sizes:
                r = bench_size(stub, raw, s, args.repeat)
                results["sizes"].append(r)
                up = f"{r['upload_gbps']:.2f} ({r['upload_median_gbps']:.2f}, {r['upload_first_gbps']:.2f})"
                down = f"{r['download_gbps']:.2f} ({r['download_median_gbps']:.2f}, {r['download_first_gbps']:.2f})"
                print(f"{s:>6}MB {r['memcpy_gbps']:>7.2f} {up:>21} {down:>21} {r['raw_upload_gbps']:>7.2f} "
                      f"{r['raw_download_gbps']:>8.2f} {r['upload_vs_raw']:>7.2f} {r['download_vs_raw']:>8.2f} "
                      f"{r['upload_ratio']:>7.3f} {r['download_ratio']:>8.3f} {r['codec_encode_gbps']:>7.2f} "
                      f"{r['codec_decode_gbps']:>7.2f}", flush=True)
            if args.big_gb > 0:
                big = bench_big(stub, args.big_gb, proc.pid)
                results["big"] = big
                print(f"big: {big['gb']:.2f} GB in {big['tensors']} tensors / {big['chunks']} chunks "
                      f"({big['checksum']} per chunk): up {big['upload_gbps']:.3f} GB/s ({big['upload_s']:.1f} s), "
                      f"down {big['download_gbps']:.3f} GB/s ({big['download_s']:.1f} s); every chunk verified, "
                      f"content equal={big['content_equal']}; peak RSS client {big['client_peak_rss_gb']:.1f} GB, "
                      f"service {big['service_peak_rss_gb']:.1f} GB", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
        raw_proc.communicate(timeout=30)  # closes its stdin: it stops
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if results.get("big", {}).get("content_equal", True) else 1


if __name__ == "__main__":
    sys.exit(main())
