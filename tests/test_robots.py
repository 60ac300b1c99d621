"""robots.txt per RFC 9309 against the real test web: every claim measured at the server."""

from __future__ import annotations

import random
import re
import threading
import time

import pymongo
import pytest
import redis
from scrapy.settings import Settings

from tests import crawlcheck, runner, servers
from tests.crawlcheck import frontier as frontier_of
from tests.testweb import Response
from webfarm.robots import (
    MAX_BYTES,
    Fetched,
    Record,
    RobotsRules,
    classify,
    next_record,
    origin_of,
    product_token,
    robots_agent,
    robots_text,
    verdict,
)

UA = "mybot/2.0 (+https://example.org/bot)"
PLACEHOLDER_HINT = "set WEBFARM_USER_AGENT"


# -- the rule table, without a network -----------------------------------------------------

@pytest.mark.parametrize("status, kind", [
    (200, "parse"), (204, "parse"), (301, "redirect"), (308, "redirect"), (400, "allow"),
    (401, "allow"), (403, "allow"), (404, "allow"), (410, "allow"), (429, "unreachable"),
    (500, "unreachable"), (503, "unreachable"), (599, "unreachable"), (999, "unreachable"),
    (100, "unreachable"),
])
def test_status_table(status, kind):
    assert classify(status) == kind


@pytest.mark.parametrize("agent, token", [
    ("webfarm/0.1 (+https://example.invalid/x)", "webfarm"),
    ("AcmeBot/1.0", "acmebot"), ("my_crawler-x 2.0", "my_crawler-x"), ("  /1.0", "webfarm"),
])
def test_product_token(agent, token):
    assert product_token(agent) == token


def test_robots_agent_from_settings():
    assert robots_agent(Settings({"USER_AGENT": UA})) == "mybot"
    assert robots_agent(Settings({"USER_AGENT": UA, "WEBFARM_ROBOTS_AGENT": "OtherBot"})) == (
        "otherbot")


def test_an_agent_with_the_placeholder_s_contact_url_is_told_so(monkeypatch, caplog):
    """The scrapyd re-probe's agent 'hp3-probe/1.0 (+https://example.invalid/bot)' was
    said to be "the placeholder", which it was not: only its contact URL was."""
    import webfarm.robots as robots

    placeholder = "webfarm/0.1 (+https://example.invalid/x)"
    for agent, said in ((UA.replace("example.org", "example.invalid"), "contact URL"),
                        (placeholder, "is the placeholder")):
        monkeypatch.setattr(robots, "_placeholder_warned", False)
        caplog.clear()
        robots.warn_placeholder_user_agent(Settings({
            "USER_AGENT": agent, "WEBFARM_USER_AGENT_PLACEHOLDER": placeholder}))
        assert said in caplog.text and PLACEHOLDER_HINT in caplog.text, caplog.text


def test_rules_from_hostile_bodies():
    rules = RobotsRules.parse(b"\xef\xbb\xbfUser-agent: *\nDisallow: /private/\n")  # BOM
    assert not rules.allowed("http://h/private/x", "webfarm")
    assert rules.allowed("http://h/public", "webfarm")
    garbage = bytes(random.Random(4).randrange(256) for _ in range(50_000))
    assert RobotsRules.parse(garbage).allowed("http://h/any", "webfarm")
    latin1 = "User-agent: *\nDisallow: /caf\xe9/\nCrawl-delay: nan\n".encode("latin-1")
    rules = RobotsRules.parse(latin1)
    assert rules.allowed("http://h/other", "webfarm") and rules.crawl_delay("webfarm") is None
    big = b"User-agent: *\nDisallow: /a/\n" + b"#" * MAX_BYTES + b"\nDisallow: /b/\n"
    text, cut = robots_text(big)
    assert cut and len(text.encode()) <= MAX_BYTES
    rules = RobotsRules.parse(big)
    assert not rules.allowed("http://h/a/1", "webfarm") and rules.allowed("http://h/b/1", "x")


