"""Run ``scrapy`` commands of this project as real subprocesses, with bounded time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRAPY = [sys.executable, "-m", "scrapy"]
# Variables a developer's shell may carry that would change where a test writes.
CLEARED = ("REDIS_URL", "MONGO_URI", "MONGO_DATABASE", "BLOB_STORE_URI", "AWS_ENDPOINT_URL",
           "WEBFARM_DATA_DIR", "WEBFARM_PROXIES", "SCRAPY_SETTINGS_MODULE", "http_proxy",
           "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def env_for(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                # A worker stops once the whole frontier was empty this long: nothing is
                # queued, delayed or leased by then, so a test need not wait a second.
                "AWS_DEFAULT_REGION": "us-east-1", "WEBFARM_IDLE_TIMEOUT": "0.3",
                "WEBFARM_HOST_DELAY": "0",
                # The test web lives on loopback, which the SSRF guard refuses by default.
                "WEBFARM_ALLOWED_NETWORKS": "127.0.0.0/8"})
    env.update(overrides)
    return env


def popen(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start ``scrapy ARGS`` in the background, output to ``log``. Its SIGINT is the default
    even when this run inherited it ignored (a shell's background job): Python keeps an
    ignored SIGINT ignored, and tests send Ctrl-C."""
    with open(log, "wb") as out:
        return subprocess.Popen(SCRAPY + args, cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=_default_sigint)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def scrapy(args: list[str], env: dict[str, str], timeout: float = 120) -> Result:
    proc = subprocess.run(SCRAPY + args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    return Result(proc.returncode, proc.stdout, proc.stderr)
