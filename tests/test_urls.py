"""Same URL, same request, same host: the keys of the frontier, the index and politeness."""

from __future__ import annotations

import re

import pytest
from scrapy import Request
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.test import get_crawler

from webfarm.urls import (
    DEFAULT_TRACKING_PARAMS,
    RequestFingerprinter,
    bare_host,
    canonical_url,
    host_of,
    request_fingerprint,
    scope_host,
    url_fingerprint,
)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # tracking params (utm_ is a prefix, any case) and the fragment go
        (
            "http://example.com/p?id=7&utm_source=news&UTM_Medium=mail&gclid=x#reviews",
            "http://example.com/p?id=7",
        ),
        (
            "http://example.com/?fbclid=1&msclkid=2&dclid=3&mc_cid=4&mc_eid=5&yclid=6&_ga=7",
            "http://example.com/",
        ),
        # session ids in the query, aspsessionid* as a prefix
        (
            "http://example.com/?PHPSESSID=ab&sid=4f3a9c0e7b2d41a8b6e5&SessionId=2"
            "&ASPSESSIONIDQSCTRBDA=3&q=x",
            "http://example.com/?q=x",
        ),
        # "sid" only as a token: on some sites it is an article's id (PHP-Nuke)
        ("http://example.com/modules.php?name=News&file=article&sid=2",
         "http://example.com/modules.php?file=article&name=News&sid=2"),
        # `ref` selects content on many sites: kept
        ("http://example.com/?ref=main", "http://example.com/?ref=main"),
        # query sorted by key then value
        ("http://example.com/s?b=2&a=9&a=1", "http://example.com/s?a=1&a=9&b=2"),
        # host case and default ports; the path keeps its case
        ("HTTP://WWW.Example.COM:80/Path", "http://www.example.com/Path"),
        ("https://Example.com:443/", "https://example.com/"),
        ("https://example.com:80/", "https://example.com:80/"),
        ("http://127.0.0.2:8081/a", "http://127.0.0.2:8081/a"),
        # percent-encoding normalised
        ("http://example.com/caf%c3%a9?q=a%2fb", "http://example.com/caf%C3%A9?q=a%2Fb"),
        ("http://example.com/café", "http://example.com/caf%C3%A9"),
        # ;jsessionid path parameters, any case, in any segment; others kept
        ("http://example.com/cart;jsessionid=A1B2?x=1", "http://example.com/cart?x=1"),
        (
            "http://example.com/a;JSESSIONID=Z;v=2/b;jsessionid=Y",
            "http://example.com/a;v=2/b",
        ),
        # no empty "?" left behind
        ("http://example.com/p?utm_campaign=spring", "http://example.com/p"),
    ],
)
def test_canonical_url(url: str, expected: str) -> None:
    assert canonical_url(url) == expected


def test_exact_patterns_do_not_match_longer_names() -> None:
    # "sid" is a default, "side" and "consid" are content
    assert canonical_url("http://e.com/?side=left&consid=1&sid=0123456789abcdef") == (
        "http://e.com/?consid=1&side=left"
    )


def test_a_token_pattern_drops_the_parameter_only_for_a_session_token() -> None:
    """``name=token``: a session id is dropped, an id of content is kept (``sid`` was
    dropped whatever its value, so every article of a PHP-Nuke site was one URL)."""
    assert canonical_url("http://e.com/article.php?sid=2") != canonical_url(
        "http://e.com/article.php?sid=3")
    for token in ("4f3a9c0e7b2d41a8b6e5c1d2e3f4a5b6", "ab-CD_ef01234567"):
        assert canonical_url(f"http://e.com/a;sid={token}?sid={token}&p=1") == (
            "http://e.com/a?p=1")
    params = ["cart=token", "utm_"]
    assert canonical_url("http://e.com/?cart=A1B2C3D4E5F6G7H8&utm_x=1", params) == "http://e.com/"
    assert canonical_url("http://e.com/?cart=42", params) == "http://e.com/?cart=42"


def test_custom_strip_params_prefix_and_exact() -> None:
    params = ["trk*", "src_", "Token"]
    url = "http://e.com/?trkA=1&trk=2&src_x=3&src=4&token=5&tokens=6&utm_source=7"
    # "src" alone is not matched by the prefix "src_"; defaults are replaced, not added
    assert canonical_url(url, params) == "http://e.com/?src=4&tokens=6&utm_source=7"
    assert canonical_url(url, ()) == (
        "http://e.com/?src=4&src_x=3&token=5&tokens=6&trk=2&trkA=1&utm_source=7"
    )


