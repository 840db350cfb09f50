"""Tensor transfer over loopback gRPC: the codec on the generated stubs against bare gRPC, in one run.

Each path runs against its own peer process (``--serve PATH``, port 0) and the same client process, with
the paths interleaved round by round so that load on a shared box hits them alike. For each size and
direction it reports GB/s (10^9 bytes/s, best of ``--repeat``), the ratio to ``raw``, and the CPU seconds
both processes spent per GB (all runs; steadier than wall time on a busy box):

* ``raw``: bare gRPC, the ceiling: the same number of bytes as plain ``bytes`` messages of one chunk's size
  (``--chunk-kb``, 4 MiB) with identity (de)serializers: no protobuf, no checksum, nothing decoded;
* ``generated``: what the services do: ``fedentrpc.codec`` over the generated stubs and servicer
  registration, protobuf's own (de)serialisation of ``TensorChunk`` (a ``bytes`` field, one CRC-32C per
  chunk);
* ``copy`` (``--paths raw,generated,copy``): the floor of any tensor transfer with our integrity rule, not
  a candidate: bare gRPC moving the tensors with only the work no encoding can avoid: the one copy out
  of the tensors that gRPC-python's ``bytes``-only API forces, one CRC-32C per chunk on each end, and on
  receipt one copy into a recycled buffer (the receive pool's). No protobuf, no header, no checks.

The hand-written framing that this benchmark once held against the generated stubs (``hand``: chunk bytes
written and read by hand, zero-copy views) was measured with it at commit 7f6fd82 and removed; the figures
are in benchmarks/README.md.

``up``: the client cuts the tensors into checksummed chunks as gRPC sends them; the peer verifies every
chunk's checksum and the header's shapes and keeps the chunks (what ``PutBlob`` does). ``down``: the peer
streams the kept chunks (``FetchBlob``); the client verifies every chunk and rebuilds the tensors, which
are checked equal to the originals once per path.

``--malloc tuned`` runs every process with glibc's mmap threshold 32 MiB and trim threshold 256 MiB (set
through glibc's own environment variables, read at process start): freed 4 MiB buffers stay in the heap
instead of being unmapped and faulted in again for the next chunk. ``default`` leaves glibc alone.

    python benchmarks/bench_transfer.py                                  # 16, 256, 1024 MB, both directions
    python benchmarks/bench_transfer.py --sizes-mb 16 --repeat 3 --malloc tuned --json out.json
    python benchmarks/bench_transfer.py --sizes-mb 16 --repeat 1 --big-gb 2.2      # + a model over 2 GB
    python benchmarks/bench_transfer.py --paths raw,generated,copy                 # + the floor
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fedentrpc import codec  # noqa: E402
from fedentrpc.options import grpc_options  # noqa: E402
from fedentrpc.receive_pool import RECEIVE_POOL  # noqa: E402
from fedentrpc.v1 import estimator_pb2 as est_pb  # noqa: E402
from fedentrpc.v1 import estimator_pb2_grpc as est_grpc  # noqa: E402

GB = 1e9
MB = 2**20
OPTIONS = grpc_options()  # the services' message-size limits
RAW_SERVICE = "fedent.bench.Raw"
TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 * MB), "MALLOC_TRIM_THRESHOLD_": str(256 * MB)}
PATHS = ("raw", "generated", "copy")
BARE = ("raw", "copy")  # paths on the bare byte service, no protobuf


def _ident(b: bytes) -> bytes:
    return b


# ---- peers --------------------------------------------------------------------------------------------


class _Store(est_grpc.EstimatorServiceServicer):
    """The estimator service's PutBlob and FetchBlob: verify every chunk and keep the received messages (the
    last upload's only, so peak memory stays at one model), then stream the chunks back in FetchBlob's
    response messages, built at the first fetch (the untimed, checked download) and kept, as the service
    does: the timed downloads stream them as they are, like the aggregator's round model, which is encoded
    in its response messages once."""

    def __init__(self) -> None:
        self.blob = codec.EncodedTensors((), 0, 0)

    def PutBlob(self, request_iterator: Iterator[est_pb.PutBlobRequest],
                context: grpc.ServicerContext) -> est_pb.PutBlobResponse:
        self.blob = codec.EncodedTensors((), 0, 0)
        asm = codec.TensorAssembler(keep_payload=False)
        kept = []
        for m in request_iterator:
            asm.add(m.chunk)
            kept.append(m)
        raw = asm.verify().raw_bytes
        self.blob = codec.EncodedTensors(kept, int(raw), asm.wire_bytes)
        return est_pb.PutBlobResponse(blob_id="last", wire_bytes=asm.wire_bytes)

    def FetchBlob(self, request: est_pb.EstimatorServiceFetchBlobRequest,
                  context: grpc.ServicerContext) -> Iterator[est_pb.EstimatorServiceFetchBlobResponse]:
        yield from self.blob.as_messages(est_pb.EstimatorServiceFetchBlobResponse)


class _Copy:
    """The ``copy`` floor's peer: an upload is copied into one buffer kept while the size stays (as the
    receive pool keeps it), a download streams it cut once into chunks, each with its CRC-32C computed."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self.buf = np.empty(0, dtype=np.uint8)
        self.n = 0
        self.pieces: list[bytes] | None = None

    def up(self, it: Iterator[bytes], ctx: grpc.ServicerContext) -> bytes:
        self.pieces, pos = None, 0
        for b in it:
            codec.checksum("crc32c", b)
            if pos + len(b) > len(self.buf):  # grown on the first upload of a size, then reused
                grown = np.empty(max(2 * len(self.buf), pos + len(b)), dtype=np.uint8)
                grown[:pos] = self.buf[:pos]
                self.buf = grown
            self.buf[pos : pos + len(b)] = np.frombuffer(b, dtype=np.uint8)
            pos += len(b)
        self.n = pos
        return str(pos).encode()

    def down(self, req: bytes, ctx: grpc.ServicerContext) -> Iterator[bytes]:
        if self.pieces is None:  # cut once, then streamed as they are (a model encoded once)
            mv = self.buf[: self.n].data
            self.pieces = [bytes(mv[i : i + self.chunk]) for i in range(0, len(mv), self.chunk)]
            for b in self.pieces:
                codec.checksum("crc32c", b)
        yield from self.pieces


