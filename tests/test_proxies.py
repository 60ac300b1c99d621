"""Proxy rotation: parsing, shared health in Redis, and real crawls through real proxies."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from typing import Any

import pymongo
import pytest
import redis
from scrapy import Request
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler
from twisted.internet.error import ConnectionRefusedError as TxConnectionRefused

from middlewares.proxies import ProxyMiddleware
from settings import base as base_settings  # noqa: E402
from tests import runner, servers
from tests.proxyserver import BAN_MARKER, ProxyServer
from tests.relay import Relay
from webfarm import serialize
from webfarm.exceptions import RetryLater
from webfarm.proxies import ProxyPool
from webfarm.proxyconfig import ProxyConfigError, parse_proxies

SECRET = "s3cr3t-Pa55"  # must never show up in logs, stats, Redis or MongoDB
MW = "middlewares.proxies.ProxyMiddleware"


# --- parsing ----------------------------------------------------------------------------------


def test_ids_never_hold_credentials():
    proxies = parse_proxies(
        f"http://alice:{SECRET}@10.0.0.1:8080, 10.0.0.2:3128\n"
        f"http://bob:{SECRET}@gw.example:8000 http://carol:{SECRET}@gw.example:8000#eu-1 "
        "https://gw2.example"
    )
    assert [p.id for p in proxies] == ["10.0.0.1:8080", "10.0.0.2:3128", "gw.example:8000/1",
                                       "eu-1", "gw2.example:443"]
    alice = proxies[0]
    assert alice.url == f"http://alice:{SECRET}@10.0.0.1:8080"
    assert alice.server == "http://10.0.0.1:8080"
    assert SECRET not in repr(alice) and SECRET not in str(alice)
    assert proxies[1].url == "http://10.0.0.2:3128" and proxies[1].username is None
    assert alice.playwright_proxy("<-loopback>") == {
        "server": "http://10.0.0.1:8080", "username": "alice", "password": SECRET,
        "bypass": "<-loopback>"}


def test_percent_encoded_password_round_trips():
    (proxy,) = parse_proxies("http://u%40corp:p%3Aw%2Fd@127.0.0.1:9")
    assert (proxy.username, proxy.password) == ("u@corp", "p:w/d")
    assert proxy.url == "http://u%40corp:p%3Aw%2Fd@127.0.0.1:9"  # as Scrapy expects it


def test_file_of_proxies(tmp_path):
    path = tmp_path / "proxies.txt"
    path.write_text(f"# our pool\nhttp://u:{SECRET}@127.0.0.1:1001  # first\n\n"
                    "127.0.0.1:1002#spare\n")
    assert [p.id for p in parse_proxies(str(path))] == ["127.0.0.1:1001", "spare"]
    assert [p.id for p in parse_proxies(path.as_uri())] == ["127.0.0.1:1001", "spare"]
    assert parse_proxies("") == [] and parse_proxies(None) == []


@pytest.mark.parametrize("value, expected", [
    (f"127.0.0.1:1, ftp://u:{SECRET}@h.example:21", "entry 2 (h.example:21): scheme 'ftp'"),
    (f"socks5://u:{SECRET}@h.example:1080", "SOCKS is not supported"),
    (f"http://u:{SECRET}@h.example:99999", "entry 1 (h.example:99999): not a URL"),
    (f"http://u:{SECRET}@h.example:80/path", "no path or query"),
    (f"http://:{SECRET}@h.example:80", "userinfo without a user name"),
    (f"http://u:{SECRET}@h.example:80,http://u:{SECRET}@h.example:80", "listed twice"),
    ("/nonexistent/proxies.txt", "cannot read the proxy file"),
])
def test_bad_entries_name_the_entry_not_the_secret(value, expected):
    with pytest.raises(ProxyConfigError) as info:
        parse_proxies(value)
    message = str(info.value)
    assert expected in message and message.startswith("WEBFARM_PROXIES")
    assert SECRET not in message


@pytest.mark.parametrize("password", ["s3cr,et9x", "s3cr et9x", "s3cr#et9x@x"])
def test_a_password_with_a_separator_or_hash_is_refused_without_a_piece_of_it(password):
    """',' and ' ' split the list inside the password and the first half was named in the
    message ("entry 1 (alice:s3cr)"); '#' began the proxy's name, so the rest of the
    password became its id (in logs, stats, Redis keys) and the worker connected to the
    user name as a host."""
    with pytest.raises(ProxyConfigError) as info:
        parse_proxies(f"http://alice:{password}@127.0.0.1:3129")
    message = str(info.value)
    assert "write ',' as %2C, a space as %20, '#' as %23" in message, message
    for piece in ("s3cr", "et9x"):
        assert piece not in message, message
    encoded = password.replace(",", "%2C").replace(" ", "%20").replace("#", "%23")
    [proxy] = parse_proxies(f"http://alice:{encoded.replace('@', '%40')}@127.0.0.1:3129")
    assert proxy.password == password and proxy.id == "127.0.0.1:3129"


# --- shared health: pools and middlewares on one real Redis ----------------------------------


_LOOP = asyncio.new_event_loop()  # one loop: a redis.asyncio client stays on the loop it met


def run(call):
    """The pool's and the middleware's coroutines, run to their end."""
    return _LOOP.run_until_complete(call)


def make_pool(redis_url, proxies, **kwargs):
    kwargs.setdefault("refresh", 0.0)
    return ProxyPool(parse_proxies(proxies), redis.Redis.from_url(redis_url), **kwargs)


def test_backoff_grows_caps_and_retires(redis_url):
    clock = [1000.0]
    pool = make_pool(redis_url, "127.0.0.1:1,127.0.0.1:2", base=10, cap=25, max_failures=4,
                     clock=lambda: clock[0])
    expected_delays = [10, 20, 25]
    for n, delay in enumerate(expected_delays, 1):
        counted, state = run(pool.record_failure("127.0.0.1:1", "ban status 403", clock[0]))
        assert counted and state.failures == n and not state.retired
        assert state.cooldown_until == pytest.approx(clock[0] + delay)
        assert pool.healthy_ids() == ["127.0.0.1:2"]
        # A request sent before this incident fails too: same incident, not counted again.
        assert run(pool.record_failure("127.0.0.1:1", "late", clock[0] - 1))[0] is False
        clock[0] += delay
        assert pool.healthy_ids() == ["127.0.0.1:1", "127.0.0.1:2"]
    counted, state = run(pool.record_failure("127.0.0.1:1", "refused", clock[0]))
    assert counted and state.retired
    clock[0] += 10_000
    assert pool.healthy_ids() == ["127.0.0.1:2"] and pool.retired_ids() == ["127.0.0.1:1"]
    assert run(pool.pick("h")) is pool.proxies["127.0.0.1:2"]
    assert run(pool.pick("h", exclude=["127.0.0.1:2"])) is None


def test_a_retired_proxy_whose_key_is_deleted_is_said_to_be_back(redis_url, caplog):
    """The README's way back for a retired proxy (delete its key) worked with no word."""
    pool = make_pool(redis_url, "127.0.0.1:7#back-1", max_failures=1)
    run(pool.record_failure("back-1", "refused", pool.clock()))
    run(pool.refresh(force=True))
    assert pool.retired_ids() == ["back-1"]
    pool.redis.delete(pool.key("back-1"))
    with caplog.at_level("INFO", logger="webfarm.proxies"):
        run(pool.refresh(force=True))
        run(pool.refresh(force=True))
    assert pool.healthy_ids() == ["back-1"]
    said = [r.getMessage() for r in caplog.records if "back in use" in r.getMessage()]
    assert said == ["Proxy back-1 is back in use: its health key webfarm:proxies:back-1 was "
                    "deleted or expired"]