def test_group_of_our_token_wins():
    rules = RobotsRules.parse(b"User-agent: *\nDisallow: /\nCrawl-delay: 9\n\n"
                              b"User-agent: webfarm\nDisallow: /private/\nCrawl-delay: 2.5\n")
    assert rules.allowed("http://h/page", "webfarm")
    assert not rules.allowed("http://h/private/1", "webfarm")
    assert not rules.allowed("http://h/page", "otherbot")
    assert rules.crawl_delay("webfarm") == 2.5 and rules.crawl_delay("otherbot") == 9


def test_shared_record_round_trip_and_junk():
    rec = Record("unreachable", 10.5, 9.0, 503, error="HTTP 503", good="parsed",
                 body=b"User-agent: *\n", good_at=1.0, since=9.0)
    raw = {k.encode(): v if isinstance(v, bytes) else v.encode()
           for k, v in rec.to_mapping().items()}
    assert Record.from_mapping(raw) == rec
    assert Record.from_mapping({b"state": b"exec(evil)"}) is None
    assert Record.from_mapping({b"state": b"parsed", b"expires": b"inf"}) is None
    assert origin_of("HTTPS://Example.COM:443/a?b") == "https://example.com"
    assert origin_of("http://127.0.0.2:8080/x") == "http://127.0.0.2:8080"


def test_outage_keeps_the_last_good_copy_then_may_allow():
    day = 86400.0
    good = next_record(Fetched("parse", 200, b"User-agent: *\nDisallow: /x\n"), None, 0.0,
                       day, 300)
    assert verdict(good, 10.0, 2 * day, 30 * day) == "parsed" and good.expires == day
    down = next_record(Fetched("unreachable", 503), good, day + 1, day, 300)
    assert down.body == good.body and down.since == day + 1 and down.expires == day + 301
    assert verdict(down, day + 2, 2 * day, 30 * day) == "stale"  # RFC 9309 2.4
    later = next_record(Fetched("unreachable", error="TimeoutError"), down, 3 * day, day, 300)
    assert later.since == day + 1  # the outage goes on
    assert verdict(later, 3 * day, 2 * day, 30 * day) == "unreachable"  # copy too old now
    fresh = next_record(Fetched("unreachable", 500), None, 0.0, day, 300)
    assert verdict(fresh, 100.0, 2 * day, 30 * day) == "unreachable"
    assert verdict(fresh, 31 * day, 2 * day, 30 * day) == "outage-allow"
    assert verdict(fresh, 31 * day, 2 * day, 0) == "unreachable"  # 0: never allow
    gone = next_record(Fetched("allow", 404), None, 0.0, day, 300)
    assert verdict(gone, 1.0, 2 * day, 0) == "allow"


def test_redis_down_means_fetch_it_yourself_never_allowed(caplog):
    """The shared cache with no Redis behind it (the crawl's asyncio client): no copy, the
    lock granted (this worker fetches robots.txt itself, then obeys it), nothing raised,
    and one logged line for the whole outage."""
    import asyncio

    import redis.asyncio

    from webfarm.redisconn import CLIENT_OPTIONS, close_client
    from webfarm.robotscache import SharedRobotsCache

    async def run() -> tuple:
        client = redis.asyncio.Redis.from_url(f"redis://127.0.0.1:{servers.free_port()}",
                                              **CLIENT_OPTIONS)
        cache = SharedRobotsCache(client, "spider", lock_seconds=60, keep_seconds=60)
        try:
            record = next_record(Fetched("parse", 200, b"User-agent: *\nDisallow: /\n"),
                                 None, time.time(), 3600, 300)
            got = (await cache.read("http://a.test"), await cache.lock("http://a.test", "t"))
            await cache.write("http://a.test", record)
            await cache.unlock("http://a.test", "t")
            return got
        finally:
            await close_client(cache.server)

    assert asyncio.run(run()) == (None, True)
    lines = [r for r in caplog.records if "shared robots.txt cache" in r.getMessage()]
    assert len(lines) == 1 and "fetches robots.txt itself" in lines[0].getMessage()


