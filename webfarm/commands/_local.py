"""What Scrapy's developer commands (``parse``, ``shell``, ``fetch``, ``view``, ``check``,
``bench``) need in a webfarm project: Scrapy's own in-memory scheduler, not the shared
frontier.

Their requests carry callbacks that are not spider methods (``parse``'s closure, the
shell's ``Deferred.callback``, ``check``'s contract wrappers), which no frontier can
store, so on the frontier they failed with "is not an instance method" and fetched
nothing, as they do under scrapy-redis (``check`` even said OK, having run no
contract). And a page fetched to try a spider must not join the fleet's crawl: its
links would be queued for every worker. Metrics are off too, since they read the
frontier. Everything else (render, proxies, politeness, the SSRF guard) stays as a
crawl has it. A ``-s`` on the command line still wins.
"""

from __future__ import annotations

import argparse
from typing import Any

from scrapy import Request
from scrapy.settings import SETTINGS_PRIORITIES
from w3lib.url import is_url

from webfarm.commands._common import (
    BAD_CONFIG,
    CommandError,
    check_log_level,
    report,
    spider_class,
    spider_settings,
)

#: Settings these commands get unless given with ``-s``.
LOCAL = {
    "SCHEDULER": "scrapy.core.scheduler.Scheduler",
    "DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter",
    "WEBFARM_METRICS": False,
}


class LocalScheduling:
    """Mixin for a Scrapy command: :data:`LOCAL` over the project's settings."""

    settings: Any
    local: dict[str, Any] = LOCAL

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)  # type: ignore[misc]
        check_log_level(self.settings)
        for name, value in self.local.items():
            if (self.settings.getpriority(name) or 0) < SETTINGS_PRIORITIES["cmdline"]:
                self.settings.set(name, value, priority="cmdline")


class FromStore(LocalScheduling):
    """``--stored``: every page comes from the index and blob store, as a crawl kept it
    (:mod:`webfarm.stored`), and none from the network. The URL given is looked up
    first, so one that was never stored is one line and exit code 2, not an empty run;
    without ``--spider``, the spider that stored it gets it (its callbacks, for parse)."""

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)  # type: ignore[misc]
        parser.add_argument(
            "--stored", action="store_true",
            help="use the page as a crawl stored it (index and blob store), not the web: "
                 "no request leaves the machine")

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)
        if opts.stored:
            from webfarm.stored import use_stored_pages  # pymongo, only when asked for

            use_stored_pages(self.settings)

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if getattr(opts, "spider", None):  # a typo: Scrapy's "Unable to find spider", exit 0
            try:
                spider_class(self.settings, opts.spider)
            except CommandError as exc:
                report(self, exc)
                return
        if opts.stored and args and is_url(args[0]):
            try:
                stored_by, doc = check_stored(self.settings, args[0],
                                              getattr(opts, "spider", None))
            except CommandError as exc:
                report(self, exc)
                return
            if hasattr(opts, "spider") and not opts.spider:
                opts.spider = stored_by
            if stored_by and opts.spider == stored_by:
                stored_callback(opts, doc)
        super().run(args, opts)  # type: ignore[misc]


def stored_callback(opts: argparse.Namespace, doc: dict[str, Any]) -> None:
    """``parse --stored`` without ``-c``: the callback that got the page in the crawl, with
    its request's ``cb_kwargs`` under any ``--cbkwargs`` given. It ran the spider's
    ``parse`` (a product page printed no product), and ``-c parse_product`` then failed
    for the ``cb_kwargs`` it takes."""
    if not hasattr(opts, "callback") or opts.callback or not doc.get("callback"):
        return
    opts.callback = doc["callback"]
    if doc.get("cb_kwargs"):
        from webfarm import serialize

        try:
            kept = serialize.loads_value(doc["cb_kwargs"])
        except Exception:  # noqa: BLE001 - kept by an older crawl: the callback alone
            return
        if isinstance(kept, dict):
            opts.cbkwargs = {**kept, **(opts.cbkwargs or {})}


def check_stored(settings: Any, url: str, spider: str | None
                 ) -> tuple[str | None, dict[str, Any]]:
    """CommandError unless a page is stored for ``url`` where the spider that would get it
    (``--spider``, else the one whose domains take the URL) keeps its pages; the name of
    the project's spider that stored it, if it still has one of that name, and the page's
    document."""
    from scrapy.spiderloader import get_spider_loader
    from scrapy.utils.spider import DefaultSpider, spidercls_for_request

    from webfarm import config
    from webfarm.stored import NotStored, StoredPages

    loader = get_spider_loader(settings)
    spidercls = (spider_class(settings, spider) if spider else
                 spidercls_for_request(loader, Request(url), DefaultSpider))
    own = spider_settings(settings, spidercls)
    try:
        config.check_mongo(config.mongo_uri(own))
        config.check_blobs(config.blob_uri(own), own.get("AWS_ENDPOINT_URL") or None)
        pages = StoredPages(own)
    except config.ConfigError as exc:
        raise CommandError(str(exc), BAD_CONFIG) from None
    try:
        doc = pages.find(url)
        pages.rebuilt(doc, url)  # its body too: a blob store that lost it is said here
    except NotStored as exc:
        raise CommandError(str(exc)) from None
    finally:
        pages.close()
    name = doc.get("spider")
    return (name if name in loader.list() else None), doc