def test_success_after_the_incident_resets_the_count(redis_url):
    clock = [1000.0]
    pool = make_pool(redis_url, "127.0.0.1:1", base=1, max_failures=3, clock=lambda: clock[0])
    run(pool.record_failure("127.0.0.1:1", "x", clock[0]))
    clock[0] += 5
    run(pool.record_failure("127.0.0.1:1", "x", clock[0]))
    run(pool.record_success("127.0.0.1:1", "h", sent_at=clock[0] - 1))  # sent before: no proof
    run(pool.refresh(force=True))
    assert pool.state["127.0.0.1:1"].failures == 2
    clock[0] += 10
    run(pool.record_success("127.0.0.1:1", "h", sent_at=clock[0]))
    run(pool.refresh(force=True))
    assert pool.state["127.0.0.1:1"].failures == 0
    # so two more failures do not retire it
    run(pool.record_failure("127.0.0.1:1", "x", clock[0]))
    clock[0] += 5
    assert not run(pool.record_failure("127.0.0.1:1", "x", clock[0]))[1].retired


def test_rotation_and_sticky_hosts(redis_url):
    pool = make_pool(redis_url, "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
    picks = [run(pool.pick("a")).id for _ in range(6)]
    assert picks == ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"] * 2

    sticky = make_pool(redis_url, "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", sticky=True)
    first_a, first_b = run(sticky.pick("a")).id, run(sticky.pick("b")).id
    assert first_a != first_b
    assert {run(sticky.pick("a")).id for _ in range(5)} == {first_a}
    # Another worker sees the same assignment; a banned sticky proxy is replaced for everyone.
    other = make_pool(redis_url, "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", sticky=True)
    assert run(other.pick("a")).id == first_a
    run(sticky.record_failure(first_a, "ban", sticky.clock()))
    moved = run(sticky.pick("a")).id
    assert moved != first_a and run(other.pick("a")).id == moved


def test_requests_of_a_new_host_picked_together_share_its_sticky_proxy(valkey_server,
                                                                       redis_url):
    """Each reply 50 ms late: the four requests all read "no sticky proxy yet" before the
    first one's choice is written; the later ones still take the first one's."""
    import redis.asyncio

    from webfarm.redisconn import CLIENT_OPTIONS, close_client

    with Relay((valkey_server.host, valkey_server.port), 0.05) as relay:
        client = redis.asyncio.Redis.from_url(relay.url, **CLIENT_OPTIONS)
        pool = ProxyPool(parse_proxies("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"), client,
                         refresh=60.0, sticky=True)

        async def together():
            await pool.refresh(force=True)
            await asyncio.gather(*(client.ping() for _ in range(4)))  # 4 connections open
            return await asyncio.gather(*(pool.pick("new.test") for _ in range(4)))

        try:
            picks = {p.id for p in run(together())}
        finally:
            run(close_client(client))
    assert len(picks) == 1
    stored = redis.Redis.from_url(redis_url).get("webfarm:proxies:sticky:new.test")
    assert stored.decode() in picks


def test_pool_without_redis_keeps_choosing_and_cools_down_locally(caplog):
    """On the crawl's redis.asyncio client, Redis gone: the last known state is used,
    an incident still cools the proxy down (here, for this worker), nothing raises."""
    import redis.asyncio

    from webfarm.redisconn import CLIENT_OPTIONS, close_client

    client = redis.asyncio.Redis.from_url(f"redis://127.0.0.1:{servers.free_port()}",
                                          **CLIENT_OPTIONS)
    clock = [1000.0]
    pool = ProxyPool(parse_proxies("127.0.0.1:1,127.0.0.1:2"), client, refresh=0.0,
                     base=10, sticky=True, clock=lambda: clock[0])
    try:
        assert run(pool.refresh(force=True)) is False
        assert run(pool.pick("h")).id == "127.0.0.1:1"
        counted, state = run(pool.record_failure("127.0.0.1:1", "ban status 403", clock[0]))
        assert counted and state.failures == 1 and state.cooldown_until == clock[0] + 10
        assert run(pool.pick("h")).id == "127.0.0.1:2"
        assert run(pool.host_ok_elsewhere("h", "127.0.0.1:2")) is False
        run(pool.record_success("127.0.0.1:2", "h", clock[0]))
        assert run(pool.host_ok_elsewhere("h", "127.0.0.1:1")) is True  # known locally
    finally:
        run(close_client(client))
    assert any("Redis read failed, keeping the last state" in r.getMessage()
               for r in caplog.records)
    assert any("cooling 127.0.0.1:1 down locally" in r.getMessage() for r in caplog.records)


def crawler_for(redis_url, proxies, **settings):
    return get_crawler(settings_dict={
        "REDIS_URL": redis_url, "WEBFARM_PROXIES": proxies,
        "WEBFARM_PROXY_HEALTH_REFRESH": 0.0, "DOWNLOADER_MIDDLEWARES": {MW: 740}, **settings})


def fetched(request, status=200, body=b"<html><body>fine</body></html>", headers=None):
    return HtmlResponse(request.url, status=status, body=body, headers=headers,
                        request=request)


def test_second_worker_sees_a_proxy_banned_by_the_first(redis_url):
    proxies = f"http://u:{SECRET}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"
    first = ProxyMiddleware.from_crawler(crawler_for(redis_url, proxies))
    second = ProxyMiddleware.from_crawler(crawler_for(redis_url, proxies))

    request = Request("http://127.0.0.2:8000/a")
    run(first.process_request(request))
    assert request.meta["webfarm_proxy"] == "127.0.0.1:1"
    assert request.meta["proxy"] == f"http://u:{SECRET}@127.0.0.1:1"  # HttpProxyMiddleware's
    retry = run(first.process_response(request, fetched(request, 407, b"auth please")))
    assert isinstance(retry, Request) and retry.dont_filter
    assert retry.meta["webfarm_proxy_tried"] == ["127.0.0.1:1"] and "proxy" not in retry.meta
    run(first.process_request(retry))
    assert retry.meta["webfarm_proxy"] != "127.0.0.1:1"

    used = set()
    for i in range(6):
        r = Request(f"http://127.0.0.3:8000/{i}")
        run(second.process_request(r))
        used.add(r.meta["webfarm_proxy"])
    assert used == {"127.0.0.1:2", "127.0.0.1:3"}
    stored = redis.Redis.from_url(redis_url).hgetall("webfarm:proxies:127.0.0.1:1")
    assert stored[b"failures"] == b"1" and float(stored[b"cooldown_until"]) > 0
    assert SECRET.encode() not in b"".join(k + v for k, v in stored.items())


def refused_by_every_proxy(mw: ProxyMiddleware, request: Request) -> Any:
    """``request`` answered 403 through each proxy the middleware sends it by, three at
    most: what the middleware ends with (a response handed on, or a retry)."""
    for _ in range(3):
        run(mw.process_request(request))
        outcome = run(mw.process_response(request, fetched(request, 403, b"Forbidden")))
        if not isinstance(outcome, Request):
            break
        request = outcome
    return outcome


def test_site_bans_do_not_burn_the_pool(redis_url):
    mw = ProxyMiddleware.from_crawler(crawler_for(
        redis_url, "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", WEBFARM_PROXY_RETRY_TIMES=5,
        WEBFARM_PROXY_BAN_MARKERS=["IP is banned"]))
    # Refused through every proxy, none known to reach the host: nobody is blamed, and
    # the page goes back to the frontier (the proxies or the site refuse; handed on as
    # the site's answer, a page a bad proxy refused was lost).
    request = Request("http://127.0.0.2:8000/private")
    outcomes = []
    for _ in range(3):
        run(mw.process_request(request))
        try:
            outcome = run(mw.process_response(request, fetched(request, 403, b"Forbidden")))
        except RetryLater as exc:
            outcome = exc
        outcomes.append(outcome)
        request = outcome
    assert [type(o).__name__ for o in outcomes] == ["Request", "Request", "RetryLater"]
    assert outcomes[-1].reason == (
        "proxy: ban status 403 through 127.0.0.1:1, 127.0.0.1:2, 127.0.0.1:3, and no proxy "
        "has fetched 127.0.0.2:8000 fine yet: the proxies or the site refuse")
    assert mw.pool.healthy_ids() == ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
    assert mw.stats.get_value("webfarm/proxies/site_bans") == 3

    # Once a proxy fetched the host fine, a ban marker through another one is that proxy's.
    ok = Request("http://127.0.0.2:8000/ok")
    run(mw.process_request(ok))
    good = ok.meta["webfarm_proxy"]
    assert run(mw.process_response(ok, fetched(ok))).status == 200
    banned = Request("http://127.0.0.2:8000/next")
    run(mw.process_request(banned))
    bad = banned.meta["webfarm_proxy"]
    assert bad != good
    retry = run(mw.process_response(banned, fetched(banned, 200, f"<p>{BAN_MARKER}</p>".encode())))
    assert isinstance(retry, Request)
    assert bad in mw.pool.healthy_ids()  # suspected: the page may answer so everywhere
    run(mw.process_request(retry))
    assert retry.meta["webfarm_proxy"] != bad
    assert run(mw.process_response(retry, fetched(retry))).status == 200  # fine elsewhere
    assert bad not in mw.pool.healthy_ids() and good in mw.pool.healthy_ids()
    assert mw.stats.get_value(f"webfarm/proxies/{bad}/cooldowns") == 1

    # A probe: the site's own 403 pages (the same through every proxy) were each counted
    # against the first proxy that met them, and 15 of them retired two healthy proxies.
    before = mw.pool.healthy_ids()
    for n in range(6):
        outcome = refused_by_every_proxy(mw, Request(f"http://127.0.0.2:8000/forbidden/{n}"))
        assert isinstance(outcome, HtmlResponse) and outcome.status == 403  # the site's
    assert mw.pool.healthy_ids() == before
    assert mw.stats.get_value(f"webfarm/proxies/{good}/cooldowns") is None

    # Once a proxy reached the host, the page refused through every proxy is the site's
    # answer, handed on down the chain.
    outcome = refused_by_every_proxy(mw, Request("http://127.0.0.2:8000/private"))
    assert isinstance(outcome, HtmlResponse) and outcome.status == 403

    # A 429 with Retry-After that is not the proxy's fault is left to politeness.
    slow = Request("http://127.0.0.3:8000/")
    run(mw.process_request(slow))
    response = fetched(slow, 429, b"slow down", {"Retry-After": "30"})
    assert run(mw.process_response(slow, response)) is response


def test_one_proxy_refusing_everything_loses_no_page_and_no_robots_txt_for_a_day(redis_url):
    """A single proxy answering 403 to everything: its answers were the site's, so each page
    was dropped (acknowledged, never dead-lettered), and robots.txt's 403 read as "allow
    all" for a day, for every worker."""
    mw = ProxyMiddleware.from_crawler(crawler_for(redis_url, "127.0.0.1:1#only"))
    page = Request("http://127.0.0.4:8000/p")
    run(mw.process_request(page))
    with pytest.raises(RetryLater, match="no proxy has fetched 127.0.0.4:8000 fine yet"):
        run(mw.process_response(page, fetched(page, 403, b"denied")))
    robots = Request("http://127.0.0.4:8000/robots.txt", meta={"webfarm_robots": True})
    run(mw.process_request(robots))
    answer = run(mw.process_response(robots, fetched(robots, 403, b"denied")))
    assert answer.status == 403 and "webfarm-proxy-unproven" in answer.flags
    from webfarm.robots import Fetched, next_record
    kept = next_record(Fetched("allow", 403, brief=True), None, 1000.0, 86400.0, 300.0)
    assert kept.state == "allow" and kept.expires == 1300.0  # not a day
    assert mw.stats.get_value("webfarm/proxies/unproven_bans") == 2
    assert mw.pool.healthy_ids() == ["only"]  # no proxy blamed without a proof


def test_a_proxy_s_own_502_is_its_fault_when_others_reach_the_host(redis_url):
    """A proxy answering 502 itself was never blamed: each 502 cost the page an attempt,
    and pages were dead-lettered with a healthy proxy at hand."""
    mw = ProxyMiddleware.from_crawler(crawler_for(redis_url, "127.0.0.1:1#good,127.0.0.1:2#bad"))
    # Nobody has reached the host yet: a 502 is the site's, retried as such.
    first = Request("http://127.0.0.5:8000/a")
    run(mw.process_request(first))
    assert first.meta["webfarm_proxy"] == "good"
    assert run(mw.process_response(first, fetched(first, 502, b"bad gateway"))).status == 502
    ok = Request("http://127.0.0.5:8000/b")
    run(mw.process_request(ok))
    assert ok.meta["webfarm_proxy"] == "bad"
    ok.meta["webfarm_proxy"] = "good"  # fetched through the good one
    assert run(mw.process_response(ok, fetched(ok))).status == 200
    page = Request("http://127.0.0.5:8000/c")
    run(mw.process_request(page))
    page.meta["webfarm_proxy"] = "bad"
    retry = run(mw.process_response(page, fetched(page, 502, b"bad gateway")))
    assert isinstance(retry, Request) and retry.meta["webfarm_proxy_tried"] == ["bad"]
    assert mw.pool.healthy_ids() == ["good"]
    assert mw.stats.get_value("webfarm/proxies/bad/failures") == 1
    stored = redis.Redis.from_url(redis_url).hgetall("webfarm:proxies:bad")
    assert stored[b"last_reason"] == b"HTTP 502 from the proxy"
    assert stored[b"errors"] == b"1" and b"bans" not in stored  # a failure, not a ban


def test_connection_failures_retry_then_retry_later(redis_url):
    mw = ProxyMiddleware.from_crawler(crawler_for(
        redis_url, "127.0.0.1:1,127.0.0.1:2", WEBFARM_PROXY_RETRY_TIMES=1))
    request = Request("http://127.0.0.2:8000/")
    run(mw.process_request(request))
    retry = run(mw.process_exception(request, TxConnectionRefused("refused")))
    assert isinstance(retry, Request)
    run(mw.process_request(retry))
    with pytest.raises(RetryLater) as info:
        run(mw.process_exception(retry, TxConnectionRefused("refused")))
    assert "connection failed" in info.value.reason
    assert mw.pool.healthy_ids() == []
    # No healthy proxy left: the request waits in the frontier, never goes out directly.
    with pytest.raises(RetryLater) as info:
        run(mw.process_request(Request("http://127.0.0.2:8000/x")))
    assert info.value.delay is not None and 0 < info.value.delay <= 30
    assert run(mw.process_exception(request, ValueError("not ours"))) is None


def test_browser_requests_get_a_context_per_proxy(redis_url):
    mw = ProxyMiddleware.from_crawler(crawler_for(
        redis_url, f"http://u:{SECRET}@127.0.0.1:1,http://v:{SECRET}@127.0.0.1:2"))
    request = Request("http://127.0.0.2:8000/", meta={
        "playwright": True, "playwright_context_kwargs": {"java_script_enabled": True}},
        headers={"Proxy-Authorization": "Basic stale"})
    run(mw.process_request(request))
    pid = request.meta["webfarm_proxy"]
    assert request.meta["playwright_context"] == f"proxy-{pid}"
    assert request.meta["playwright_context_kwargs"] == {
        "java_script_enabled": True,
        "proxy": {"server": f"http://{pid}", "username": "u", "password": SECRET}}
    # The browser copies Scrapy headers to the site: no proxy credentials among them.
    assert request.meta["proxy"] is None and b"Proxy-Authorization" not in request.headers

    # After the download the password is gone from meta; a retry carries none either.
    retry = run(mw.process_response(request, fetched(request, 407, b"no")))
    assert SECRET not in json.dumps(request.meta, default=str)
    assert "playwright_context_kwargs" not in retry.meta or "proxy" not in retry.meta[
        "playwright_context_kwargs"]
    assert SECRET not in serialize.dumps(retry.to_dict())


def test_off_without_proxies_and_order_is_checked(redis_url):
    from scrapy.exceptions import NotConfigured

    # On in the project's settings, before HttpProxyMiddleware; idle without WEBFARM_PROXIES.
    assert base_settings.DOWNLOADER_MIDDLEWARES_BASE[MW] == 740
    with pytest.raises(NotConfigured):
        ProxyMiddleware.from_crawler(crawler_for(redis_url, ""))
    with pytest.raises(ValueError, match="lower DOWNLOADER_MIDDLEWARES priority"):
        ProxyMiddleware.from_crawler(crawler_for(redis_url, "127.0.0.1:1",
                                                 DOWNLOADER_MIDDLEWARES={MW: 800}))


# --- real crawls through real proxies ---------------------------------------------------------


@pytest.fixture()
def proxies():
    """Two good proxies (one needs credentials) and one bad one, on loopback."""
    servers = [ProxyServer("ok").start(), ProxyServer("auth", credentials=("crawler", SECRET)),
               ProxyServer("ban")]
    for s in servers[1:]:
        s.start()
    yield servers
    for s in servers:
        s.stop()


def crawl_through(proxy_setting, redis_url, mongo_uri, mongo_db_name, tmp_path, base, *extra,
                  start=None):
    env = runner.env_for(REDIS_URL=redis_url, MONGO_URI=mongo_uri,
                         MONGO_DATABASE=mongo_db_name,
                         BLOB_STORE_URI=(tmp_path / "blobs").as_uri(),
                         WEBFARM_PROXIES=proxy_setting)
    args = ["crawl", "generic", "-a", f"start={start or base + '/'}", "-s", "LOG_LEVEL=DEBUG",
            "-s", "WEBFARM_PROXY_BACKOFF_BASE=0.3", "-s", "WEBFARM_PROXY_MAX_FAILURES=3",
            "-s", "WEBFARM_PROXY_HEALTH_REFRESH=0.2",
            # The plain HTTP client only: every proxy hit is then one Scrapy request (Chromium
            # would answer the auth proxy's 407 challenge itself, an extra entry per page).
            "-s", "WEBFARM_RENDER=http", *extra]
    result = runner.scrapy(args, env, timeout=90)
    assert result.returncode == 0, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    return result


def json_setting(name, value):
    return f"{name}={json.dumps(value)}"


def stats_from(output):
    """The final stats dump of a crawl log, as a dict."""
    dump = output.split("Dumping Scrapy stats:", 1)[1]
    body = dump[dump.index("{"):]
    depth = 0
    for i, ch in enumerate(body):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return eval(body[: i + 1], {"datetime": __import__("datetime")})  # noqa: S307
    raise AssertionError("no stats dump")


def assert_no_secret(result, mongo_uri, mongo_db_name, redis_url):
    """Neither the password nor the Proxy-Authorization value in the log (DEBUG, with the
    stats dump), the stats, any Mongo document or any Redis key or value."""
    header = base64.b64encode(f"crawler:{SECRET}".encode()).decode()
    for secret in (SECRET, header):
        assert secret not in result.output
        assert secret not in repr(stats_from(result.output))
    db = pymongo.MongoClient(mongo_uri)[mongo_db_name]
    assert db.pages.count_documents({}) > 0
    for name in db.list_collection_names():
        for doc in db[name].find():
            text = json.dumps(doc, default=str)
            assert SECRET not in text and header not in text, (name, doc["_id"])
    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter())
    assert keys  # the crawl left its frontier and the proxies' health there
    for key in keys:
        assert SECRET.encode() not in key and header.encode() not in key
        kind = r.type(key)
        if kind == b"hash":
            blob = b"".join(k + v for k, v in r.hgetall(key).items())
        elif kind == b"zset":
            blob = b"".join(r.zrange(key, 0, -1))
        elif kind == b"list":
            blob = b"".join(r.lrange(key, 0, -1))
        elif kind == b"set":
            blob = b"".join(r.smembers(key))
        elif kind == b"string":
            blob = r.get(key) or b""
        else:
            continue
        assert SECRET.encode() not in blob and header.encode() not in blob, key


