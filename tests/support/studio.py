"""A real ``xtrain studio`` for the tests: started as a user starts it (``python -m xtrain studio
--runs DIR --port 0 --no-browser``, offline), its URL read from its last line; killed and started
again on the same port; plain HTTP requests to it with the stdlib (no client library)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

START_TIMEOUT_S = 60


@dataclass
class Studio:
    proc: subprocess.Popen
    url: str  # as printed: http://127.0.0.1:PORT/?token=...
    runs: Path
    env: dict[str, str]

    @property
    def base(self) -> str:
        return self.url.split("?")[0]

    @property
    def port(self) -> int:
        return int(urlsplit(self.url).port or 0)

    @property
    def token(self) -> str:
        return self.url.split("token=", 1)[1] if "token=" in self.url else ""

    def kill(self) -> None:
        """As a crash or a closed terminal ends it: SIGKILL, nothing cleaned up."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def start(runs: Path, env: dict[str, str], *args: str, port: int = 0) -> Studio:
    """The studio serving ``runs``, its URL once it says it (its last line)."""
    cmd = [sys.executable, "-m", "xtrain", "studio", "--runs", str(runs), "--port", str(port), "--no-browser"]
    proc = subprocess.Popen(
        [*cmd, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    end = time.monotonic() + START_TIMEOUT_S
    assert proc.stdout is not None
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if line.startswith("http://"):
            return Studio(proc, line.strip(), runs, env)
    proc.kill()
    raise AssertionError("the studio printed no URL:\n" + "\n".join(lines))


def request(
    url: str, method: str = "GET", body: object = None, headers: dict[str, str] | None = None
) -> tuple[int, dict]:
    """(status, JSON answer) of one request; an HTTP error's too."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json",
                                                                       **(headers or {})})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