# -- crawls ----------------------------------------------------------------------------------

def env(stores, **extra):
    values = runner.env_for(**stores, WEBFARM_RENDER="http", **extra)
    if "WEBFARM_USER_AGENT" not in extra:
        values.pop("WEBFARM_USER_AGENT", None)
    return values


def netloc(base: str) -> str:
    return base.split("//", 1)[1]


def mini_site(web, base: str, pages: int = 3, private: int = 2) -> list[str]:
    """A home page linking /page/N and /private/N, on ``base`` only. Returns every URL."""
    paths = [f"/page/{i}" for i in range(pages)] + [f"/private/{i}" for i in range(private)]
    links = "".join(f'<p><a href="{p}">link to {p}</a></p>' for p in paths)
    home = f"<html><head><title>mini</title></head><body><h1>Mini</h1>{links}</body></html>"
    web.route("/", Response.html(home), host=base, prefix=False)

    def page(info):
        return Response.html(f"<html><body><h1>{info.path}</h1><p>A plain page.</p></body>"
                             "</html>")

    web.route("/page/", page, host=base)
    web.route("/private/", page, host=base)
    return [f"{base}/"] + [base + p for p in paths]


def crawl_args(starts: list[str], *settings: str) -> list[str]:
    args = ["crawl", "generic", "-a", "start=" + ",".join(starts)]
    for s in settings:
        args += ["-s", s]
    return args


def run(args, environment, timeout=90):
    result = runner.scrapy(args, environment, timeout)
    assert result.returncode == 0, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    return result


def paths_hit(web, base: str, prefix: str) -> list[str]:
    return [h.path for h in web.hits_for(host=base) if h.path.startswith(prefix)]


def stat(output: str, name: str) -> int:
    found = re.findall(rf"'{re.escape(name)}': (\d+)", output)
    return sum(int(n) for n in found)


def stored_urls(stores) -> set[str]:
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    return {doc["url"] for doc in db.pages.find()}


def test_disallowed_never_fetched_even_by_the_first_burst_of_two_workers(web, stores, tmp_path):
    base = web.base_urls[0]
    urls = mini_site(web, base, pages=3, private=4)
    robots = ("User-agent: otherbot\nDisallow: /\n\n"
              "User-agent: mybot\nDisallow: /private/\n")
    release = threading.Event()

    def slow_robots(info):
        release.wait(30)  # every request of both workers is in flight while this is fetched
        return Response.text(robots)

    web.route("/robots.txt", slow_robots, host=base)
    # A 1 s lock, renewed by a's fetch however long it is out: b never fetches it too.
    environment = env(stores, WEBFARM_USER_AGENT=UA, WEBFARM_IDLE_TIMEOUT="2",
                      WEBFARM_CONCURRENT_REQUESTS="3", WEBFARM_ROBOTS_LOCK_SECONDS="1")
    # Private URLs are seeds: they are popped at once, before robots.txt is known.
    starts = [u for u in urls if "/private/" in u] + [u for u in urls if "/private/" not in u]
    frontier = frontier_of(stores["REDIS_URL"])
    procs = [runner.popen(crawl_args(starts), environment, tmp_path / "a.log")]
    try:
        servers.wait_for(lambda: web.hits_for(host=base, path="/robots.txt"), 60,
                         "worker a fetching robots.txt")
        procs.append(runner.popen(crawl_args(starts), environment, tmp_path / "b.log"))
        # Worker b took requests of the same host while a's robots.txt fetch is pending
        # (counting leases let worker a alone pass when b was slow to start).
        pid_b = f":{procs[1].pid}:"
        servers.wait_for(lambda: any(pid_b in w for w in frontier.leases_by_worker()), 60,
                         "worker b leasing")
        release.set()
        assert [p.wait(90) for p in procs] == [0, 0]
    finally:
        release.set()
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = [(tmp_path / f"{n}.log").read_text() for n in ("a", "b")]
    for log in logs:
        assert "Traceback" not in log, log[-3000:]
        assert PLACEHOLDER_HINT not in log

    assert paths_hit(web, base, "/private/") == []
    assert sorted(set(paths_hit(web, base, "/page/"))) == ["/page/0", "/page/1", "/page/2"]
    assert len(web.hits_for(host=base, path="/robots.txt")) == 1  # one fetch for both workers
    assert {h.headers.get("user-agent") for h in web.hits_for(host=base)} == {UA}
    assert stat(logs[0] + logs[1], "webfarm/robots/disallowed") >= 4
    assert stat(logs[0], "webfarm/robots/waited") >= 1  # a's other requests waited on its fetch
    assert stat(logs[1], "webfarm/robots/waited_other_worker") >= 1  # b waited for a's
    assert stored_urls(stores) == {u for u in urls if "/private/" not in u}
    assert frontier.counts()["dead"] == 0 and frontier.is_idle()  # acked, not dead letters
    cached = redis.Redis.from_url(stores["REDIS_URL"]).hgetall(
        f"webfarm:{{generic}}:robots:http://{netloc(base)}")
    assert cached[b"state"] == b"parsed" and cached[b"body"] == robots.encode()


