"""Serve the test web until SIGINT/SIGTERM: ``python -m tests.testweb --host 127.0.0.2 ...``.

Once listening it prints one JSON line, ``{"base_urls": [...], "pid": N}``, and flushes, so a
Makefile or a test can wait for that line instead of polling ports.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading

from tests.testweb.server import TestWeb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testweb", description=__doc__)
    parser.add_argument("--host", action="append", dest="hosts", metavar="ADDR",
                        help="loopback address to serve (repeatable; "
                             "default 127.0.0.2 and 127.0.0.3)")
    parser.add_argument("--port", type=int, default=0, help="port on every host (0: pick one)")
    parser.add_argument("--categories", type=int, default=3)
    parser.add_argument("--products", type=int, default=12, help="products per category")
    parser.add_argument("--per-page", type=int, default=5, help="products per category page")
    parser.add_argument("--reviews-kb", type=int, default=0,
                        help="KB of review text on every product page (default none)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log requests to stderr")
    args = parser.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,
                            format="%(asctime)s %(message)s")

    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    web = TestWeb(hosts=args.hosts or ("127.0.0.2", "127.0.0.3"), port=args.port,
                  categories=args.categories, products_per_category=args.products,
                  per_page=args.per_page, reviews_kb=args.reviews_kb)
    try:
        web.start()
    except OSError as exc:
        print(f"testweb: cannot listen on {args.hosts} port {args.port}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"base_urls": web.base_urls, "pid": os.getpid()}), flush=True)
    try:
        while not stopping.wait(0.5):
            pass
    finally:
        web.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