def test_crawl_moves_off_a_banning_proxy(web, proxies, redis_url, mongo_uri, mongo_db_name,
                                         tmp_path):
    ok, auth, ban = proxies
    base = web.base_urls[0]
    setting = f"{ok.url}, {auth.url_with('crawler', SECRET)}, {ban.url}"
    # Short cooldowns: the third ban (which retires the proxy) must come well before the end
    # of a crawl that fetches for only a few seconds.
    result = crawl_through(setting, redis_url, mongo_uri, mongo_db_name, tmp_path, base,
                           "-s", json_setting("WEBFARM_PROXY_BAN_MARKERS", ["IP is banned"]),
                           "-s", "WEBFARM_PROXY_BACKOFF_BASE=0.1")

    db = pymongo.MongoClient(mongo_uri)[mongo_db_name]
    assert {d["url"] for d in db.pages.find()} == web.expected_pages(base)
    assert {d["status"] for d in db.pages.find()} == {200}
    # Every page the site served came through one of the good proxies.
    relayed = ok.relayed_count() + auth.relayed_count()
    assert relayed == len(web.hits_for(host=base)) and ban.relayed_count() == 0
    assert ok.relayed_count() > 20 and auth.relayed_count() > 20
    # The banning proxy got few requests before it was retired, and is retired for everyone.
    ban_id = ban.url.split("//")[1]
    assert 3 <= len(ban.entries()) < relayed / 3
    state = redis.Redis.from_url(redis_url).hgetall(f"webfarm:proxies:{ban_id}")
    assert state[b"retired"] == b"1" and int(state[b"failures"]) >= 3
    stats = stats_from(result.output)
    assert stats["webfarm/proxies/healthy"] == [ok.url.split("//")[1], auth.url.split("//")[1]]
    assert stats["webfarm/proxies/retired"] == [ban_id]
    assert stats[f"webfarm/proxies/{ban_id}/bans"] == len(ban.entries())
    assert stats["webfarm/proxies/retries"] >= len(ban.entries())
    assert f"proxy {ban_id} retired after 3 consecutive failures" in result.output
    # The proxy that needs credentials got the right ones on every request, never a 407.
    auth_entries = auth.entries()
    assert auth_entries and {e.status for e in auth_entries} == {200}
    assert {e.proxy_authorization for e in auth_entries} == {
        "Basic " + __import__("base64").b64encode(f"crawler:{SECRET}".encode()).decode()}
    # ... and the site never saw them.
    assert not [h for h in web.hits if "proxy-authorization" in h.headers]
    assert_no_secret(result, mongo_uri, mongo_db_name, redis_url)


