"""``scrapy crawl``, checking where the frontier, index and blobs live before it starts
(``scrapy runspider`` checks the same, see webfarm/commands/runspider.py).

A wrong ``REDIS_URL``/``MONGO_URI``/``BLOB_STORE_URI`` stops the worker with one
line naming the variable, before any request is fetched. Unset ones start (or
join) the embedded services, whose URLs are then pinned in the settings so
every component and every worker of the machine uses the same ones.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import re
import sys
import traceback
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.commands.crawl import Command as ScrapyCrawlCommand
from scrapy.settings import BaseSettings

from webfarm import config
from webfarm.attrnames import close_name
from webfarm.batching import StorageUnavailable
from webfarm.commands._common import check_log_level, spider_settings
from webfarm.netguard import NetGuard, NetGuardError
from webfarm.refetch import RefetchConfigError, RefetchPolicy
from webfarm.render import RenderConfigError
from webfarm.settingnames import misspelt_names


class Command(ScrapyCrawlCommand):
    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)
        check_log_level(self.settings)

    def short_desc(self) -> str:
        return "Run a webfarm worker for a spider (checks Redis, MongoDB and blobs first)"

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None and self.crawler_process is not None
        spidercls = None
        if len(args) == 1:
            try:
                spidercls = self.crawler_process.spider_loader.load(args[0])
            except KeyError:
                print(f"webfarm: no spider named {args[0]!r}; `scrapy list` shows them",
                      file=sys.stderr)
                self.exitcode = 2
                return
        self.exitcode = prepare(self.settings, spidercls, opts)
        if self.exitcode:
            return
        if len(args) != 1:
            super().run(args, opts)  # Scrapy's usage error
            return
        self.exitcode = crawl_watched(self, args[0], opts)


def crawl_watched(command: ScrapyCommand, spider: str | type, opts: argparse.Namespace
                  ) -> int:
    """Scrapy's crawl and runspider ``run``, with the crawl's start watched for a
    component's refusal of a setting (:func:`say_setting_error`); the exit code."""
    process = command.crawler_process
    assert process is not None and command.settings is not None
    task = process.crawl(command._create_crawler(spider), **opts.spargs)
    if isinstance(task, asyncio.Future):
        task.add_done_callback(functools.partial(say_setting_error, command.settings))
    process.start()
    if process.crawlers:  # a crawl that never ended: forced to stop (a second signal)
        return forced_stop(process.crawlers)
    return 1 if process.bootstrap_failed else 0


def forced_stop(crawlers: Any) -> int:
    """A second Ctrl-C or TERM stops the reactor at once: the frontier scheduler never
    closed, so its leases waited ``WEBFARM_LEASE_SECONDS`` (10 minutes) to come back,
    and the exit code was 0, as for a finished crawl. Its leases go back now (a page
    whose items were not stored yet, or whose links were not sent, is fetched again);
    exit code 1."""
    given = 0
    crawlers = list(crawlers)
    for crawler in crawlers:
        scheduler = getattr(getattr(getattr(crawler, "engine", None), "_slot", None),
                            "scheduler", None)
        give_back = getattr(scheduler, "give_back_all", None)
        if give_back is not None:
            given += give_back()
    said = (f"webfarm: the crawl was forced to stop before it finished; {given} leases went "
            "back to the frontier for the next worker (fetched again: those whose pages "
            "were stored but not yet acknowledged are stored again, not duplicated)")
    print(said, file=sys.stderr)
    if any(getattr(c, "settings", {}).get("LOG_FILE") for c in crawlers):
        logging.getLogger(__name__).error(said)  # scrapyd's job log (LOG_FILE) too
    return 1


#: A component's refusal of a setting's value, raised as the crawl starts.
SETTING_ERRORS = (config.ConfigError, RenderConfigError, RefetchConfigError, NetGuardError)
_SETTING_NAME = re.compile(r"[A-Z][A-Z0-9_]{2,}")


def say_setting_error(settings: BaseSettings, task: asyncio.Future[Any]) -> None:
    """The crawl could not start because a component refused a setting: its message says
    what to fix, so it is said in one line (stderr, and the log for scrapyd) instead of
    under "Task exception was never retrieved" and a traceback. Other errors keep theirs."""
    if task.cancelled() or (exc := task.exception()) is None:
        return
    name = _SETTING_NAME.match(str(exc))
    # a store down past WEBFARM_STORAGE_RETRY_SECONDS as the crawl opened says so itself
    if isinstance(exc, (*SETTING_ERRORS, StorageUnavailable)) or (
            isinstance(exc, ValueError) and name is not None and name.group() in settings):
        print(f"webfarm: {exc}", file=sys.stderr)
        if settings.get("LOG_FILE"):
            logging.getLogger(__name__).error("webfarm: %s", exc)
        return
    print("The crawl failed:", file=sys.stderr)  # as asyncio would say, without "never retrieved"
    traceback.print_exception(exc)