def serve(path: str, chunk: int) -> int:
    server = grpc.server(futures.ThreadPoolExecutor(4), options=OPTIONS)
    if path == "copy":
        peer = _Copy(chunk)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(RAW_SERVICE, {
            "Down": grpc.unary_stream_rpc_method_handler(peer.down, _ident, _ident),
            "Up": grpc.stream_unary_rpc_method_handler(peer.up, _ident, _ident)}),))
    elif path == "raw":
        piece = bytes(chunk)

        def down(req: bytes, ctx: grpc.ServicerContext) -> Iterator[bytes]:
            left = int(req)
            while left > 0:
                yield piece if left >= len(piece) else piece[:left]
                left -= len(piece)

        def up(it: Iterator[bytes], ctx: grpc.ServicerContext) -> bytes:
            return str(sum(len(b) for b in it)).encode()

        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(RAW_SERVICE, {
            "Down": grpc.unary_stream_rpc_method_handler(down, _ident, _ident),
            "Up": grpc.stream_unary_rpc_method_handler(up, _ident, _ident)}),))
    else:
        est_grpc.add_EstimatorServiceServicer_to_server(_Store(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"LISTENING port={port}", flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin
    server.stop(0)
    return 0


def spawn(path: str, chunk: int, env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", path,
                             "--chunk-kb", str(chunk // 1024)], cwd=ROOT,
                            env={**env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("LISTENING port="):
        proc.kill()
        raise SystemExit(f"bench_transfer: the {path} peer did not start ({line!r})")
    return proc, int(line.split("=", 1)[1])


# ---- the client side ----------------------------------------------------------------------------------


def make_params(nbytes: int, pieces: int = 4) -> list[torch.Tensor]:
    """A synthetic float32 parameter list of ``nbytes`` in ``pieces`` tensors with a checkable pattern."""
    numel = nbytes // 4
    sizes = [numel // pieces] * (pieces - 1) + [numel - (numel // pieces) * (pieces - 1)]
    return [torch.arange(n, dtype=torch.float32).mul_(1.0 / 1024).add_(float(i)) for i, n in enumerate(sizes)]


class Path_:
    """One wire path's upload and download against its peer."""

    def __init__(self, name: str, ch: grpc.Channel, chunk: int) -> None:
        self.name = name
        self.chunk = chunk
        self.spec = codec.TransferSpec(chunk_bytes=chunk, checksum="crc32c")
        self.shapes: list[torch.Size] = []  # copy: the last upload's tensors, to rebuild its downloads
        if name in BARE:
            self._down = ch.unary_stream(f"/{RAW_SERVICE}/Down", request_serializer=_ident,
                                         response_deserializer=_ident)
            self._up = ch.stream_unary(f"/{RAW_SERVICE}/Up", request_serializer=_ident, response_deserializer=_ident)
        else:
            self.stub = est_grpc.EstimatorServiceStub(ch)

    def up(self, params: list[torch.Tensor], nbytes: int) -> None:
        if self.name == "raw":
            piece, step = bytes(self.chunk), self.chunk
            pieces = (piece if i + step <= nbytes else piece[: nbytes - i] for i in range(0, nbytes, step))
            assert int(self._up(pieces, timeout=3600)) == nbytes
            return
        if self.name == "copy":
            views = [t.contiguous().view(torch.uint8).numpy().data for t in params]
            self.shapes = [t.shape for t in params]

            def cut() -> Iterator[bytes]:
                for piece in codec._pieces(views, nbytes, self.chunk):
                    b = b"".join(piece)  # the one copy out of the tensors
                    codec.checksum("crc32c", b)
                    yield b

            assert int(self._up(cut(), timeout=3600)) == nbytes
            return
        chunks = codec.stream_tensors({codec.PARAMS_GROUP: params}, est_pb.PutBlobRequest, self.spec)
        assert self.stub.PutBlob(chunks, timeout=3600).wire_bytes == nbytes

    def down(self, nbytes: int) -> list[torch.Tensor] | None:
        if self.name == "raw":
            assert sum(len(b) for b in self._down(str(nbytes).encode(), timeout=3600)) == nbytes
            return None
        if self.name == "copy":
            dst, mem = RECEIVE_POOL.take(nbytes)
            pos = 0
            for b in self._down(str(nbytes).encode(), timeout=3600):
                codec.checksum("crc32c", b)
                mem[pos : pos + len(b)] = np.frombuffer(b, dtype=np.uint8)
                pos += len(b)
            assert pos == nbytes
            out, at = [], 0
            for shape in self.shapes:
                k = math.prod(shape) * 4
                out.append(dst[at : at + k].view(torch.float32).reshape(shape))
                at += k
            return out
        stream = self.stub.FetchBlob(est_pb.EstimatorServiceFetchBlobRequest(blob_id="last"), timeout=3600)
        return codec.decode_tensors(stream)[codec.PARAMS_GROUP]


def peer_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far, all its threads (from /proc; 0 where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Clock:
    """Wall seconds of each call, and the CPU seconds both ends spent on all of them together."""

    def __init__(self, peer_pid: int) -> None:
        self.peer_pid = peer_pid
        self.wall: list[float] = []
        self.cpu = 0.0

    def __call__(self, fn: Callable[[], Any]) -> None:
        c0, p0, t0 = time.process_time(), peer_cpu_s(self.peer_pid), time.perf_counter()
        fn()
        self.wall.append(time.perf_counter() - t0)
        self.cpu += time.process_time() - c0 + peer_cpu_s(self.peer_pid) - p0


def bench_size(paths: list[Path_], pids: dict[str, int], size_mb: int, repeat: int) -> dict[str, Any]:
    nbytes = size_mb * MB
    params = make_params(nbytes)
    up = {p.name: Clock(pids[p.name]) for p in paths}
    down = {p.name: Clock(pids[p.name]) for p in paths}
    for _ in range(repeat):  # interleaved: a burst of load elsewhere hits every path alike
        for p in paths:
            up[p.name](functools.partial(p.up, params, nbytes))
    for p in paths:
        got = p.down(nbytes)
        assert got is None or all(torch.equal(a, b) for a, b in zip(got, params, strict=True)), p.name
        del got
    del params
    for _ in range(repeat):
        for p in paths:
            down[p.name](functools.partial(p.down, nbytes))
    r: dict[str, Any] = {"size_mb": size_mb, "bytes": nbytes}
    for name in up:
        for d, c in (("up", up[name]), ("down", down[name])):
            raw = up["raw"] if d == "up" else down["raw"]
            r[f"{name}_{d}_gbps"] = nbytes / min(c.wall) / GB
            r[f"{name}_{d}_all_gbps"] = [round(nbytes / t / GB, 3) for t in c.wall]
            r[f"{name}_{d}_vs_raw"] = min(raw.wall) / min(c.wall)
            r[f"{name}_{d}_cpu_s_per_gb"] = c.cpu / (repeat * nbytes / GB)
            r[f"{name}_{d}_cpu_vs_raw"] = raw.cpu / c.cpu if c.cpu else float("nan")
    return r


def bench_big(path: Path_, gb: float) -> dict[str, Any]:
    """One parameter list over 2 GB (protobuf's and gRPC's message limits), up and down once, cold, with
    every chunk's checksum verified on both ends and the result compared element by element."""
    nbytes = int(gb * GB) // 4 * 4
    params = make_params(nbytes, pieces=3)
    t_up = time.perf_counter()
    path.up(params, nbytes)
    t_up = time.perf_counter() - t_up
    t_down = time.perf_counter()
    got = path.down(nbytes)
    t_down = time.perf_counter() - t_down
    assert got is not None
    equal = [t.shape for t in got] == [t.shape for t in params] and all(
        torch.equal(a, b) for a, b in zip(got, params, strict=True))
    return {"bytes": nbytes, "chunks": -(-nbytes // path.chunk), "upload_gbps": nbytes / t_up / GB,
            "download_gbps": nbytes / t_down / GB, "content_equal": equal}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", default="16,256,1024", help="comma-separated sizes in MiB")
    p.add_argument("--repeat", type=int, default=5, help="best of this many runs per size, path and direction")
    p.add_argument("--chunk-kb", type=int, default=codec.MAX_CHUNK_BYTES // 1024,
                   help="chunk (and bare gRPC message) size in KiB, at most 4096")
    p.add_argument("--malloc", choices=["tuned", "default"], default="default",
                   help="tuned: glibc keeps freed chunk buffers in the heap (every process); default: glibc's own")
    p.add_argument("--big-gb", type=float, default=0.0, help="then move one model of this many GB (e.g. 2.2) "
                   "through the generated path and check it")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--paths", default="raw,generated", help=f"comma-separated, raw first; of {', '.join(PATHS)}")
    p.add_argument("--serve", choices=PATHS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    chunk = args.chunk_kb * 1024
    if args.serve:
        return serve(args.serve, chunk)
    env = {k: v for k, v in os.environ.items() if k not in TUNED_MALLOC}
    if args.malloc == "tuned":
        env.update(TUNED_MALLOC)
    if any(os.environ.get(k) != env.get(k) for k in TUNED_MALLOC):  # glibc reads these at start: restart
        os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *(argv or sys.argv[1:])], env)
    sizes = [int(s) for s in args.sizes_mb.split(",") if s.strip()]
    names = [n.strip() for n in args.paths.split(",") if n.strip()]
    if not names or names[0] != "raw" or any(n not in PATHS for n in names):
        p.error(f"--paths must start with raw and name only {', '.join(PATHS)}")
    if args.big_gb > 0 and "generated" not in names:
        p.error("--big-gb moves its model through the generated path: name it in --paths")
    peers = {n: spawn(n, chunk, env) for n in names}
    results: dict[str, Any] = {"cpus": os.cpu_count(), "malloc": args.malloc, "repeat": args.repeat,
                               "chunk_bytes": chunk, "paths": names, "sizes": []}
    print(f"chunks {chunk >> 10} KiB; malloc {args.malloc}; GB/s best of {args.repeat}; (x) = ratio to bare gRPC "
          "(raw) in the same run; "
          "cpu s/GB: both processes' CPU seconds per GB moved, all runs (x = raw's / the path's)")
    chans = {n: grpc.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS) for n, (_, port) in peers.items()}
    try:
        paths = [Path_(n, chans[n], chunk) for n in names]
        print(f"{'size':>7} {'dir':>4} " + " ".join(f"{n:>16}" for n in names), flush=True)
        for s in sizes:
            r = bench_size(paths, {n: proc.pid for n, (proc, _) in peers.items()}, s, args.repeat)
            results["sizes"].append(r)
            for d in ("up", "down"):
                cells = [f"{r[f'{n}_{d}_gbps']:.2f} ({r[f'{n}_{d}_vs_raw']:.2f}x)" for n in names]
                cpu = [f"{r[f'{n}_{d}_cpu_s_per_gb']:.2f} ({r[f'{n}_{d}_cpu_vs_raw']:.2f}x)" for n in names]
                print(f"{s:>5}MB {d:>4} " + " ".join(f"{c:>16}" for c in cells) + "  |  cpu s/GB " +
                      " ".join(f"{c:>14}" for c in cpu), flush=True)
        if args.big_gb > 0:
            big = results["big"] = bench_big(paths[names.index("generated")], args.big_gb)
            print(f"big: {big['bytes'] / GB:.2f} GB in {big['chunks']} chunks, cold, once: up "
                  f"{big['upload_gbps']:.2f} GB/s, down {big['download_gbps']:.2f} GB/s; every chunk's checksum "
                  f"verified; content equal={big['content_equal']}", flush=True)
    finally:
        for ch in chans.values():
            ch.close()
        for proc, _ in peers.values():
            proc.communicate(timeout=60)  # closes its stdin: it stops
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if results.get("big", {}).get("content_equal", True) else 1


if __name__ == "__main__":
    sys.exit(main())
