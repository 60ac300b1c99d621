"""Items every spider yields.

A :class:`PageItem` carries one fetched response through the storage
pipelines (hash, blob, index), kept apart from whatever a spider extracts so
raw pages can be re-parsed later.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PageItem:
    """One fetched page: what the index and the blob store keep of a response."""

    url: str  # the URL as requested (canonicalised for the page's id)
    final_url: str  # after redirects
    host: str
    spider: str
    status: int
    body: bytes = field(repr=False)
    content_type: str = ""
    encoding: str | None = None
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    fetched_at: float = 0.0
    fetch_method: str = "http"  # http | browser | api
    # Filled by the pipelines.
    content_hash: str | None = None
    blob_key: str | None = None