#: ``-a`` arguments WebfarmSpider reads; another spider takes them as plain attributes
WEBFARM_ARGUMENTS = {"max_pages": "-s CLOSESPIDER_PAGECOUNT=N (Scrapy's, per worker)",
                     "render": "WEBFARM_RENDER or meta['render']",
                     "render_check": "the spider's render_check attribute"}


def warn_webfarm_arguments(spidercls: type, spargs: dict[str, Any]) -> None:
    """A spider not on WebfarmSpider sets ``-a max_pages=3`` as an attribute nothing reads:
    a trial run crawled the whole site without a word."""
    for name in sorted(set(spargs) & set(WEBFARM_ARGUMENTS)):
        logging.getLogger(__name__).warning(
            "webfarm: -a %s is read by WebfarmSpider only; %s is a %s, which ignores it: "
            "use %s", name, getattr(spidercls, "name", "the spider"),
            spidercls.__mro__[1].__name__, WEBFARM_ARGUMENTS[name])


def prepare(settings: BaseSettings, spidercls: type | None, opts: argparse.Namespace) -> int:
    """What ``scrapy crawl`` and ``scrapy runspider`` check before a worker starts: the
    spider (its ``-a`` arguments, a ``start_requests()`` Scrapy would not call), then the
    settings and locations its crawler will use (its custom_settings too), which are then
    pinned in ``settings``. The exit code: 0 to go on, else 2 (the spider) or 1 (the
    settings and locations), with one line on stderr."""
    name = getattr(spidercls, "name", None) if spidercls is not None else None
    checked = settings
    if spidercls is not None:
        try:
            refuse_ignored_start_requests(spidercls)
            refuse_missing_rule_methods(spidercls)
            check = getattr(spidercls, "check_crawl_arguments", None) or getattr(
                spidercls, "check_arguments", None)
            if check is not None:
                check(**opts.spargs)
            else:
                warn_webfarm_arguments(spidercls, opts.spargs)
        except ValueError as exc:
            print(f"webfarm: {name}: {exc}", file=sys.stderr)
            if settings.get("LOG_FILE"):  # scrapyd: the job's log must say why, too
                logging.getLogger(__name__).error("webfarm: %s: %s", name, exc)
            return 2
        checked = spider_settings(settings, spidercls)
    for slip in misspelt_names(checked):  # before any refusal: it may be why
        logging.getLogger(__name__).warning("webfarm: %s", slip)
    fleet = config.fleet_warning(checked)
    try:
        loc = config.preflight(checked, name)
        RefetchPolicy.check(checked, spidercls)
        NetGuard.from_settings(checked)  # a bad WEBFARM_ALLOWED_NETWORKS, before a server
    except SETTING_ERRORS as exc:
        print(f"webfarm: {exc}", file=sys.stderr)
        if settings.get("LOG_FILE"):  # scrapyd: the job's log must say why, too
            logging.getLogger(__name__).error("webfarm: %s", exc)
        return 1
    if fleet:
        logging.getLogger(__name__).warning("webfarm: %s", fleet)
    config.apply(settings, loc)
    return 0


def refuse_missing_rule_methods(spidercls: type) -> None:
    """ValueError when a CrawlSpider ``Rule`` names a method the spider does not have:
    Scrapy takes ``callback="parse_itme"`` for no callback, and a probe's crawl fetched
    every page, stored no item and exited 0."""
    for rule in getattr(spidercls, "rules", None) or ():
        for what in ("callback", "errback", "process_links", "process_request"):
            name = getattr(rule, what, None)
            if isinstance(name, str) and not callable(getattr(spidercls, name, None)):
                methods = [n for n in dir(spidercls) if callable(getattr(spidercls, n, None))
                           and not n.startswith("_")]
                meant = close_name(name, methods)
                hint = f"; did you mean {meant!r}?" if meant else ""
                raise ValueError(f"a Rule's {what}={name!r} is no method of "
                                 f"{spidercls.__name__} (Scrapy would skip it without a "
                                 f"word){hint}")


def refuse_ignored_start_requests(spidercls: type) -> None:
    """ValueError when the spider's ``start_requests()`` would never run: Scrapy 2.19 calls
    ``start()`` only, so a spider written for older Scrapy (or on scrapy-redis's spiders)
    crawled nothing, or only its ``start_urls``, without a word."""
    mro = spidercls.__mro__

    def owner(attr: str) -> int:
        return next((i for i, cls in enumerate(mro) if attr in vars(cls)), len(mro))

    if owner("start_requests") < owner("start"):
        if mro[owner("start_requests")].__module__.startswith("scrapy_redis"):
            raise ValueError(
                "it is a scrapy-redis spider, whose start URLs come from a Redis list webfarm "
                "does not read (and whose start_requests() Scrapy 2.19 no longer calls); base "
                "it on spiders.base.WebfarmSpider or scrapy.Spider and give it URLs with "
                "'scrapy seed SPIDER URL...'")
        raise ValueError(
            "it defines start_requests(), which Scrapy 2.19 no longer calls (it calls start()); "
            "rename it 'async def start(self)' and keep its body, its yields included")
