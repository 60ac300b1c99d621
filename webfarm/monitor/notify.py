"""Where alerts go: the log (ERROR when firing) and, if set, a webhook (JSON POST).

The POST runs in the caller's thread (the alert evaluator's, never the reactor)
with a bounded timeout. Webhook URLs often carry a token: logs name only the
scheme and host. A ``user:password@`` in the URL is sent as HTTP Basic authentication.
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.request
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit, urlunsplit

from scrapy.settings import BaseSettings

if TYPE_CHECKING:
    from webfarm.monitor.alerts import Finding

logger = logging.getLogger("webfarm.monitor.alerts")  # one logger for everything alerts say


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="seconds")


class Notifier:
    """Logs alerts and POSTs them as JSON to the webhook (in the caller's thread)."""

    def __init__(self, url: str, spider: str, worker: str, timeout: float = 5.0) -> None:
        self.url = url
        self.spider = spider
        self.worker = worker
        self.timeout = timeout
        parts = urlsplit(url)
        if url and (parts.scheme not in ("http", "https") or not parts.hostname):
            raise ValueError(f"WEBFARM_ALERT_WEBHOOK is not an http(s) URL (scheme "
                             f"{parts.scheme!r}); fix or unset it")
        # The URL often holds a token: logs name only its scheme and host.
        self.where = f"{parts.scheme}://{parts.hostname}" if url else ""
        # user:password@ in the URL: urllib took "user:password@host" for a host name (a
        # DNS error, every alert undelivered). Sent as HTTP Basic authentication instead.
        self._auth: str | None = None
        if url and parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self._auth = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
            netloc = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
            if parts.port is not None:
                netloc += f":{parts.port}"
            self.url = urlunsplit(parts._replace(netloc=netloc))

    @classmethod
    def from_settings(cls, s: BaseSettings, spider: str, worker: str) -> Notifier:
        url = (s.get("WEBFARM_ALERT_WEBHOOK") or "").strip()
        timeout = s.getfloat("WEBFARM_ALERT_WEBHOOK_TIMEOUT", 5.0)
        try:
            return cls(url, spider, worker, timeout)
        except ValueError as exc:  # the crawl goes on; alerts still reach the log
            logger.error("%s; alerts are only logged until then", exc)
            return cls("", spider, worker, timeout)

    def payload(self, finding: Finding, status: str, since: float, now: float) -> dict[str, Any]:
        return {
            "alert": finding.alert, "id": finding.id, "status": status, "spider": self.spider,
            "host": finding.host, "summary": finding.summary, "value": finding.value,
            "threshold": finding.threshold, "window_seconds": finding.window,
            "details": finding.details or {}, "since": _iso(since), "at": _iso(now),
            "worker": self.worker,
        }

    def send(self, payload: dict) -> bool:
        """Log the alert and POST it; False when the webhook did not take it."""
        if payload["status"] == "firing":
            logger.error("ALERT %s [%s]: %s", payload["alert"], self.spider, payload["summary"])
        else:
            logger.warning("RESOLVED %s [%s]: %s", payload["alert"], self.spider,
                           payload["summary"])
        return self.post(payload)

    def post(self, payload: dict) -> bool:
        """POST it to the webhook (True without one); False when that failed."""
        if not self.url:
            return True
        headers = {"Content-Type": "application/json", "User-Agent": "webfarm-alerts/1"}
        if self._auth:
            headers["Authorization"] = self._auth
        request = urllib.request.Request(self.url, data=json.dumps(payload).encode(),
                                         method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read(65536)
        except (OSError, ValueError) as exc:
            logger.error("Alert webhook %s failed: %s; %s %s is posted again at the next "
                         "check", self.where, exc, payload["id"], payload["status"])
            return False
        return True