def test_a_crawl_through_one_banning_proxy_dead_letters_its_pages(web, redis_url, mongo_uri,
                                                                   mongo_db_name, tmp_path):
    """Its 403s were the site's answers: the start page was acknowledged with nothing
    stored and no dead letter (the worker said only "Ignoring response <403>"), and its
    robots.txt 403 was kept as "allow all" for a day."""
    from tests import crawlcheck

    base = web.base_urls[1]
    with ProxyServer("ban") as ban:
        crawl_through(f"{ban.url}#exit", redis_url, mongo_uri, mongo_db_name, tmp_path, base,
                      "-s", "WEBFARM_RETRY_TIMES=2", "-s", "WEBFARM_RETRY_BACKOFF_BASE=0.05",
                      "-s", "WEBFARM_ROBOTS_RETRY_DELAY=120")
    assert web.hits_for(host=base) == []  # the proxy refused everything
    letters = crawlcheck.dead_letters(redis_url)
    assert list(letters) == [f"{base}/"], letters
    assert letters[f"{base}/"]["reason"] == (
        f"gave up after 2 attempts: proxy: ban status 403 through exit, and no proxy has "
        f"fetched {base.split('//')[1]} fine yet: the proxies or the site refuse")
    [key] = redis.Redis.from_url(redis_url).keys(f"*robots*{base.split('//')[1]}")
    record = redis.Redis.from_url(redis_url).hgetall(key)
    assert record[b"state"] == b"allow"
    assert float(record[b"expires"]) - time.time() <= 120  # not a day


