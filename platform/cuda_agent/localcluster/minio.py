"""A local MinIO server (built from its Go module by `binaries`) for the embedded default's artifacts.

Loopback only, random root credentials, data in a directory of the caller's; `cuda-agent demo` points the
artifacts Secret at it, so checkpoints and the trainer's outputs land in S3 exactly as on a cluster.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cuda_agent.localcluster.binaries import ensure
from cuda_agent.localhost import free_port

STARTUP_TIMEOUT_S = 60.0


@dataclass
class LocalMinio:
    """`minio server` on 127.0.0.1; `start()` blocks until it is live, `stop()` ends it."""

    data_dir: Path
    endpoint: str = field(default_factory=lambda: f"127.0.0.1:{free_port()}")
    access_key: str = field(default_factory=lambda: f"demo-{secrets.token_hex(4)}")
    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def start(self) -> None:
        binary = ensure("minio")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            "MINIO_BROWSER": "off",
            "MINIO_UPDATE": "off",
        }
        command = [str(binary), "server", "--quiet", "--address", self.endpoint]
        command += ["--console-address", f"127.0.0.1:{free_port()}", str(self.data_dir)]
        log = self.data_dir.parent / "minio.log"
        with log.open("wb") as sink:
            self.process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.live():
            if self.process.poll() is not None:
                raise RuntimeError(f"minio exited with {self.process.returncode}: {log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"minio not live on {self.endpoint} after {STARTUP_TIMEOUT_S:.0f} s ({log})"
                )
            time.sleep(0.2)

    def live(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/minio/health/live", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def secret_data(self) -> dict[str, str]:
        """The artifacts Secret's keys (as cuda_agent.storage.config reads them)."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
