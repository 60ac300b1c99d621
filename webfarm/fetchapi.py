"""The last rung: an external fetch API (a rendering/unblocking service), off by default.

Contract (documented in the README): ``POST $WEBFARM_FETCH_API_URL`` with
``Authorization: Bearer $WEBFARM_FETCH_API_KEY`` and the JSON body
``{"url": URL, "format": "html"}``; the answer is HTTP 200 with the JSON body
``{"status": int, "url": final_url, "headers": {name: value}, "content": str}``
(the status, URL, headers and HTML the API saw at the target site).

The call goes through Scrapy's own downloader (``engine.download_async``), so
it is asynchronous, counted, timed out and size-limited like any fetch; it is
never queued, so the key never reaches Redis. The key is read from the
environment only (never a Scrapy setting, which Scrapy may log) and is kept out
of every repr, log line and stat.
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import urlsplit

from scrapy import Request
from scrapy.http import HtmlResponse, Response, TextResponse
from scrapy.settings import BaseSettings

KEY_ENV = "WEBFARM_FETCH_API_KEY"
META_CALL = "webfarm_fetchapi_call"  # marks the POST to the API itself
FLAG = "fetch-api"  # response flag of a page fetched through the API
# Headers that described the API's transfer, not the page we rebuild.
_DROPPED_HEADERS = {"content-length", "content-encoding", "transfer-encoding", "connection",
                    "content-type", "set-cookie"}


class FetchAPIError(Exception):
    """The API did not give us the page. ``retry``: worth trying again later."""

    def __init__(self, reason: str, *, retry: bool, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry = retry
        self.status = status


class FetchAPI:
    """Builds the API call for a request and turns the API's answer into the page."""

    def __init__(self, url: str, key: str, timeout: float = 60.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"WEBFARM_FETCH_API_URL={url!r} is not an http(s) URL")
        self.url = url
        self._key = key
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"FetchAPI({self.url!r}, key={'set' if self._key else 'unset'})"

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> FetchAPI | None:
        """None when ``WEBFARM_FETCH_API_URL`` is unset (the rung is off)."""
        url = (settings.get("WEBFARM_FETCH_API_URL") or "").strip()
        if not url:
            return None
        return cls(url, os.environ.get(KEY_ENV, "").strip(),
                   settings.getfloat("WEBFARM_FETCH_API_TIMEOUT", 60.0))

    def api_request(self, request: Request) -> Request:
        """The POST that asks the API for ``request.url``; never queued, never retried by
        Scrapy (the outcome is judged in :meth:`page`)."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        return Request(
            self.url, method="POST", headers=headers, dont_filter=True,
            body=json.dumps({"url": request.url, "format": "html"}).encode(),
            priority=request.priority,
            meta={META_CALL: True, "dont_retry": True, "dont_redirect": True,
                  "handle_httpstatus_all": True, "dont_obey_robotstxt": True,
                  "proxy": None, "download_timeout": self.timeout, "dont_cache": True},
        )

    def page(self, request: Request, answer: Response) -> HtmlResponse:
        """The page for ``request`` from the API's ``answer``; raises FetchAPIError."""
        status = answer.status
        if status == 429 or status >= 500:
            raise FetchAPIError(f"fetch API answered HTTP {status}", retry=True, status=status)
        if status in (401, 403):
            raise FetchAPIError(f"fetch API refused the key (HTTP {status}); check "
                                f"{KEY_ENV}", retry=True, status=status)
        if status != 200:
            raise FetchAPIError(f"fetch API answered HTTP {status} for this URL", retry=False,
                                status=status)
        try:
            text = answer.text if isinstance(answer, TextResponse) else answer.body.decode()
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise FetchAPIError(f"fetch API answer is not JSON ({exc}): "
                                f"{answer.body[:80]!r}", retry=False) from None
        return self._page_from(request, data)

    def _page_from(self, request: Request, data: Any) -> HtmlResponse:
        if not isinstance(data, dict):
            raise FetchAPIError(f"fetch API answer is JSON but not an object: "
                                f"{type(data).__name__}", retry=False)
        status, content = data.get("status"), data.get("content")
        final_url, headers = data.get("url") or request.url, data.get("headers") or {}
        problems = []
        if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status < 600:
            problems.append(f"'status' must be an HTTP status, got {status!r}")
        if not isinstance(content, str):
            problems.append(f"'content' must be a string, got {type(content).__name__}")
        if not isinstance(final_url, str) or urlsplit(final_url).scheme not in ("http", "https"):
            problems.append(f"'url' must be an http(s) URL, got {final_url!r}")
        if not isinstance(headers, dict):
            problems.append(f"'headers' must be an object, got {type(headers).__name__}")
        if problems:
            raise FetchAPIError("fetch API answer breaks the contract: " + "; ".join(problems),
                                retry=False)
        # JSON can carry half a surrogate pair ("\ud83d": a cut emoji), which UTF-8 cannot:
        # headers get "?" for it, the body keeps its bytes (read back as U+FFFD).
        kept: dict[str, str] = {_valid(k): _valid(v) for k, v in headers.items()
                                if str(k).lower() not in _DROPPED_HEADERS}
        kept["Content-Type"] = "text/html; charset=utf-8"
        if final_url != request.url:
            request.meta.setdefault("redirect_urls", [request.url])
        return HtmlResponse(final_url, status=status, headers=kept,
                            body=content.encode("utf-8", "surrogatepass"), encoding="utf-8",
                            request=request, flags=[FLAG])


def _valid(value: Any) -> str:
    return str(value).encode("utf-8", "replace").decode("utf-8")