def test_crawl_survives_a_refusing_proxy_listed_in_a_file(web, redis_url, mongo_uri,
                                                           mongo_db_name, tmp_path):
    base = web.base_urls[1]
    with ProxyServer("ok") as one, ProxyServer("ok") as two, ProxyServer("refuse") as dead:
        path = tmp_path / "proxies.txt"
        path.write_text(f"# test pool\n{one.url}\n{dead.url}#dead\n{two.url}  # spare\n")
        # Cooldowns of 0.1 s, then 0.2 s: the dead proxy is retired about 1.3 s after the
        # crawl starts. With 0.3 s and 0.6 s that took 1.85 s of a crawl that fetches for
        # about 2.4 s, and a fast run once ended before the third incident.
        result = crawl_through(str(path), redis_url, mongo_uri, mongo_db_name, tmp_path, base,
                               "-s", "WEBFARM_PROXY_BACKOFF_BASE=0.1")

        db = pymongo.MongoClient(mongo_uri)[mongo_db_name]
        assert {d["url"] for d in db.pages.find()} == web.expected_pages(base)
        assert one.relayed_count() + two.relayed_count() == len(web.hits_for(host=base))
        assert min(one.relayed_count(), two.relayed_count()) > 20
    state = redis.Redis.from_url(redis_url).hgetall("webfarm:proxies:dead")
    stats = stats_from(result.output)
    assert state.get(b"retired") == b"1", (state, stats)
    assert stats["webfarm/proxies/retired"] == ["dead"]
    assert stats["webfarm/proxies/dead/failures"] >= 3
    assert "proxy dead retired after 3 consecutive failures (last: connection failed" in (
        result.output)


