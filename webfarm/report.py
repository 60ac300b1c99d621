"""What a crawl stored, and where: ``python -m webfarm.report``.

Reads the index and the blob store through the same settings a worker uses, so
it answers "did my crawl land?" for embedded and real services alike.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from scrapy.settings import BaseSettings
from scrapy.utils.project import get_project_settings

from webfarm import config
from webfarm.blobstore import open_blob_store
from webfarm.index import IndexStore


def stored(settings: BaseSettings) -> dict[str, Any]:
    loc = config.locations(settings)
    index = IndexStore(loc.mongo_uri, loc.mongo_database)
    try:
        summary = index.summary()
    finally:
        index.close()
    blobs = open_blob_store(loc.blob_uri, endpoint_url=loc.aws_endpoint_url)
    summary["blobs"] = sum(1 for _ in blobs.iter_keys())
    summary["where"] = {
        "index": f"{config.safe_url(loc.mongo_uri)} database {loc.mongo_database!r}",
        "blobs": loc.blob_uri,
        "frontier": config.safe_url(loc.redis_url),
    }
    return summary


def render(summary: dict[str, Any]) -> str:
    lines = [
        f"pages stored:       {summary['pages']}",
        f"distinct contents:  {summary['contents']}",
        f"duplicate pages:    {summary['duplicates']}",
        f"raw blobs:          {summary['blobs']}",
        "pages per host:",
    ]
    lines += [f"  {host:<28} {n}" for host, n in summary["per_host"].items()] or ["  (none)"]
    lines += ["where:"] + [f"  {k:<9} {v}" for k, v in summary["where"].items()]
    if not summary["pages"] and summary["blobs"]:
        # A fleet's jobs given setting=MONGO_DATABASE=crawl, read here on 'webfarm': 0 pages
        # beside 300 blobs, and no word of why.
        lines.append(f"note: no page in this database, though the blob store holds "
                     f"{summary['blobs']} bodies: the crawl may have written another one "
                     "(MONGO_DATABASE, as its workers were given it: -s, a scrapyd job's "
                     "setting=, the environment); set it here the same way, e.g. "
                     "MONGO_DATABASE=crawl python -m webfarm.report")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m webfarm.report",
        description="What a crawl stored, and where: pages, distinct contents, pages per "
                    "host, the stores (the settings a worker uses: MONGO_URI, "
                    "BLOB_STORE_URI, or the embedded services).")
    parser.add_argument("--json", action="store_true", help="print it as JSON")
    opts = parser.parse_args(sys.argv[1:] if argv is None else argv)  # --help, bad flags
    try:
        summary = stored(get_project_settings())
    except config.ConfigError as exc:
        print(f"webfarm: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2) if opts.json else render(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
