"""The SSRF guard: refused addresses never see a request, redirect hops included."""

from __future__ import annotations

import asyncio
import json

import pytest
from scrapy.settings import Settings

from tests import crawlcheck, runner
from tests.testweb import Response
from webfarm.netguard import NetGuard, NetGuardError, parse_networks


def guard(allowed: str = "") -> NetGuard:
    return NetGuard.from_settings(Settings({"WEBFARM_ALLOWED_NETWORKS": allowed}))


@pytest.mark.parametrize(("ip", "kind"), [
    ("127.0.0.1", "loopback"), ("10.0.0.5", "private"), ("192.168.1.1", "private"),
    ("172.16.0.1", "private"), ("169.254.169.254", "link-local"), ("224.0.0.251", "multicast"),
    ("240.0.0.1", "reserved"), ("0.0.0.0", "unspecified"), ("100.64.0.1", "non-global"),
    ("::1", "loopback"), ("::", "unspecified"), ("fe80::1", "link-local"),
    ("fd00::1", "private"), ("ff02::1", "multicast"),
    ("::ffff:127.0.0.1", "loopback (embedded in IPv6)"),
    ("::ffff:169.254.169.254", "link-local (embedded in IPv6)"),
    ("2002:a00:1::", "private (embedded in IPv6)"),  # 6to4 of 10.0.0.1
])
def test_non_public_addresses_are_refused(ip, kind):
    reason = guard().check_ip(ip)
    assert reason is not None and reason.startswith(f"{kind} address"), reason