def test_bad_proxy_entry_stops_the_crawl_with_one_clear_line(redis_url, mongo_uri, tmp_path):
    env = runner.env_for(REDIS_URL=redis_url, MONGO_URI=mongo_uri, MONGO_DATABASE="wf_badproxy",
                         BLOB_STORE_URI=(tmp_path / "b").as_uri(),
                         WEBFARM_PROXIES=f"127.0.0.1:3128, http://u:{SECRET}@127.0.0.1:notaport")
    result = runner.scrapy(["crawl", "generic", "-a", "start=http://127.0.0.2:1/"], env,
                           timeout=60)
    assert result.returncode != 0
    assert re.search(r"WEBFARM_PROXIES: entry 2 \(127\.0\.0\.1:notaport\): not a URL",
                     result.output), result.output[-2000:]
    assert SECRET not in result.output


def test_browser_pages_go_through_one_context_per_proxy(web, redis_url, mongo_uri,
                                                        mongo_db_name, tmp_path):
    """Chromium through two real proxies, one needing credentials: every navigation goes
    through a proxy, one browser context per proxy, and the password stays out of
    logs, stats, Redis and Mongo."""
    base = web.base_urls[1]
    with ProxyServer("ok") as ok, ProxyServer("auth", credentials=("crawler", SECRET)) as auth:
        setting = f"{ok.url}, {auth.url_with('crawler', SECRET)}"
        starts = sorted(web.expected_pages(base))[:4]
        result = crawl_through(setting, redis_url, mongo_uri, mongo_db_name, tmp_path, base,
                               "-a", "max_pages=1",  # these 4 pages only
                               "-s", "WEBFARM_RENDER=browser",
                               # Chromium never proxies loopback unless told to.
                               "-s", "WEBFARM_PROXY_BROWSER_BYPASS=<-loopback>",
                               start=",".join(starts))
        # Chromium may ask for the site's favicon by itself (Playwright does not route
        # that request); it is the browser's, not a page the crawl fetched.
        pages = [h for h in web.hits_for(host=base)
                 if h.path not in ("/robots.txt", "/favicon.ico")]
        assert ok.relayed_count() > 0 and auth.relayed_count() > 0
        # Every page the site served came through a proxy (robots.txt goes over HTTP).
        relayed = [e for p in (ok, auth) for e in p.entries() if e.relayed]
        assert len(relayed) >= len(web.hits_for(host=base))
        assert {e.status for e in auth.entries()
                if e.relayed and not e.target.endswith("/favicon.ico")} == {200}
    stats = stats_from(result.output)
    # These 4 pages and nothing else; a page fetched twice only if its request was
    # retried through the frontier (a navigation failing under load), never silently.
    served = sorted(h.path for h in pages)
    assert sorted(set(served)) == sorted(u[len(base):] for u in starts), served
    retried = stats.get("webfarm/frontier/retried", 0)
    assert len(pages) <= 4 + retried, (served, stats)
    assert stats["webfarm/render/browser"] == len(pages), (served, stats)
    assert stats["playwright/context_count"] == 2  # one per proxy, no more
    assert not [h for h in web.hits if "proxy-authorization" in h.headers]
    assert_no_secret(result, mongo_uri, mongo_db_name, redis_url)


