"""``make demo``: crawl the bundled demo site on the embedded services, then show what landed.

Starts the test web's catalogue on two loopback hosts (127.0.0.2 and 127.0.0.3,
port 8081 when free), runs one real ``scrapy crawl generic`` worker against it
with no REDIS_URL/MONGO_URI/BLOB_STORE_URI (so the embedded Valkey, SecantusDB
and the local blob folder are used), and prints the stored pages, distinct
contents and per-host counts, and where they live.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scrapy.utils.project import get_project_settings

from tests.testweb import TestWeb
from webfarm import report

ROOT = Path(__file__).resolve().parent.parent
HOSTS = ("127.0.0.2", "127.0.0.3")


def start_web() -> TestWeb:
    try:
        return TestWeb(hosts=HOSTS, port=8081).start()
    except OSError:
        return TestWeb(hosts=HOSTS, port=0).start()


def main() -> int:
    for name in ("REDIS_URL", "MONGO_URI", "BLOB_STORE_URI"):
        if os.environ.get(name):
            print(f"demo: {name} is set; the demo uses it instead of the embedded service")
    web = start_web()
    try:
        start = ",".join(f"{base}/" for base in web.base_urls)
        print(f"demo: serving the demo shop at {', '.join(web.base_urls)}", flush=True)
        env = {
            **os.environ,
            # The demo site is on loopback, which the SSRF guard refuses unless allowed.
            "WEBFARM_ALLOWED_NETWORKS": os.environ.get("WEBFARM_ALLOWED_NETWORKS", "127.0.0.0/8"),
            "WEBFARM_IDLE_TIMEOUT": os.environ.get("WEBFARM_IDLE_TIMEOUT", "2"),
        }
        cmd = [sys.executable, "-m", "scrapy", "crawl", "generic", "-a", f"start={start}",
               "-s", "SCHEDULER_FLUSH_ON_START=True", "-s", "LOG_LEVEL=INFO"]
        print(f"demo: {' '.join(cmd[2:])}", flush=True)
        code = subprocess.run(cmd, cwd=ROOT, env=env, timeout=600).returncode
        if code != 0:
            print(f"demo: the crawl failed (exit {code})", file=sys.stderr)
            return code
        print(f"\ndemo: fetched {len(web.hits)} URLs from the demo shop; stored:\n")
        print(report.render(report.stored(get_project_settings())))
        print("\nStop the embedded services with: .venv/bin/scrapy services down")
        return 0
    finally:
        web.stop()


if __name__ == "__main__":
    sys.exit(main())
