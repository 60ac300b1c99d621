"""A page of links without end gives its first WEBFARM_MAX_LINKS_PER_PAGE anchors only;
the extractor stops reading there, and the cut is logged and counted."""

from __future__ import annotations

import logging
import re

import pytest
from scrapy.http import HtmlResponse
from scrapy.linkextractors import LinkExtractor
from scrapy.utils.test import get_crawler

from spiders.generic import GenericSpider
from webfarm.links import extract_links

BASE = "http://shop.test"


def page(anchors: int, offsite_first: int = 0) -> HtmlResponse:
    links = [f'<a href="http://elsewhere.test/{i}">x</a>' for i in range(offsite_first)]
    links += [f'<a href="/p/{i}">p{i}</a>' for i in range(anchors)]
    body = f"<html><body>{''.join(links)}</body></html>".encode()
    return HtmlResponse(f"{BASE}/", body=body, encoding="utf-8")


def spider(**settings):
    crawler = get_crawler(GenericSpider, settings)
    crawler.stats.open_spider()
    return GenericSpider.from_crawler(crawler, start=f"{BASE}/"), crawler.stats


def test_a_page_gives_the_links_of_its_first_anchors_and_says_it_cut(caplog):
    crawl, stats = spider(WEBFARM_MAX_LINKS_PER_PAGE=1000)
    with caplog.at_level(logging.WARNING):
        urls = [r.url for r in crawl.follow(page(50_000))]
    assert urls == [f"{BASE}/p/{i}" for i in range(1000)]
    assert stats.get_value("webfarm/links/capped") == 1
    assert f"first 1000 anchors of {BASE}/, which has more (WEBFARM_MAX_LINKS_PER_PAGE)" in (
        caplog.text)
    # Anchors count before the scope: a page whose first 1000 lead elsewhere gives none.
    assert list(crawl.follow(page(10, offsite_first=1000))) == []
    assert stats.get_value("webfarm/links/capped") == 2


def test_a_page_under_the_limit_or_no_limit_gives_every_link(caplog):
    crawl, stats = spider()  # the default, 10,000
    with caplog.at_level(logging.WARNING):
        assert len(list(crawl.follow(page(9_000)))) == 9_000
    unbounded, _ = spider(WEBFARM_MAX_LINKS_PER_PAGE=0)
    assert len(list(unbounded.follow(page(12_000)))) == 12_000
    assert stats.get_value("webfarm/links/capped") is None and "anchors of" not in caplog.text


def test_the_extractor_stops_reading_at_the_limit_and_is_left_as_it_was():
    extractor = LinkExtractor(unique=True)
    read = []
    every = extractor.link_extractor._iter_links

    def counted(document):
        for anchor in every(document):
            read.append(anchor)
            yield anchor

    extractor.link_extractor._iter_links = counted  # an instance's own is put back
    links, more = extract_links(extractor, page(5_000), 100)
    assert (len(links), more, len(read)) == (100, True, 101)  # one past: "there is more"
    assert extractor.link_extractor._iter_links is counted
    del extractor.link_extractor._iter_links
    assert [link.url for link in extract_links(extractor, page(300), 100)[0]] == [
        f"{BASE}/p/{i}" for i in range(100)]
    assert "_iter_links" not in vars(extractor.link_extractor)
    full, more = extract_links(extractor, page(300), 0)
    assert (len(full), more) == (300, False)


@pytest.mark.parametrize("value", ["many", "-1", "2.5"])
def test_a_bad_limit_stops_the_crawl_at_start_saying_what_is_wanted(value):
    with pytest.raises(ValueError, match=rf"WEBFARM_MAX_LINKS_PER_PAGE='{re.escape(value)}' "
                       "is not a whole number of anchors; 0 means no limit"):
        spider(WEBFARM_MAX_LINKS_PER_PAGE=value)


def test_another_kind_of_extractor_is_cut_after():
    class Listed:
        def extract_links(self, response):
            return LinkExtractor().extract_links(response)

    links, more = extract_links(Listed(), page(500), 200)
    assert (len(links), more) == (200, True)
    assert extract_links(Listed(), page(200), 200)[1] is False


@pytest.mark.parametrize("headers", [{"Content-Type": "application/json"}, {}])
def test_a_json_page_is_stored_and_gives_no_links(headers):
    # Scrapy makes a JsonResponse of application/json, and of a .json URL with no type;
    # the link extractor failed on its selector, so the page's callback failed and an
    # API link a site showed was dead-lettered.
    from scrapy import Request
    from scrapy.responsetypes import responsetypes

    from webfarm.items import PageItem
    from webfarm.render import needs_js

    body = b'{"items": [{"href": "/p/1"}], "next": "<a href=\\"/p/2\\">2</a>"}'
    cls = responsetypes.from_args(headers=headers, url=f"{BASE}/api/items.json", body=body)
    url = f"{BASE}/api/items.json"
    response = cls(url, headers=headers, body=body, request=Request(url))
    assert type(response).__name__ == "JsonResponse"
    crawl, _ = spider()
    out = list(crawl.parse(response))
    assert [type(o) for o in out] == [PageItem], out
    assert needs_js(response) is None  # and the render ladder does not judge it
