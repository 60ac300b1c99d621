"""Feed exports in a real crawl: ``-o`` gets the spider's items, not its PageItems (whose
raw bodies JSON cannot hold: every page logged a traceback); a feed that names PageItem
in ``item_classes`` gets the pages."""

from __future__ import annotations

import csv
import json

from tests import crawlcheck, runner
from webfarm.urls import canonical_url


def test_o_exports_the_spider_s_items_and_a_feed_can_ask_for_the_pages(web, stores,
                                                                       tmp_path):
    base = web.base_urls[0]
    shop = web.shop(base)
    products, pages = tmp_path / "products.jsonl", tmp_path / "pages.csv"
    feeds = {str(pages): {"format": "csv", "item_classes": ["webfarm.items.PageItem"],
                          "fields": ["url", "status", "content_hash"]}}
    env = runner.env_for(**stores, WEBFARM_IDLE_TIMEOUT="1")
    result = runner.scrapy(["crawl", "catalogue", "-a", f"start={base}/", "-o", str(products),
                            "-s", f"FEEDS={json.dumps(feeds)}"], env, timeout=180)

    assert result.returncode == 0, result.output[-3000:]
    assert "Traceback" not in result.output and "ERROR" not in result.output, \
        result.output[-3000:]
    exported = [json.loads(line) for line in products.read_text().splitlines()]
    assert sorted(item["sku"] for item in exported) == sorted(shop.products)
    with pages.open(newline="") as f:
        rows = list(csv.DictReader(f))
    # Each page once, under the URL it was requested by (the index keeps it canonical).
    assert sorted(canonical_url(row["url"]) for row in rows) == sorted(web.expected_pages(base))
    assert all(row["status"] == "200" and len(row["content_hash"]) == 64 for row in rows)
    # "scraped N items" and item_scraped_count are the products; the pages are counted apart
    # (a probe's 12 products were "27 items" with its 15 pages).
    assert crawlcheck.stat(result.output, "item_scraped_count") == len(shop.products)
    assert crawlcheck.stat(result.output, "webfarm/pages/recorded") == len(rows)


def test_a_feed_gets_a_dict_s_fields_not_the_item_store_s_control_keys():
    """``-o members.jsonl`` had ``"_key": "member", "_collection": "h_members"`` in every
    line of a spider whose dicts name their key and collection."""
    from webfarm.feeds import without_controls

    item = {"member": "Member 1", "_key": "member", "_collection": "h_members"}
    assert without_controls(item) == {"member": "Member 1"}
    assert item["_key"] == "member"  # the item store still gets them
    plain = {"member": "Member 2"}
    assert without_controls(plain) is plain


def test_closespider_itemcount_counts_the_spider_s_items_not_page_records():
    """CLOSESPIDER_ITEMCOUNT=10 closed a webfarm crawl at its tenth page (each page yields
    a record for storage), with 3 products exported."""
    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from webfarm.feeds import CloseSpider
    from webfarm.items import PageItem

    crawler = get_crawler(Spider, {"CLOSESPIDER_ITEMCOUNT": 10})
    ext = CloseSpider.from_crawler(crawler)
    spider = Spider("shop")
    for n in range(9):
        page = PageItem(url=f"http://shop.test/{n}", final_url=f"http://shop.test/{n}",
                        host="shop.test", spider="shop", status=200, body=b"")
        ext.item_scraped(page, spider)
        ext.item_scraped({"sku": n}, spider)
    assert ext.counter["itemcount"] == 9  # nine products; the nine pages not counted