def slow_robots_site(web, base: str, seconds: float) -> list[str]:
    """A mini site of 4 pages whose robots.txt takes ``seconds`` to answer."""
    urls = mini_site(web, base, pages=4, private=0)

    def slow_robots(info):
        time.sleep(seconds)
        return Response.text("User-agent: *\nDisallow: /private/\n")

    web.route("/robots.txt", slow_robots, host=base)
    return urls


@pytest.mark.serial
def test_requests_held_for_a_slow_robots_txt_keep_the_host_delay(web, stores):
    """While robots.txt took its time, the frontier handed the host's pages out one per
    WEBFARM_HOST_DELAY, and the worker held them all: they went out at once when it
    answered (only a Crawl-delay spaced them again)."""
    base = web.base_urls[1]
    urls = slow_robots_site(web, base, 1.5)
    result = runner.scrapy(crawl_args(urls[1:]), env(stores, WEBFARM_HOST_DELAY="0.4",
                                                     WEBFARM_AUTOTHROTTLE="False"), 120)
    assert result.returncode == 0, result.output[-3000:]
    hits = sorted(h.monotonic for h in web.hits_for(host=base) if h.path != "/robots.txt")
    gaps = [b - a for a, b in zip(hits, hits[1:], strict=False)]
    assert len(hits) >= 4 and min(gaps) >= 0.4 * 0.75, gaps
    assert stat(result.output, "webfarm/robots/spaced") >= 1
    assert stat(result.output, "webfarm/frontier/given_back") >= 1  # no attempt spent


def test_a_start_url_robots_txt_disallows_is_said(web, stores):
    """The crawl ended with nothing fetched and only webfarm/robots/disallowed to say why."""
    base = web.base_urls[1]
    web.route("/robots.txt", Response.text("User-agent: *\nDisallow: /shut/\n"), host=base)
    result = run(crawl_args([f"{base}/shut/door"]), env(stores))
    said = [line for line in result.output.splitlines() if "Forbidden by robots.txt" in line]
    assert len(said) == 1 and "WARNING" in said[0] and f"{base}/shut/door> is a start URL" in \
        said[0] and "user agent 'webfarm'" in said[0], said
    assert [h.path for h in web.hits_for(host=base)] == ["/robots.txt"]