def test_a_spider_proxy_with_credentials_is_refused_with_where_to_put_them(
        web, redis_url, mongo_uri, mongo_db_name, tmp_path):
    """Credentials are never written to Redis: a request whose meta["proxy"] held them was
    queued without them, and the worker fetching it got 407 from the proxy until the
    request was dead-lettered."""
    base = web.base_urls[0]
    with ProxyServer("auth", credentials=("crawler", SECRET)) as proxy:
        env = runner.env_for(REDIS_URL=redis_url, MONGO_URI=mongo_uri,
                             MONGO_DATABASE=mongo_db_name,
                             BLOB_STORE_URI=(tmp_path / "b").as_uri())
        result = runner.scrapy(["crawl", "test_own_proxy", "-a", f"start={base}/",
                                "-a", f"proxy=http://crawler:{SECRET}@{proxy.host}:{proxy.port}",
                                "-s", "SPIDER_MODULES=spiders,tests.spiders"], env, 120)
        assert result.returncode == 0 and "Traceback" not in result.output
        assert "meta['proxy'] holds a user:password" in result.output
        assert "list the proxy in WEBFARM_PROXIES" in result.output
        assert SECRET not in result.output
        assert proxy.log == [] and web.hits_for(host=base) == []


def test_a_dead_letter_names_the_proxy_its_last_try_went_through(redis_url):
    """An operator reading "gave up after 5 attempts: HTTP 502" first asks which proxy."""
    from scrapy.settings import Settings

    from webfarm.frontier import Entry, Frontier
    from webfarm.frontierlink import FrontierLink
    from webfarm.leaseends import LeaseEnds
    from webfarm.queue import LEASE

    frontier = Frontier(redis.Redis.from_url(redis_url), "letters", default_delay=0)
    frontier.push([Entry("127.0.0.2:8000", 0, b"x" * 20,
                         json.dumps({"url": "http://127.0.0.2:8000/p"}))])
    popped = frontier.pop("w")
    ends = LeaseEnds(Settings(), {}, lambda key: None)
    ends.open(FrontierLink(frontier, "w"), frontier)
    request = Request("http://127.0.0.2:8000/p", meta={LEASE: popped.lease_id,
                                                        "webfarm_proxy": "eu-1"})
    ends._dead(popped.lease_id, request, "gave up after 5 attempts: HTTP 502", 502, None)
    [letter] = frontier.dead_letters(10)
    assert letter["reason"] == "gave up after 5 attempts: HTTP 502 (last through proxy eu-1)"