@pytest.mark.parametrize("ip", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_pass(ip):
    assert guard().check_ip(ip) is None


def test_allow_list_permits_named_networks_only():
    g = guard("127.0.0.2/32, 10.1.0.0/16")
    assert g.check_ip("127.0.0.2") is None
    assert g.check_ip("::ffff:127.0.0.2") is None  # the mapped form of an allowed address
    assert g.check_ip("10.1.200.3") is None
    assert g.check_ip("127.0.0.3") is not None
    assert g.check_ip("10.2.0.1") is not None


def test_a_bad_allow_list_entry_is_a_clear_error():
    with pytest.raises(NetGuardError, match=r"'10\.0\.0\.0/33'.*comma-separated CIDRs"):
        parse_networks("127.0.0.0/8,10.0.0.0/33")


def test_check_url_judges_the_resolved_address_and_never_raises():
    g = guard()

    async def check(*urls):
        return [await g.check_url(u) for u in urls]

    results = asyncio.run(check(
        "http://localhost:8080/", "http://[::ffff:7f00:1]/", "http://127.1/",
        "http://x:99999/", "file:///etc/passwd", "gopher://127.0.0.1/", "http:///nohost",
        None, "data:text/html,<p>hi</p>", "http://bad..host/",  # IDNA refuses it: no DNS query
    ))
    assert results[0].startswith("localhost resolves to loopback address 127.0.0.1")
    assert results[1].startswith("loopback (embedded in IPv6)")
    assert results[2].startswith("127.1 resolves to loopback")  # inet_aton spellings too
    assert results[3].startswith("malformed URL")
    assert "scheme 'file' is not fetched" in results[4]
    assert "scheme 'gopher' is not fetched" in results[5]
    assert "no host" in results[6]
    assert results[7] is not None  # not a URL at all: a reason, not an exception
    assert results[8] is None  # data: never leaves the process
    assert results[9].startswith("cannot resolve 'bad..host'")
    assert asyncio.run(guard("127.0.0.0/8").check_url("http://localhost:1/")) is None


def test_crawl_refuses_private_targets_and_redirect_hops(web, stores):
    allowed, refused = web.base_urls  # 127.0.0.2 allowed, 127.0.0.3 not
    port = allowed.rsplit(":", 1)[1]
    web.route("/hop", Response(302, {"Location": "/hop2"}), host=allowed)
    web.route("/hop2", Response(301, {"Location": f"{refused}/secret"}), host=allowed)
    web.route("/meta", Response(307, {"Location": f"http://localhost:{port}/admin"}), host=allowed)
    web.route("/fine", Response.html("<html><body><p>allowed page</p></body></html>"),
              host=allowed)
    starts = [f"{allowed}/hop", f"{allowed}/meta", f"{allowed}/fine", f"{refused}/direct",
              f"http://[::ffff:127.0.0.3]:{port}/mapped", f"http://bad..host:{port}/"]
    env = runner.env_for(**stores, WEBFARM_ALLOWED_NETWORKS="127.0.0.2/32")
    result = runner.scrapy(["crawl", "generic", "-a", "start=" + ",".join(starts),
                            "-a", "domains=127.0.0.2,127.0.0.3,localhost,::ffff:127.0.0.3,"
                            "bad..host", "-a", "max_pages=1",
                            "-s", "WEBFARM_RETRY_TIMES=2", "-s", "WEBFARM_RETRY_BACKOFF_BASE=0.05",
                            "-s", "WEBFARM_RETRY_BACKOFF_MAX=0.1"], env, timeout=120)
    assert result.returncode == 0, result.output[-3000:]

    assert web.hits_for(host=refused) == []  # not one request reached the refused host
    assert web.hits_for(host=allowed, path="/hop2")  # the allowed hop was followed
    dead = {url: d["reason"] for url, d in crawlcheck.dead_letters(stores["REDIS_URL"]).items()}
    assert dead[f"{refused}/secret"].startswith("ssrf: loopback address 127.0.0.3"), dead
    assert dead[f"http://localhost:{port}/admin"].startswith(
        "ssrf: localhost resolves to loopback address 127.0.0.1"), dead
    assert dead[f"{refused}/direct"].startswith("ssrf: loopback address 127.0.0.3"), dead
    assert dead[f"http://[::ffff:127.0.0.3]:{port}/mapped"].startswith(
        "ssrf: loopback (embedded in IPv6)"), dead
    # A name that does not resolve is retried like any DNS error, then dead-lettered.
    assert dead[f"http://bad..host:{port}/"].startswith(
        "gave up after 2 attempts: ssrf: cannot resolve 'bad..host'"), dead
    assert len(dead) == 5, dead
    assert crawlcheck.stat(result.output, "webfarm/ssrf/refused") == 4
    assert crawlcheck.stat(result.output, "webfarm/ssrf/unresolved") == 2
    assert "SSRF guard refused http://localhost" in result.output
    assert list(crawlcheck.pages(stores)) == [f"{allowed}/fine"]


def test_a_bad_allow_list_stops_the_worker_with_one_clear_line(web, stores):
    env = runner.env_for(**stores, WEBFARM_ALLOWED_NETWORKS="127.0.0.0/8,intranet")
    result = runner.scrapy(["crawl", "generic", "-a", f"start={web.base_urls[0]}/"], env,
                           timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.output
    said = [line for line in result.stderr.splitlines() if line.startswith("webfarm:")]
    assert said == ["webfarm: WEBFARM_ALLOWED_NETWORKS entry 'intranet' is not a network; "
                    "use comma-separated CIDRs such as 127.0.0.0/8,10.0.0.0/8"], result.stderr
    assert "Spider opened" not in result.output and web.hits == []  # said before a start
    assert web.hits_for() == []


def test_scrapy_dns_cache_pins_the_checked_address():
    """DNS rebinding: with Scrapy's caching resolver the guard judges the address Scrapy
    will connect to, and pins the one it resolved itself."""
    from scrapy.resolver import dnscache

    g = NetGuard.from_settings(Settings({
        "WEBFARM_ALLOWED_NETWORKS": "127.0.0.0/8",
        "TWISTED_DNS_RESOLVER": "scrapy.resolver.CachingThreadedResolver"}))
    assert g.pin_scrapy_dns
    dnscache.limit = dnscache.limit or 100
    dnscache.pop("localhost", None)
    try:
        assert asyncio.run(g.check_url("http://localhost/")) is None
        assert dnscache["localhost"] == "127.0.0.1"  # Scrapy now connects to what was checked
        # A name Scrapy already resolved is judged by that address, not a fresh lookup.
        dnscache["rebind.localhost"] = "10.9.8.7"
        reason = asyncio.run(g.check_url("http://rebind.localhost/"))
        assert reason == ("rebind.localhost resolves to private address 10.9.8.7 "
                          "(not in WEBFARM_ALLOWED_NETWORKS)")
    finally:
        dnscache.pop("localhost", None)
        dnscache.pop("rebind.localhost", None)


def test_the_guard_is_off_only_when_its_setting_says_so():
    from scrapy.exceptions import NotConfigured
    from scrapy.utils.test import get_crawler

    from middlewares.ssrf import SSRFGuardMiddleware

    assert SSRFGuardMiddleware.from_crawler(get_crawler()).guard.enabled
    with pytest.raises(NotConfigured):
        SSRFGuardMiddleware.from_crawler(get_crawler(settings_dict={"WEBFARM_SSRF_GUARD": False}))


def test_a_spider_adding_components_of_its_own_keeps_the_guard(web, stores):
    """A spider's custom_settings (or -s, or scrapyd's setting=) naming DOWNLOADER_MIDDLEWARES,
    SPIDER_MIDDLEWARES or EXTENSIONS replaced webfarm's: the SSRF guard, robots.txt, the
    frontier's retries and the host throttle were gone without a word."""
    allowed, refused = web.base_urls  # 127.0.0.2 allowed, 127.0.0.3 not
    env = runner.env_for(**stores, WEBFARM_ALLOWED_NETWORKS="127.0.0.2/32")
    own = {"DOWNLOADER_MIDDLEWARES": {"scrapy.downloadermiddlewares.useragent."
                                      "UserAgentMiddleware": 450},
           "SPIDER_MIDDLEWARES": {"scrapy.spidermiddlewares.depth.DepthMiddleware": 900},
           "EXTENSIONS": {"scrapy.extensions.logstats.LogStats": 10}}
    result = runner.scrapy(["crawl", "generic", "-a", f"start={allowed}/,{refused}/",
                            "-a", "max_pages=1",
                            *[a for k, v in own.items() for a in ("-s", f"{k}={json.dumps(v)}")]],
                           env, timeout=120)
    assert result.returncode == 0, result.output[-3000:]
    assert web.hits_for(host=refused) == []
    dead = crawlcheck.dead_letters(stores["REDIS_URL"])
    assert dead[f"{refused}/"]["reason"].startswith("ssrf: loopback address 127.0.0.3"), dead
    assert web.hits_for(host=allowed, path="/robots.txt")  # webfarm's robots middleware
    for component in ("middlewares.ssrf.SSRFGuardMiddleware", "webfarm.throttle.HostThrottle",
                      "middlewares.retry.FrontierRetryMiddleware",
                      "scrapy.downloadermiddlewares.useragent.UserAgentMiddleware"):
        assert component in result.output, component  # Scrapy's "Enabled ..." lists
    assert "scrapy.downloadermiddlewares.retry.RetryMiddleware" not in result.output
