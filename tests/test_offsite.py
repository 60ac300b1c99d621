"""Several crawls on one spider's frontier: each worker is handed its own hosts (its
spider's ``allowed_domains``) and stops when they are done, and a request the frontier
hands to a worker whose hosts do not include it goes back, not away. Scrapy's offsite
filter dropped it with a DEBUG line and its lease was acknowledged: URLs seeded outside a
worker's ``-a domains``, or the pages of another ``scrapy crawl generic`` sharing the
spider's frontier, were gone without a trace."""

from __future__ import annotations

import itertools
import json
import time

import pymongo
import pytest
import redis

from tests import crawlcheck, runner
from tests.testweb import Response, TestWeb
from webfarm.frontier import Entry, Frontier

HOSTS = ("127.0.0.17", "127.0.0.18")
FAST = ["-s", "WEBFARM_RETRY_TIMES=2", "-s", "WEBFARM_RETRY_BACKOFF_BASE=0.05",
        "-s", "WEBFARM_RETRY_BACKOFF_MAX=0.1"]


def all_finish(procs: list, timeout: float = 120) -> list[int]:
    """The crawls' exit codes; any still running past ``timeout`` is killed."""
    try:
        return [p.wait(timeout=timeout) for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def fetched(web: TestWeb, base: str) -> list[str]:
    return sorted(h.path for h in web.hits_for(host=base) if h.path != "/robots.txt")


def test_seeded_pages_outside_a_worker_s_hosts_wait_for_a_worker_that_takes_them(stores):
    with TestWeb(hosts=HOSTS, categories=1, products_per_category=1) as web:
        mine, other = web.base_urls
        pages = {base: [f"{base}/page-{i}" for i in range(3)] for base in (mine, other)}
        for base, urls in pages.items():
            for url in urls:
                web.route(url[len(base):], Response.html(f"<title>{url}</title>"), host=base)
        env = runner.env_for(**stores)
        seeded = runner.scrapy(["seed", "generic", *pages[mine], *pages[other]], env, 60)
        assert seeded.returncode == 0, seeded.output[-2000:]

        first = runner.scrapy(["crawl", "generic", "-a", f"domains={mine.split('//')[1]}",
                               *FAST], env, 120)
        assert first.returncode == 0 and "Traceback" not in first.output, first.output[-3000:]
        assert fetched(web, mine) == ["/page-0", "/page-1", "/page-2"]
        # Its own hosts done, the worker stops; the others' pages wait in the frontier
        # (before, it stayed, took each WEBFARM_RETRY_TIMES times and dead-lettered it).
        assert web.hits_for(host=other) == []
        assert "outside this worker's" not in first.output
        assert crawlcheck.stat(first.stderr, "offsite/filtered") == 0
        assert f"Frontier empty for this worker's hosts ({mine.split('//')[1]})" in first.stderr
        assert "This worker's hosts are done; 3 request(s) of other hosts stay" in first.stderr
        waiting = Frontier(redis.Redis.from_url(stores["REDIS_URL"]), "generic").counts()
        assert (waiting["queued"], waiting["hosts"], waiting["dead"]) == (3, 1, 0)

        second = runner.scrapy(["crawl", "generic", "-a", f"domains={other.split('//')[1]}",
                                *FAST], env, 120)
        assert second.returncode == 0, second.output[-3000:]
        assert fetched(web, other) == ["/page-0", "/page-1", "/page-2"]
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    assert sorted(d["url"] for d in db.pages.find()) == sorted(pages[mine] + pages[other])


def test_two_generic_crawls_at_once_each_fetch_their_own_pages_and_end_on_their_own(
        stores, tmp_path):
    """Each took the other's due host while its own waited out its delay, and gave the
    page back; after WEBFARM_RETRY_TIMES such tries it was a dead letter (58 of 757 pages
    with three crawls at once, by hand). And the shorter crawl's worker ran on until the
    longer one ended, as long as the frontier held anything."""
    with TestWeb(hosts=HOSTS, categories=1, products_per_category=2) as web:
        env = runner.env_for(**stores, WEBFARM_HOST_DELAY="0.05")
        # The second crawl's host is paced slower (a host's own delay: the fleet's default
        # is the longest of the workers', so a longer WEBFARM_HOST_DELAY would pace both).
        slow = web.base_urls[1].split("//")[1].split(":")[0]
        slots = ([], ["-s", "DOWNLOAD_SLOTS=" + json.dumps({slow: {"delay": 0.6}})])
        procs = [runner.popen(["crawl", "generic", "-a", f"start={base}/", "-s",
                               "WEBFARM_RETRY_TIMES=2", *extra], env, tmp_path / f"{i}.log")
                 for i, (base, extra) in enumerate(zip(web.base_urls, slots, strict=True))]
        try:
            assert procs[0].wait(timeout=120) == 0
            first_ended = time.monotonic()
            assert procs[1].wait(timeout=120) == 0
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
        logs = [(tmp_path / f"{i}.log").read_text() for i in range(2)]
        for base in web.base_urls:
            assert len(fetched(web, base)) > 5
        # The first worker was gone while the second crawl still fetched.
        assert max(h.monotonic for h in web.hits_for(host=web.base_urls[1])) > first_ended
    for log in logs:
        assert "Traceback" not in log and "outside this worker's hosts" not in log, log[-3000:]
        assert crawlcheck.stat(log, "offsite/filtered") == 0
        assert crawlcheck.stat(log, "webfarm/frontier/dead") == 0
        assert crawlcheck.stat(log, "webfarm/pages/recorded") > 5
        assert "Frontier empty for this worker's hosts" in log


@pytest.mark.parametrize("spider", ["generic", "test_directory"])
def test_a_start_url_outside_the_worker_s_hosts_is_fetched_as_its_own_work(stores, spider):
    """Scrapy fetches a start URL outside allowed_domains (a plain Spider's start requests
    are dont_filter); generic dropped it, and the crawl ended with nothing. The frontier
    must not hold it back as another crawl's host for WEBFARM_OFFSITE_WAIT either, nor the
    worker stop before it is fetched."""
    with TestWeb(hosts=HOSTS, categories=1, products_per_category=1) as web:
        index, site = web.base_urls
        web.route("/list", Response.html(f'<a href="{site}/page-1">1</a>'), host=index)
        web.route("/page-1", Response.html("<title>one</title>"), host=site)
        env = runner.env_for(**stores)
        started = time.monotonic()
        result = runner.scrapy(["crawl", spider, "-a", f"start={index}/list",
                                "-a", f"domains={HOSTS[1]}", "-s",
                                "SPIDER_MODULES=spiders,tests.spiders"], env, 50)
        assert result.returncode == 0, result.output[-3000:]
        assert fetched(web, index) == ["/list"] and fetched(web, site) == ["/page-1"]
        assert time.monotonic() - started < 40  # not after the 60 s wait


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


def test_another_port_of_the_spider_s_host_is_offsite_when_yielded_and_when_leased(caplog):
    """A WebfarmSpider's hosts keep their port. Scrapy's filter compares names: a request
    the spider yielded to another port was queued, and every worker then gave it back
    until it was dead-lettered; now it is dropped before it is queued, as Scrapy drops
    another host's. A leased one goes back, named with its port."""
    from scrapy.exceptions import IgnoreRequest
    from scrapy.http import Request
    from scrapy.utils.test import get_crawler

    from middlewares.offsite import FrontierOffsiteMiddleware
    from spiders.generic import GenericSpider
    from webfarm.exceptions import RetryLater
    from webfarm.queue import LEASE

    crawler = get_crawler(GenericSpider)
    crawler.spider = GenericSpider(start_urls="http://shop.test:8080/")
    offsite = FrontierOffsiteMiddleware.from_crawler(crawler)
    offsite.spider_opened(crawler.spider)
    with pytest.raises(IgnoreRequest) as dropped:
        offsite.request_scheduled(Request("http://shop.test:9090/a"), crawler.spider)
    assert not isinstance(dropped.value, RetryLater)
    assert crawler.stats.get_value("offsite/filtered") == 1
    offsite.request_scheduled(Request("http://shop.test:8080/a"), crawler.spider)
    offsite.request_scheduled(Request("http://shop.test:9090/a", meta={"allow_offsite": True}),
                              crawler.spider)
    leased = Request("http://shop.test:9090/b", meta={LEASE: "1"})
    with caplog.at_level("WARNING", logger="middlewares.offsite"), \
            pytest.raises(RetryLater, match=r"offsite: shop.test:9090 is outside .*"
                                            r"\(shop.test:8080\)"):
        offsite.process_request(leased)
    assert [r.message.count("'shop.test:9090' is outside") for r in caplog.records] == [1]
    assert offsite.process_request(Request("http://shop.test:8080/c", meta={LEASE: "2"})) is None


def test_a_worker_that_fetched_nothing_says_the_frontier_holds_other_hosts(redis_url, caplog):
    """Its -a domains missed the seeded hosts: it stops having fetched nothing, where it
    took them and gave them back, saying so, before."""
    from scrapy.statscollectors import MemoryStatsCollector
    from scrapy.utils.test import get_crawler

    from webfarm.advice import explain_at_close

    frontier = Frontier(redis.Redis.from_url(redis_url), "generic")
    frontier.push([Entry("b.test", 0, b"fp", '{"url": "http://b.test/"}', False)])
    frontier.keep_to(["a.test"], 60)
    assert frontier.is_idle()  # the check counts the other hosts' requests
    stats = MemoryStatsCollector(get_crawler())
    with caplog.at_level("INFO", logger="webfarm.scheduler"):
        explain_at_close(stats, "generic", frontier, 10.2)
    assert (caplog.records[0].levelname, caplog.records[0].getMessage()) == (
        "INFO", "Frontier empty for this worker's hosts (a.test) for 10s: closing this worker")
    assert [r.levelname for r in caplog.records] == ["INFO", "WARNING"]
    assert caplog.records[1].getMessage().startswith(
        "This worker fetched nothing: its hosts (a.test) have nothing queued; 1 request(s) of "
        "other hosts stay in generic's frontier for a worker whose hosts include them")


def test_two_crawls_of_one_host_on_two_ports_each_crawl_all_their_pages(stores, tmp_path):
    """The scrapyd probe: two ``scrapy crawl generic`` of one host name on two ports. Each
    worker took the other's pages as its own (the frontier and the offsite filter compare
    bare host names), fetched them and dropped their links (the spider follows links on
    its hosts, ports included): 106 of 364 pages were never crawled, and nothing said so."""
    with TestWeb(hosts=HOSTS[:1], categories=1, products_per_category=3) as fast, \
            TestWeb(hosts=HOSTS[:1], categories=1, products_per_category=3) as slow:
        def slowly(info):
            time.sleep(0.15)
            return None  # then the shop answers

        slow.route("/", slowly, prefix=True)
        env = runner.env_for(**stores, WEBFARM_HOST_DELAY="0.05")
        procs = [runner.popen(["crawl", "generic", "-a", f"start={web.base_urls[0]}/"], env,
                              tmp_path / f"{i}.log") for i, web in enumerate((fast, slow))]
        assert all_finish(procs) == [0, 0]
        db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
        stored = {d["url"] for d in db.pages.find({}, {"url": 1})}
        for web in (fast, slow):
            base = web.base_urls[0]
            assert web.expected_pages(base) <= stored, sorted(
                web.expected_pages(base) - stored)
    logs = [(tmp_path / f"{i}.log").read_text() for i in range(2)]
    for log in logs:
        assert "Traceback" not in log, log[-3000:]
        assert crawlcheck.stat(log, "webfarm/frontier/dead") == 0


def test_two_spiders_on_one_host_at_once_are_told_their_delays_do_not_add_up(stores,
                                                                             tmp_path):
    """Each spider's frontier keeps a host's delay for its own workers: ``generic`` and
    ``catalogue`` on one shop at once each fetched at the delay, together twice as often
    (a probe: gaps of 3 ms on a host whose spider asked for 2 s), and nothing said so.
    Each worker now warns, naming the other spider; the host only one of them crawls is
    not named."""
    with TestWeb(hosts=HOSTS, categories=1, products_per_category=6) as web:
        shop, own = web.base_urls
        env = runner.env_for(**stores, WEBFARM_HOST_DELAY="0.25", WEBFARM_IDLE_TIMEOUT="1")
        procs = [runner.popen(["crawl", "generic", "-a", f"start={shop}/,{own}/"], env,
                              tmp_path / "generic.log"),
                 runner.popen(["crawl", "catalogue", "-a", f"start={shop}/"], env,
                              tmp_path / "catalogue.log")]
        assert all_finish(procs) == [0, 0]
        gaps = sorted(b.monotonic - a.monotonic for a, b in itertools.pairwise(
            [h for h in web.hits_for(host=shop) if h.path != "/robots.txt"]))
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in ("generic", "catalogue")}
    shop_host, own_host = shop.split("//")[1], own.split("//")[1]
    for name, other in (("generic", "catalogue"), ("catalogue", "generic")):
        log = logs[name]
        assert "Traceback" not in log, log[-3000:]
        said = [line for line in log.splitlines() if "each spider's frontier" in line]
        assert len(said) == 1, said or log[-3000:]
        assert f"{shop_host} is crawled by spider {other!r} too (1 worker(s) now)" in said[0]
        assert own_host not in "\n".join(said)
        assert crawlcheck.stat(log, "webfarm/frontier/shared_hosts") == 1
    # What is said: the two spiders' requests to the shop came closer than the delay.
    assert gaps[0] < 0.25 * 0.5, gaps[:5]