def test_defaults_document_the_brief() -> None:
    lowered = {p.lower() for p in DEFAULT_TRACKING_PARAMS}
    assert {"utm_", "gclid", "fbclid", "jsessionid", "phpsessid", "sid=token",
            "aspsessionid*"} <= (
        lowered
    )
    assert "ref" not in lowered


def test_url_fingerprint_is_the_same_for_equivalent_urls() -> None:
    a = url_fingerprint("http://Example.com:80/p?b=2&a=1&utm_source=x#top")
    b = url_fingerprint("http://example.com/p?a=1&b=2")
    assert a == b
    assert len(a) == 40 and int(a, 16) >= 0
    assert url_fingerprint("http://example.com/p?a=1&b=3") != a
    assert url_fingerprint("https://example.com/p?a=1&b=2") != a


def test_request_fingerprint_covers_method_url_and_body() -> None:
    fp = request_fingerprint("GET", "http://e.com/a?utm_source=x")
    assert isinstance(fp, bytes) and len(fp) == 20
    assert fp == request_fingerprint("get", "http://E.com:80/a#f")
    assert fp != request_fingerprint("POST", "http://e.com/a")
    assert request_fingerprint("POST", "http://e.com/a", b"q=1") != request_fingerprint(
        "POST", "http://e.com/a", b"q=2"
    )
    assert fp != request_fingerprint("GET", "http://e.com/b")


def test_fingerprinter_ignores_meta_and_headers() -> None:
    fingerprinter = RequestFingerprinter.from_crawler(get_crawler())
    plain = Request("http://e.com/p?b=1&a=2")
    via_browser = Request(
        "http://e.com/p?a=2&b=1&utm_medium=x#frag",
        meta={"playwright": True, "proxy": "http://127.0.0.1:1", "verbatim_url": True},
        headers={"User-Agent": "other", "Cookie": "s=1"},
        dont_filter=True,
        priority=10,
    )
    assert fingerprinter.fingerprint(plain) == fingerprinter.fingerprint(via_browser)
    assert fingerprinter.fingerprint(plain) == request_fingerprint("GET", plain.url)
    posted = Request("http://e.com/p?b=1&a=2", method="POST", body=b"x=1")
    assert fingerprinter.fingerprint(posted) != fingerprinter.fingerprint(plain)
    assert fingerprinter.fingerprint(posted) != fingerprinter.fingerprint(
        posted.replace(body=b"x=2")
    )


def test_fingerprinter_reads_strip_params_setting() -> None:
    crawler = get_crawler(
        settings_dict={
            "REQUEST_FINGERPRINTER_CLASS": "webfarm.urls.RequestFingerprinter",
            "WEBFARM_STRIP_PARAMS": "session_*,trk",
        }
    )
    fingerprinter = crawler.request_fingerprinter
    assert isinstance(fingerprinter, RequestFingerprinter)
    assert fingerprinter.fingerprint(Request("http://e.com/?session_a=1&trk=2")) == (
        fingerprinter.fingerprint(Request("http://e.com/"))
    )
    # the setting replaces the defaults
    assert fingerprinter.fingerprint(Request("http://e.com/?utm_source=1")) != (
        fingerprinter.fingerprint(Request("http://e.com/"))
    )
    # empty setting: the defaults
    default = RequestFingerprinter.from_crawler(get_crawler(settings_dict={}))
    assert default.strip_params == DEFAULT_TRACKING_PARAMS
    assert default.fingerprint(Request("http://e.com/?utm_source=1")) == default.fingerprint(
        Request("http://e.com/")
    )


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.2:8081/a", "127.0.0.2:8081"),
        ("http://127.0.0.2:8082/a", "127.0.0.2:8082"),
        ("http://Example.COM:80/", "example.com"),
        ("https://example.com:443/x", "example.com"),
        ("https://example.com:80/x", "example.com:80"),
        ("http://user:pw@Example.com:8080/", "example.com:8080"),
        ("http://[::1]:80/", "[::1]"),
        ("http://[0:0::1]:8080/", "[::1]:8080"),
        ("http://münchen.de/", "xn--mnchen-3ya.de"),
    ],
)
def test_host_of(url: str, expected: str) -> None:
    assert host_of(url) == expected


@pytest.mark.parametrize("url", [
    "http://127.0.0.2:8081/a", "http://Example.COM:80/", "https://example.com:8443/x",
    "http://user:pw@Example.com:8080/", "http://[::1]:8080/", "http://[::1]/",
])
def test_bare_host_is_scrapys_slot_key(url: str) -> None:
    """Scrapy keys ``DOWNLOAD_SLOTS`` and its offsite filter by the URL's bare hostname."""
    assert bare_host(host_of(url)) == urlparse_cached(Request(url)).hostname


