"""A request the frontier hands to a worker whose hosts do not include it goes back, not
away. Scrapy's offsite filter dropped it with a DEBUG line and its lease was acknowledged:
URLs seeded outside a worker's ``-a domains``, or the pages of another ``scrapy crawl
generic`` sharing the spider's frontier, were gone without a trace."""

from __future__ import annotations

import pymongo
import pytest

from tests import crawlcheck, runner
from tests.testweb import Response, TestWeb

HOSTS = ("127.0.0.17", "127.0.0.18")
FAST = ["-s", "WEBFARM_RETRY_TIMES=2", "-s", "WEBFARM_RETRY_BACKOFF_BASE=0.05",
        "-s", "WEBFARM_RETRY_BACKOFF_MAX=0.1", "-s", "WEBFARM_OFFSITE_WAIT=0.3"]


def fetched(web: TestWeb, base: str) -> list[str]:
    return sorted(h.path for h in web.hits_for(host=base) if h.path != "/robots.txt")


def test_seeded_pages_outside_a_worker_s_hosts_wait_for_a_worker_that_takes_them(stores):
    with TestWeb(hosts=HOSTS, categories=1, products_per_category=1) as web:
        mine, other = web.base_urls
        pages = {base: [f"{base}/page-{i}" for i in range(3)] for base in (mine, other)}
        for base, urls in pages.items():
            for url in urls:
                web.route(url[len(base):], Response.html(f"<title>{url}</title>"), host=base)
        env = runner.env_for(**stores, WEBFARM_IDLE_TIMEOUT="2")
        seeded = runner.scrapy(["seed", "generic", *pages[mine], *pages[other]], env, 60)
        assert seeded.returncode == 0, seeded.output[-2000:]

        first = runner.scrapy(["crawl", "generic", "-a", f"domains={mine.split('//')[1]}",
                               *FAST], env, 120)
        assert first.returncode == 0 and "Traceback" not in first.output, first.output[-3000:]
        assert fetched(web, mine) == ["/page-0", "/page-1", "/page-2"]
        assert web.hits_for(host=other) == []
        said = [line for line in first.stderr.splitlines() if "outside this worker's" in line]
        assert len(said) == 1 and f"'{HOSTS[1]}'" in said[0], said  # once per host
        assert "scrapy dlq generic --requeue --reason offsite" in said[0]
        assert crawlcheck.stat(first.stderr, "offsite/filtered") == 6  # 3 pages, 2 tries
        assert crawlcheck.stat(first.stderr, "webfarm/frontier/dead") == 3

        requeued = runner.scrapy(["dlq", "generic", "--requeue", "--reason", "offsite"], env, 60)
        assert "requeued 3 dead letters" in requeued.stdout, requeued.output[-2000:]
        second = runner.scrapy(["crawl", "generic", "-a", f"domains={other.split('//')[1]}",
                                *FAST], env, 120)
        assert second.returncode == 0, second.output[-3000:]
        assert fetched(web, other) == ["/page-0", "/page-1", "/page-2"]
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    assert sorted(d["url"] for d in db.pages.find()) == sorted(pages[mine] + pages[other])


def test_two_generic_crawls_at_once_each_fetch_their_own_pages_only(stores, tmp_path):
    """Each took the other's due host while its own waited out its delay, and gave the
    page back; after WEBFARM_RETRY_TIMES such tries it was a dead letter (58 of 757
    pages with three crawls at once, by hand)."""
    with TestWeb(hosts=HOSTS, categories=1, products_per_category=4) as web:
        env = runner.env_for(**stores, WEBFARM_HOST_DELAY="0.1")
        procs = [runner.popen(["crawl", "generic", "-a", f"start={base}/", "-s",
                               "WEBFARM_RETRY_TIMES=2"], env, tmp_path / f"{i}.log")
                 for i, base in enumerate(web.base_urls)]
        for proc in procs:
            assert proc.wait(timeout=120) == 0
        logs = [(tmp_path / f"{i}.log").read_text() for i in range(2)]
        for base in web.base_urls:
            assert len(fetched(web, base)) > 10
    for log in logs:
        assert "Traceback" not in log and "outside this worker's hosts" not in log, log[-3000:]
        assert crawlcheck.stat(log, "offsite/filtered") == 0
        assert crawlcheck.stat(log, "webfarm/frontier/dead") == 0
        assert crawlcheck.stat(log, "item_scraped_count") > 10


def test_a_host_first_dropped_at_scheduling_is_still_said_when_a_leased_request_goes_back(
        caplog):
    """Scrapy's filter remembers the hosts it logged at DEBUG: a link the spider yielded to
    a host kept the WARNING from being said for that host's frontier requests."""
    from scrapy.exceptions import IgnoreRequest
    from scrapy.http import Request
    from scrapy.utils.test import get_crawler

    from middlewares.offsite import FrontierOffsiteMiddleware
    from spiders.generic import GenericSpider
    from webfarm.exceptions import RetryLater
    from webfarm.queue import LEASE

    crawler = get_crawler(GenericSpider)
    crawler.spider = GenericSpider(domains="mine.test")
    offsite = FrontierOffsiteMiddleware.from_crawler(crawler)
    offsite.spider_opened(crawler.spider)
    with pytest.raises(IgnoreRequest) as dropped:  # yielded by the spider: Scrapy's drop
        offsite.request_scheduled(Request("http://other.test/a"), crawler.spider)
    assert not isinstance(dropped.value, RetryLater)
    leased = Request("http://other.test/b", meta={LEASE: "1"})
    with caplog.at_level("WARNING", logger="middlewares.offsite"), \
            pytest.raises(RetryLater, match="offsite: other.test is outside"):
        offsite.process_request(leased)
    assert [r.message.count("'other.test' is outside") for r in caplog.records] == [1]
    assert offsite.process_request(Request("http://www.mine.test/c", meta={LEASE: "2"})) is None