@pytest.mark.serial
def test_links_robots_txt_disallows_spend_no_turn_of_their_host(web, stores):
    """Each disallowed link was queued, handed out, and refused at download: no request,
    but its host's turn was spent, and a site linking a disallowed URL between every two
    pages was crawled at half speed (1 s gaps at a 0.5 s delay)."""
    base = web.base_urls[1]
    paths = [p for i in range(4) for p in (f"/page/{i}", f"/private/{i}")]
    links = "".join(f'<p><a href="{p}">{p}</a></p>' for p in paths)
    web.route("/", Response.html(f"<html><body>{links}</body></html>"), host=base,
              prefix=False)
    for prefix in ("/page/", "/private/"):
        web.route(prefix, lambda info: Response.html(f"<html><body>{info.path}</body></html>"),
                  host=base)
    web.route("/robots.txt", Response.text("User-agent: *\nDisallow: /private/\n"), host=base)
    result = run(crawl_args([f"{base}/"]), env(stores, WEBFARM_HOST_DELAY="0.5",
                                                WEBFARM_AUTOTHROTTLE="False"))
    hits = sorted(web.hits_for(host=base), key=lambda h: h.monotonic)
    assert [h.path for h in hits if h.path.startswith("/private/")] == []
    assert len(hits) == 6  # robots.txt, the home page and its four allowed links
    gaps = [b.monotonic - a.monotonic for a, b in zip(hits, hits[1:], strict=False)]
    assert min(gaps) >= 0.5 * 0.75 and max(gaps) < 0.5 * 1.6, gaps
    assert stat(result.output, "webfarm/frontier/robots_disallowed") == 4


@pytest.mark.serial
def test_two_workers_keep_the_host_delay_after_a_slow_robots_txt(web, stores, tmp_path):
    """The host's clock started at each hand-out, not when the request left: the first
    page left when robots.txt came, long after its hand-out, and the page the other worker
    held (given back, handed out again at once: its turn was long due) reached the host
    0.05 s later, where the delay was 1.5 s. Both go back to the frontier now, and the
    first page reaches the host a delay after robots.txt."""
    base = web.base_urls[1]
    urls = slow_robots_site(web, base, 2.0)
    environment = env(stores, WEBFARM_HOST_DELAY="0.8", WEBFARM_AUTOTHROTTLE="False")
    procs = [runner.popen(crawl_args(urls[1:]), environment, tmp_path / f"{n}.log")
             for n in "ab"]
    assert [p.wait(120) for p in procs] == [0, 0]
    hits = sorted(h.monotonic for h in web.hits_for(host=base))
    gaps = [b - a for a, b in zip(hits, hits[1:], strict=False)]
    assert len(hits) == 5 and min(gaps) >= 0.8 * 0.75, gaps  # robots.txt and 4 pages
    logs = "".join((tmp_path / f"{n}.log").read_text() for n in "ab")
    assert "Traceback" not in logs, logs[-3000:]
    assert stat(logs, "webfarm/robots/spaced") >= 2  # the fetcher's page and the other's


@pytest.mark.serial
def test_a_request_held_in_the_worker_takes_its_host_s_turn_as_it_leaves(web, stores):
    """The frontier spaces a host's hand-outs; a request held in the worker after its
    hand-out (here 1.2 s, by a test middleware) reached the host just before the next
    hand-out, 0.1 s apart where the delay was 0.6 s. It takes the host's turn as it leaves."""
    base = web.base_urls[1]
    urls = mini_site(web, base, pages=3, private=0)
    web.route("/robots.txt", Response.text("", status=404), host=base)
    result = run(crawl_args(
        urls[1:], 'DOWNLOADER_MIDDLEWARES={"tests.holding.HoldFirst": 500}',
        "TEST_HOLD_SECONDS=1.2"), env(stores, WEBFARM_HOST_DELAY="0.6",
                                      WEBFARM_AUTOTHROTTLE="False"))
    hits = sorted(h.monotonic for h in web.hits_for(host=base))
    gaps = [b - a for a, b in zip(hits, hits[1:], strict=False)]
    assert len(hits) == 4 and min(gaps) >= 0.6 * 0.75, gaps  # robots.txt and 3 pages
    assert stat(result.output, "webfarm/frontier/late_departures") >= 1