def test_host_of_agrees_with_canonical_url() -> None:
    for url in ["http://Example.com:80/a", "https://[0::1]:8443/", "http://Bücher.de:81/"]:
        netloc = canonical_url(url).split("/")[2]
        assert host_of(url) == netloc


@pytest.mark.parametrize(("given", "expected"), [
    ("Example.COM", "example.com"),
    ("EXAMPLE.com:8080", "example.com:8080"),
    ("münchen.de", "xn--mnchen-3ya.de"),  # as the hosts of links are spelled
    ("Bücher.de:81", "xn--bcher-kva.de:81"),
    ("example.com.", "example.com"),
    ("127.0.0.2:8081", "127.0.0.2:8081"),
    ("[::1]:8080", "[::1]:8080"),
    ("::ffff:127.0.0.3", "[::ffff:127.0.0.3]"),  # a bare IPv6 address
    ("https://Example.com/", "example.com"),  # a site's root URL: its host
    ("http://127.0.0.2:8081", "127.0.0.2:8081"),
])
def test_scope_host_spells_hosts_as_urls_spell_them(given: str, expected: str) -> None:
    assert scope_host(given) == expected


@pytest.mark.parametrize(("given", "message"), [
    ("https://example.com/blog/", "is a URL with a path; give its host, 'example.com'"),
    ("ftp://example.com/", "is not a host; give one such as example.com"),
    ("*.example.com", "give 'example.com', which covers its subdomains"),
    (".example.com", "give 'example.com', which covers its subdomains"),
    ("example.com:http", "a port is a number from 1 to 65535"),
    ("example.com:0", "a port is a number from 1 to 65535"),
    ("example.com:70000", "a port is a number from 1 to 65535"),
    ("user@example.com", "is not a host; give host or host:port"),
    ("example.com/shop", "is not a host; give host or host:port"),
    ("exa mple.com", "is not a host; give host or host:port"),
    ("shop/", "is not a host; give host or host:port"),
    ("[zz]:80", "is not a host; give host or host:port"),
])
def test_scope_host_refuses_what_is_not_a_host_and_says_what_to_give(given, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        scope_host(given)


@pytest.mark.parametrize(("url", "why"), [
    ("http://shop.test:99999/a", "port out of range 0-65535"),
    ("http://[::1/a", "invalid ipv6 url"),
    ("https://shop.test:http/", "port could not be cast to integer value as 'http'"),
    ("http://user:pw@shop.test/a", "a user:password@ in the URL"),
    ("http://token@shop.test/a", "a user:password@ in the URL"),
    ("http:///a", "no host"),
    ("http://shop.test:0/", "port 0"),
    ("http://shop.test:8080/a?b=c#d", None),
    ("https://[2001:db8::1]:8443/", None),
    ("HTTP://Shop.Test/", None),
    ("ftp://shop.test:99999/", None),  # another scheme: its handler's business
])
def test_unfetchable_says_why_scrapys_downloader_would_fail_every_time(url, why) -> None:
    # Such a link or redirect was fetched, failed with ValueError and a traceback, and was
    # retried WEBFARM_RETRY_TIMES times before it reached the dead letters.
    from webfarm.urls import unfetchable

    got = unfetchable(url)
    assert (got is None) if why is None else (got or "").startswith(why), got


def test_a_start_url_that_cannot_be_fetched_is_refused_at_start() -> None:
    from spiders.generic import GenericSpider

    with pytest.raises(ValueError, match=r"'http://127.0.0.2:99999/' cannot be fetched: "
                                         "port out of range"):
        GenericSpider.check_arguments(start="http://127.0.0.2:99999/")
    with pytest.raises(ValueError, match=r"'http://\*\*\*@shop.test/' cannot be fetched: a "
                                         "user:password@") as refused:
        GenericSpider.check_arguments(start="http://me:secret@shop.test/")
    assert "secret" not in str(refused.value)


def test_within_domains_keeps_a_port_when_given_one():
    """A WebfarmSpider's hosts carry their ports, and its workers follow that port only:
    `scrapy seed` counted a URL on another port of the host as inside."""
    from webfarm.urls import within_domains

    within = within_domains(["shop.test:8080", "blog.test"])
    assert within("http://shop.test:8080/a") and within("http://www.shop.test:8080/a")
    assert not within("http://shop.test:9090/a") and not within("http://shop.test/a")
    assert within("http://blog.test:1234/") and within("https://blog.test/")
    assert not within("http://shop.test:99999/")  # no port at all: not the spider's
    assert within_domains(["web.test:443"])("https://web.test/x")