def test_scrapy_frontier_shows_each_proxy_s_health(redis_url):
    """An operator had nowhere to see it: worker log lines and close-time stats only."""
    from tests import runner

    proxies = "127.0.0.1:1#fine,127.0.0.1:2#cool,127.0.0.1:3#gone,127.0.0.1:4#back"
    pool = make_pool(redis_url, proxies, base=600, max_failures=2)
    run(pool.record_failure("cool", "ban status 403", pool.clock()))
    pool.clock = lambda: time.time() - 700  # its cooldown is over; its failure counts on
    run(pool.record_failure("back", "timeout", pool.clock()))
    pool.clock = time.time
    for _ in range(2):
        run(pool.record_failure("gone", "407 proxy authentication required", pool.clock()))
    env = runner.env_for(REDIS_URL=redis_url, WEBFARM_PROXIES=proxies)
    doc = json.loads(runner.scrapy(["frontier", "generic", "--json"], env, 60).stdout)
    states = {p["id"]: (p["state"], p["failures"]) for p in doc["proxies"]}
    assert states == {"fine": ("healthy", 0), "cool": ("cooling", 1), "gone": ("retired", 2),
                      "back": ("healthy", 1)}
    text = runner.scrapy(["frontier", "generic"], env, 60).stdout
    assert re.search(r"  cool  cooling down (?:5\d\d|600)s more \(1 in a row; last: ban "
                     r"status 403\)", text), text
    assert ("  gone  retired (2 in a row; last: 407 proxy authentication required); fix it, "
            "then delete webfarm:proxies:gone") in text
    assert "  fine  healthy\n" in text
    assert ("  back  in use again, 1 in a row; last: timeout; a fetch through it clears them"
            in text), text


def test_with_every_proxy_retired_pages_wait_and_go_on_once_one_is_back(
        web, redis_url, mongo_uri, mongo_db_name, tmp_path):
    """A turn of a request that found no proxy to go through spent an attempt, though it
    was never sent: with its only proxy retired, a crawl emptied its frontier into the
    dead-letter queue ("gave up after 4 attempts: proxy: every proxy is retired") while
    the log and the README said its requests wait in the frontier."""
    from tests import crawlcheck

    base = web.base_urls[1]
    r = redis.Redis.from_url(redis_url)
    env = runner.env_for(REDIS_URL=redis_url, MONGO_URI=mongo_uri, MONGO_DATABASE=mongo_db_name,
                         BLOB_STORE_URI=(tmp_path / "blobs").as_uri(), WEBFARM_RENDER="http")
    with ProxyServer("ok") as gate:
        env["WEBFARM_PROXIES"] = f"{gate.url}#gate"
        args = ["crawl", "generic", "-a", f"start={base}/", "-s", "WEBFARM_HOST_DELAY=0.05",
                "-s", "WEBFARM_PROXY_MAX_FAILURES=1", "-s", "WEBFARM_PROXY_BACKOFF_BASE=0.2",
                "-s", "WEBFARM_PROXY_HEALTH_REFRESH=0.2", "-s", "WEBFARM_RETRY_TIMES=4",
                "-s", "WEBFARM_RETRY_BACKOFF_BASE=0.05"]
        worker = runner.popen(args, env, tmp_path / "worker.log")
        try:
            servers.wait_for(lambda: len(web.hits_for(host=base)) >= 4, 60, "a first few pages")
            gate.mode = "refuse"  # the proxy goes down: retired at its first failure
            servers.wait_for(lambda: r.hget("webfarm:proxies:gate", "retired") == b"1", 30,
                             "the proxy retired")
            time.sleep(2)  # about ten turns of each waiting page: 4 attempts, twice over
            assert crawlcheck.dead_letters(redis_url) == {}
            c = frontier_of_counts(redis_url)
            assert c["queued"] + c["delayed"] + c["leased"] > 0  # they wait there
            gate.mode = "ok"  # fixed; deleting its key brings it back, as the log says
            r.delete("webfarm:proxies:gate")
            assert worker.wait(120) == 0
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
    log = (tmp_path / "worker.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    assert log.count("every proxy is retired (gate); requests wait in the frontier") == 1
    db = pymongo.MongoClient(mongo_uri)[mongo_db_name]
    assert {d["url"] for d in db.pages.find()} == web.expected_pages(base)
    assert crawlcheck.dead_letters(redis_url) == {}
    assert stats_from(log)["webfarm/frontier/waited"] > 0


def frontier_of_counts(redis_url):
    from tests import crawlcheck

    return crawlcheck.frontier(redis_url, "generic").counts()