def test_robots_500_holds_every_request_until_it_heals_404_allows_all(web, stores, tmp_path):
    base, absent = web.base_urls
    urls = mini_site(web, base, pages=3, private=2)
    absent_urls = mini_site(web, absent)
    web.route("/robots.txt", Response.text("not here", status=404), host=absent)
    healed = threading.Event()

    def robots(info):
        if healed.is_set():
            return Response.text("User-agent: *\nDisallow: /private/\n")
        if len(web.hits_for(host=base, path="/robots.txt")) % 2:
            # Every other try, a file that cannot be read: unreachable too, not a reason
            # to dead-letter the host's pages (as the SSRF guard's refusal is).
            return Response(200, {"Content-Type": "text/plain", "Content-Encoding": "gzip"},
                            b"not gzip")
        return Response.text("down for maintenance", status=500)

    web.route("/robots.txt", robots, host=base)
    environment = env(stores)
    proc = runner.popen(crawl_args(urls + [f"{absent}/"], "WEBFARM_ROBOTS_RETRY_DELAY=1.5"),
                        environment, tmp_path / "w.log")
    try:
        frontier = frontier_of(stores["REDIS_URL"])
        # Longer than WEBFARM_RETRY_TIMES (5) rounds of robots.txt attempts: requests that
        # spent an attempt per round would be dead letters by now.
        servers.wait_for(lambda: len(web.hits_for(host=base, path="/robots.txt")) >= 6
                         and len(web.hits_for(host=absent)) > len(absent_urls), 40,
                         "six robots.txt attempts and the other host crawled")
        # Every request of the host is still in the frontier (queued behind the deferred
        # host, delayed, or leased), none lost or dead, and they went back as retries.
        def held() -> bool:
            c = frontier.counts()
            return c["delayed"] + c["queued"] + c["leased"] == len(urls)

        servers.wait_for(held, 10, "only the held host's requests left in the frontier")
        counts = frontier.counts()
        assert counts["retried"] >= 1 and counts["dead"] == 0, counts
        assert [h for h in web.hits_for(host=base) if h.path != "/robots.txt"] == []
        healed_at = time.monotonic()
        healed.set()
        assert proc.wait(90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "w.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    pages = [h for h in web.hits_for(host=base) if h.path != "/robots.txt"]
    assert pages and min(h.monotonic for h in pages) > healed_at
    assert paths_hit(web, base, "/private/") == []
    assert stored_urls(stores) == {u for u in urls if "/private/" not in u} | set(absent_urls)
    assert frontier.counts()["dead"] == 0 and frontier.is_idle()
    assert stat(log, "webfarm/robots/retry_later") >= 1
    assert stat(log, "webfarm/robots/rechecks") >= 5  # re-fetched in the background
    # robots.txt 404: everything of that host was fetched, private pages included.
    assert sorted(h.path for h in web.hits_for(host=absent) if h.path != "/robots.txt") == sorted(
        u.removeprefix(absent) for u in absent_urls)
    assert stat(log, "webfarm/robots/outcome/allow") == 1
    # No WEBFARM_USER_AGENT: one warning saying how to set it.
    warnings = [line for line in log.splitlines() if PLACEHOLDER_HINT in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], warnings


def test_a_robots_txt_that_times_out_for_a_while_loses_no_page(web, stores):
    """A probe: a robots.txt slower than DOWNLOAD_TIMEOUT had its host's pages
    dead-lettered. Each re-check outlasted the host's hold, the pages popped meanwhile
    waited for it, and each went back spending an attempt. Those popped while an outage
    goes on now spend none."""
    base = web.base_urls[0]
    urls = mini_site(web, base, pages=3, private=0)
    tries: list[float] = []

    def robots(info):
        tries.append(time.monotonic())
        if len(tries) <= 2:
            time.sleep(5)  # past DOWNLOAD_TIMEOUT: a timeout, twice
        return Response.text("User-agent: *\nDisallow: /private/\n")

    web.route("/robots.txt", robots, host=base)
    result = run(crawl_args(urls, "DOWNLOAD_TIMEOUT=4", "WEBFARM_ROBOTS_RETRY_DELAY=1",
                            "WEBFARM_RETRY_TIMES=2"), env(stores), timeout=90)
    assert len(tries) == 3
    assert crawlcheck.dead_letters(stores["REDIS_URL"]) == {}
    assert stored_urls(stores) == set(urls)
    assert stat(result.output, "webfarm/robots/retry_later") >= 2


def redirect_chain(web, base: str, hops: int, final: str) -> None:
    """/robots.txt -> /r/1 -> ... -> /r/<hops>, which serves ``final``."""
    web.route("/robots.txt", Response(301, {"Location": "/r/1"}), host=base)

    def hop(info):
        n = int(info.path.rsplit("/", 1)[1])
        if n >= hops:
            return Response.text(final)
        return Response(302, {"Location": f"{base}/r/{n + 1}"})

    web.route("/r/", hop, host=base)


def test_redirects_five_followed_six_mean_unavailable(web, stores):
    five, six = web.base_urls
    rules = "User-agent: *\nDisallow: /private/\n"
    redirect_chain(web, five, 5, rules)
    redirect_chain(web, six, 6, rules)
    urls = mini_site(web, five) + mini_site(web, six)
    run(crawl_args(urls), env(stores))
    # Reached within five redirects: obeyed for the first origin.
    assert paths_hit(web, five, "/private/") == []
    assert len(paths_hit(web, five, "/r/")) == 5
    # A sixth redirect: not followed, robots.txt "unavailable", so everything is allowed.
    assert paths_hit(web, six, "/r/") == [f"/r/{n}" for n in range(1, 6)]
    assert sorted(set(paths_hit(web, six, "/private/"))) == ["/private/0", "/private/1"]


def test_robots_txt_redirects_the_crawl_cannot_follow(web, stores):
    """A probe: a robots.txt redirecting to a private address, or to a port past 65535,
    held its host as an outage for 30 days: no page fetched, none dead-lettered, and a
    traceback at every try for the port. The SSRF guard's refusal dead-letters the pages
    with its reason, as for the origin itself; a redirect no crawler can follow (a port
    past 65535, ``ftp:``) means "unavailable", allow all, as a sixth redirect does."""
    guarded, odd = web.base_urls
    web.route("/robots.txt", Response(301, {"Location": "http://127.0.0.1:9/robots.txt"}),
              host=guarded)
    bad_port = f"http://{netloc(odd).split(':')[0]}:99999/robots.txt"
    web.route("/robots.txt", Response(301, {"Location": bad_port}), host=odd)
    urls = mini_site(web, guarded, pages=1, private=0) + mini_site(web, odd)
    allowed = ",".join(f"{netloc(b).split(':')[0]}/32" for b in web.base_urls)
    result = run(crawl_args(urls), env(stores, WEBFARM_ALLOWED_NETWORKS=allowed,
                                      WEBFARM_ROBOTS_RETRY_DELAY="1"), timeout=60)
    letters = crawlcheck.dead_letters(stores["REDIS_URL"])
    assert set(letters) == {u for u in urls if u.startswith(guarded)}, letters
    assert all(letter["reason"].startswith(
        "robots.txt redirects to http://127.0.0.1:9/robots.txt, refused: ssrf: loopback "
        "address 127.0.0.1") for letter in letters.values()), letters
    assert [h.path for h in web.hits_for(host=guarded)] == ["/robots.txt"]
    assert stored_urls(stores) == {u for u in urls if u.startswith(odd)}  # allow all
    assert (f"redirects to '{bad_port}', which cannot be followed (port out of range "
            "0-65535)") in result.output


def test_huge_and_garbage_robots_txt(web, stores):
    big, junk = web.base_urls
    # Past 8 x 500 KiB, sent with its Content-Length: the download was cancelled before a
    # byte, robots.txt "unreachable" and its host held for good (a probe's 14.6 MB file).
    filler = "".join(f"# filler line {i:06d} " + "x" * 80 + "\n" for i in range(45_000))
    body = ("User-agent: *\nDisallow: /private/\n" + filler).encode()
    body += "Disallow: /caf\xe9/\n".encode("latin-1") + b"\x00\xff\xfe" * 100
    assert len(body) > 8 * MAX_BYTES
    body += b"\nDisallow: /page/\n"  # beyond the 500 KiB limit: must be ignored
    web.route("/robots.txt", Response(200, {"Content-Type": "text/plain"}, body), host=big)
    garbage = bytes(random.Random(7).randrange(256) for _ in range(20_000))
    web.route("/robots.txt", Response(200, {"Content-Type": "text/plain; charset=utf-16"},
                                      garbage), host=junk)
    urls = mini_site(web, big) + mini_site(web, junk)
    result = run(crawl_args(urls), env(stores))
    assert paths_hit(web, big, "/private/") == []
    assert sorted(set(paths_hit(web, big, "/page/"))) == ["/page/0", "/page/1", "/page/2"]
    assert sorted(set(paths_hit(web, junk, "/private/"))) == ["/private/0", "/private/1"]
    assert stat(result.output, "webfarm/robots/truncated") == 1


@pytest.mark.serial
def test_crawl_delay_at_the_server(web, stores):
    chosen, capped = web.base_urls
    web.route("/robots.txt", Response.text("User-agent: *\nCrawl-delay: 30\n\n"
                                           "User-agent: webfarm\nCrawl-delay: 0.8\n"),
              host=chosen)
    web.route("/robots.txt", Response.text("User-agent: *\nCrawl-delay: 600\n"), host=capped)
    urls = mini_site(web, chosen, pages=4, private=0) + mini_site(web, capped, pages=4,
                                                                    private=0)
    result = run(crawl_args(urls, "WEBFARM_MAX_CRAWL_DELAY=1.2"), env(stores))
    for base, delay in ((chosen, 0.8), (capped, 1.2)):
        # robots.txt is a request to the host too: the first page went right after it.
        times = sorted(h.monotonic for h in web.hits_for(host=base))
        assert len(times) == 6
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert min(gaps) >= delay * 0.85, (base, gaps)
    capped_lines = [ln for ln in result.output.splitlines() if "Crawl-delay 600" in ln]
    assert capped_lines and "capped" in capped_lines[0] and netloc(capped) in capped_lines[0]


def test_a_host_that_does_not_answer_ends_in_dead_letters_and_the_crawl_ends(web, stores):
    """Nothing listens: its robots.txt is unreachable (RFC 9309: disallow all), and its
    pages were held in the frontier without spending attempts, re-checked for 30 days:
    the crawl never ended and no errback ran. Now they are retried at robots.txt's pace,
    never fetched, and dead-lettered; the other host is crawled meanwhile."""
    base = web.base_urls[0]
    urls = mini_site(web, base, pages=2)
    dead = f"http://127.0.0.9:{servers.free_port('127.0.0.9')}"
    started = time.monotonic()
    result = run(crawl_args([f"{dead}/a", *urls], "WEBFARM_ROBOTS_RETRY_DELAY=1",
                            "WEBFARM_RETRY_TIMES=2", "WEBFARM_RETRY_BACKOFF_BASE=0.1"),
                 env(stores), timeout=60)
    assert time.monotonic() - started < 45
    letters = crawlcheck.dead_letters(stores["REDIS_URL"])
    assert list(letters) == [f"{dead}/a"], letters
    assert letters[f"{dead}/a"]["reason"].startswith(
        "gave up after 2 attempts: robots.txt unavailable: the host does not answer "
        "(DownloadConnectionRefusedError")
    assert stored_urls(stores) >= set(urls)
    assert stat(result.output, "webfarm/robots/host_absent") == 2
