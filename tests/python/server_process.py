"""Runs the real `attnres serve` binary for end-to-end tests.

    with ServerProcess(attnres_bin, "--max-num-seqs", "8") as server:
        requests to server.http_url / server.grpc_target

Ports: each server binds free ports chosen here (bind to port 0, read it back, release it),
so tests can run side by side. On exit the server gets SIGTERM and must exit with code 0
within the timeout: a clean shutdown is part of what every test checks.

$ATTNRES_TEST_SERVER_ARGS (shell words) is appended to every server's flags: the suite
against a GPU server is `ATTNRES_TEST_SERVER_ARGS="--device cuda" pytest ...`
(kernels/cuda/gpu_lease.sh, step e2e). A test that gives one of those flags itself
gets the server's "given twice" error, and fails.
"""

import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, attnres_bin: Path, *extra_args: str, env: dict | None = None,
                 startup_timeout: float = 120.0, shutdown_timeout: float = 60.0,
                 launcher: list[str] | None = None):
        if not Path(attnres_bin).exists():
            raise FileNotFoundError(f"attnres binary not found at {attnres_bin}: build first")
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.http_url = f"http://127.0.0.1:{self.http_port}"
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        extra = [str(a) for a in extra_args]
        defaults = [] if "--kv-cache-memory" in extra else ["--kv-cache-memory", "256MiB"]
        # A launcher (mpirun ...) runs the binary as several processes.
        self.args = [*(launcher or []), str(attnres_bin), "serve", "--port", str(self.http_port), "--grpc-port",
                     str(self.grpc_port), *defaults, *extra,
                     *shlex.split(os.environ.get("ATTNRES_TEST_SERVER_ARGS", ""))]
        # One engine thread by default: these tests check behaviour, not speed, and OpenMP's
        # spin-waiting collapses when a 2-core CI machine also runs the test clients.
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        self.startup_timeout = startup_timeout
        self.shutdown_timeout = shutdown_timeout
        self.proc: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.log_path: Path | None = None

    # --- lifecycle ---
    def __enter__(self) -> "ServerProcess":
        import tempfile
        self.log_file = tempfile.NamedTemporaryFile("w+", prefix="attnres-serve-", suffix=".log",
                                                    delete=False)
        self.log_path = Path(self.log_file.name)
        self.proc = subprocess.Popen(self.args, stdout=self.log_file, stderr=subprocess.STDOUT,
                                     env=self.env)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"attnres serve exited with {self.proc.returncode}:\n{self.log()}")
            if self.health() == 200:
                return self
            time.sleep(0.1)
        self.proc.kill()
        raise TimeoutError(f"attnres serve did not become healthy:\n{self.log()}")

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop()
        if exc_type is None and self.exit_code != 0:
            raise AssertionError(f"attnres serve exited with {self.exit_code} on SIGTERM:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Sends `sig` and waits for the exit; returns the exit code."""
        if self.proc is None or self.exit_code is not None:
            return self.exit_code
        self.proc.send_signal(sig)
        try:
            self.exit_code = self.proc.wait(timeout=self.shutdown_timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.exit_code = self.proc.wait()
            raise AssertionError(f"attnres serve ignored {sig} for {self.shutdown_timeout} s:\n{self.log()}")
        return self.exit_code

    # --- helpers ---
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def health(self) -> int | None:
        try:
            with urllib.request.urlopen(self.http_url + "/health", timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None

    def metrics(self) -> dict[str, float]:
        """The /metrics samples as {name{labels}: value}, and {name: value} for the first sample."""
        with urllib.request.urlopen(self.http_url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
            out.setdefault(key.split("{", 1)[0], float(value))
        return out
