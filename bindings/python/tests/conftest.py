"""Shared fixtures: real servers on free ports, stopped by PID.

- `redis_url`: a redis-server started for the test session (`--save ''`, no persistence).
- `sluice_serve(config_text, store)`: a `sluice serve` process (the binary of this workspace,
  `SLUICE_BIN` or `target/debug/sluice`) on a free port; returns its base URL.

Nothing here sleeps in place of a synchronisation: servers are waited for by polling the
port or reading the line the binary prints when it listens.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)  # polling a real server's port, not standing in for a sync
    raise RuntimeError(f"nothing listened on port {port} within {timeout} s")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


@contextlib.contextmanager
def own_redis_server() -> Iterator[int]:
    """A redis-server of the test's own on a free port, for a test that loses it: yields the
    port, and the server is stopped when the block ends."""
    port = free_port()
    process = subprocess.Popen(
        [shutil.which("redis-server"), "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, process)
        yield port
    finally:
        stop(process)


@pytest.fixture(scope="session")
def redis_server():
    """A real redis-server; yields `(url, port)`."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (scripts/test.sh installs it)")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="sluice-py-redis-")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, process)
        yield f"redis://127.0.0.1:{port}", port
    finally:
        stop(process)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_url(redis_server) -> str:
    return redis_server[0]


@pytest.fixture(params=["memory", "redis"])
def store(request) -> str:
    """A store URL: each test that takes it runs on memory and on the session's Redis."""
    if request.param == "memory":
        return "memory://"
    return request.getfixturevalue("redis_url")


def policy(rule: str, namespace: str) -> dict[str, str]:
    """A policy dict in its own namespace, so tests on one Redis never share counters."""
    return {"rule": rule, "namespace": namespace}


_namespace = 0


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses, so tests sharing the session's Redis never share a
    counter."""
    global _namespace
    _namespace += 1
    return f"t{os.getpid()}n{_namespace}"


def sluice_binary() -> str:
    binary = os.environ.get("SLUICE_BIN") or str(ROOT / "target" / "debug" / "sluice")
    if not os.path.exists(binary):
        pytest.fail(f"the sluice binary is not built at {binary} (cargo build -p sluice-cli)")
    return binary


@pytest.fixture
def sluice_serve():
    """Starts `sluice serve --config <text> --store <store>`; returns its base URL. Every
    process started is stopped when the test ends."""
    started: list[subprocess.Popen] = []
    dirs: list[str] = []

    def start(config: str, store: str = "memory://") -> str:
        directory = tempfile.mkdtemp(prefix="sluice-py-serve-")
        dirs.append(directory)
        path = Path(directory) / "sluice.toml"
        path.write_text(config)
        process = subprocess.Popen(
            [sluice_binary(), "serve", "--listen", "127.0.0.1:0", "--config", str(path),
             "--store", store],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        started.append(process)
        line = process.stdout.readline()  # "sluice listening on http://127.0.0.1:PORT"
        if "listening on " not in line:
            raise RuntimeError(f"sluice serve did not start: {line!r}")
        return line.rsplit(" ", 1)[1].strip()

    yield start
    for process in started:
        stop(process)
    for directory in dirs:
        shutil.rmtree(directory, ignore_errors=True)
