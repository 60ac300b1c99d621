"""Re-parse and item keys: what a user sees when items have no key, or change their key.

Items without a key of their own are keyed on their page. Several from one page are one
document (the crawl says so); a re-parse counted the extra ones as "changed" items and
said nothing. A spider that gains ``key_fields`` stores its items again under the new
key on re-parse, and the documents stored under the old key stayed beside them, unsaid.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import scrapy
from scrapy.http import Response
from scrapy.utils.test import get_crawler

from tests import test_reparser
from tests.spiders.products import ProductsSpider
from tests.test_reparser import store_pages
from webfarm.itemstore import ItemStore
from webfarm.reparse import Reparser

index, blobs = test_reparser.index, test_reparser.blobs  # its fixtures


@dataclass
class Offer:  # no key_fields: one per page, keyed on the page's URL
    item_collection: ClassVar[str] = "offers"
    sku: str
    price: str


@dataclass
class KeyedOffer(Offer):
    key_fields: ClassVar[tuple[str, ...]] = ("sku",)


class ListingSpider(ProductsSpider):
    """Three offers per page, without a key (a listing's rows, as dicts)."""

    def extract(self, response: Response) -> Iterator[Any]:
        for n in range(3):
            yield {"_collection": "rows", "row": n, "page": response.url}


class OfferSpider(ProductsSpider):
    keyed = False

    def extract(self, response: Response) -> Iterator[Any]:
        sku = response.css(".sku::text").re_first(r"SKU:\s*(\S+)")
        if sku:
            yield (KeyedOffer if self.keyed else Offer)(sku=sku, price="$1.00")


class KeyedOfferSpider(OfferSpider):
    keyed = True


def reparse(spidercls: type, index, blobs, **kwargs: Any):
    spider = spidercls.from_crawler(get_crawler(spidercls), start="http://shop.test/")
    return Reparser(spider, index, blobs, ItemStore(index.db), **kwargs).run()


def test_keyless_items_of_one_page_are_counted_as_one_document_and_said_once(
        index, blobs, caplog):
    store_pages(index, blobs, 4)
    caplog.set_level(logging.WARNING, logger="webfarm.reparse")
    stats = reparse(ListingSpider, index, blobs, batch_size=5)
    assert (stats.created, stats.changed, stats.items, stats.folded) == (4, 0, 4, 8)
    assert index.db.rows.count_documents({}) == 4
    assert [d["row"] for d in index.db.rows.find()] == [2, 2, 2, 2]  # the last one's
    said = [r.getMessage() for r in caplog.records if "without a key" in r.getMessage()]
    assert len(said) == 1 and "3 items" in said[0] and "key_fields" in said[0]
    assert "8 folded (no key)" in stats.line()

    again = reparse(ListingSpider, index, blobs)
    assert (again.created, again.changed, again.unchanged) == (0, 0, 4)


def test_documents_left_under_an_old_key_are_counted_with_how_to_remove_them(
        index, blobs, caplog):
    store_pages(index, blobs, 6, skus=3)  # 3 products, each on two pages
    first = reparse(OfferSpider, index, blobs)
    assert (first.created, first.old_keys) == (6, 0)  # keyed on the page: one per page
    assert index.db.offers.distinct("item_key") == ["source_url"]

    caplog.set_level(logging.WARNING, logger="webfarm.reparse")
    dry = reparse(KeyedOfferSpider, index, blobs, dry_run=True)
    assert dry.old_keys == 6 and "would be stored" in caplog.text
    caplog.clear()
    stats = reparse(KeyedOfferSpider, index, blobs)
    assert (stats.created, stats.old_keys) == (3, 6)
    assert index.db.offers.count_documents({}) == 9  # the old ones stay: it only says so
    [said] = [r.getMessage() for r in caplog.records if "keyed on" in r.getMessage()]
    assert "6 documents in 'offers' are keyed on source_url" in said
    assert "now keyed on sku" in said

    # The removal it gives leaves the new documents alone.
    index.db.offers.delete_many({"item_key": {"$exists": True, "$ne": ["sku"]}})
    assert sorted(d["_id"] for d in index.db.offers.find()) == ["S0", "S1", "S2"]
    assert reparse(KeyedOfferSpider, index, blobs).old_keys == 0


class ClashingOfferSpider(KeyedOfferSpider):
    """Keyed on the SKU, which each of two pages shows at another price (two shops' SKUs
    that meet)."""

    def extract(self, response: Response) -> Iterator[Any]:
        sku = response.css(".sku::text").re_first(r"SKU:\s*(\S+)")
        if sku:
            yield KeyedOffer(sku=sku, price=response.url.rsplit("/", 1)[1])


def test_a_key_two_pages_give_other_values_is_said_once_and_counted(index, blobs, caplog):
    """Two re-parses in a row of two shops' catalogues (keyed on SKU alone) counted 418
    and 558 "changed" for 279 documents, with the extractor unchanged, and left each
    document with whichever shop's page was read last, unsaid."""
    store_pages(index, blobs, 6, skus=3)  # 3 products, each on two pages
    caplog.set_level(logging.WARNING, logger="webfarm.reparse")
    same = reparse(KeyedOfferSpider, index, blobs)  # the same values on both: one record
    assert (same.created, same.clashes) == (3, 0)
    assert "two pages" not in caplog.text
    stats = reparse(ClashingOfferSpider, index, blobs)
    assert stats.clashes == 3 and "3 keys from two pages" in stats.line()
    said = [r.getMessage() for r in caplog.records if "two pages" in r.getMessage()]
    assert len(said) == 1, said
    # Pages are read in content-hash order: either page of a product may come first.
    assert re.match(r"reparse: 'offers' item 'S(\d)' came from two pages with other values "
                    r"\(http://shop.test/page/(\d), http://shop.test/page/(\d)\)\. The "
                    r"document keeps the item of the page fetched last\.", said[0]), said[0]
    assert "their key (sku) does not tell them apart" in said[0]
    assert "scrapy seed test_products --force URL" in said[0]  # or one is an older copy
    sku, a, b = re.match(r".*'S(\d)'.*page/(\d), .*page/(\d)\)", said[0]).groups()
    assert {int(a), int(b)} == {int(sku), int(sku) + 3}
    assert "key_fields" in said[0] and said[0].endswith("(said once per collection)")


@pytest.mark.parametrize("newer", [(3, 4, 5), (0, 1, 2)])
@pytest.mark.parametrize("batch_size", [1, 100])
def test_of_two_pages_of_one_record_the_one_fetched_last_wins_in_any_read_order(
        index, blobs, newer, batch_size):
    """A product on two URLs, one refetched after its price changed and one not: a full
    re-parse read them in content-hash order and the one read last won, so a stale price
    came back over the new one (counted changed, with a new changed_at)."""
    store_pages(index, blobs, 6, skus=3)  # S<n> on pages n and n + 3
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    index.pages.update_many({"url": {"$in": [f"http://shop.test/page/{n}" for n in newer]}},
                            {"$set": {"fetched_at": later}})
    expected = {f"S{n % 3}": str(n) for n in newer}  # ClashingOfferSpider's price: the page
    dry = reparse(ClashingOfferSpider, index, blobs, batch_size=batch_size, dry_run=True)
    first = reparse(ClashingOfferSpider, index, blobs, batch_size=batch_size)
    assert {d["_id"]: d["price"] for d in index.db.offers.find()} == expected
    assert all(d["source_url"].endswith(f"/page/{d['price']}") for d in index.db.offers.find())
    assert (dry.created, dry.superseded) == (first.created, first.superseded)
    changed_at = {d["_id"]: d["changed_at"] for d in index.db.offers.find()}
    again = reparse(ClashingOfferSpider, index, blobs, batch_size=batch_size)
    assert (again.changed, again.unchanged, again.superseded) == (0, 3, 3)
    assert {d["_id"]: d["price"] for d in index.db.offers.find()} == expected
    assert {d["_id"]: d["changed_at"] for d in index.db.offers.find()} == changed_at


class FollowingOfferSpider(KeyedOfferSpider):
    """Yields a link with each item, as a crawl's callback does."""

    def extract(self, response: Response) -> Iterator[Any]:
        yield scrapy.Request(response.urljoin("/next"))
        yield from super().extract(response)


def test_requests_a_callback_yields_are_counted_as_not_followed(index, blobs):
    """They were dropped without a word: a re-parse fetches nothing."""
    store_pages(index, blobs, 4, skus=2)
    stats = reparse(FollowingOfferSpider, index, blobs)
    assert (stats.requests, stats.created) == (4, 2)
    assert "4 requests not followed (no network)" in stats.line()


@pytest.mark.parametrize(("version", "kept"), [("1", "3"), ("2", "0")])
def test_a_slice_of_older_pages_does_not_put_their_values_back(index, blobs, version, kept):
    """A product on two pages, the second fetched later with a new price: a re-parse of
    the first page alone (--url-pattern) put its old price back. With the same extractor
    the later page's item stays; a new extractor's item is written (the run re-extracts)."""
    store_pages(index, blobs, 6, skus=3)
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    index.pages.update_many({"url": {"$in": [f"http://shop.test/page/{n}" for n in (3, 4, 5)]}},
                            {"$set": {"fetched_at": later}})
    reparse(ClashingOfferSpider, index, blobs)  # as a crawl left them: the later pages'
    assert index.db.offers.find_one({"_id": "S0"})["price"] == "3"

    class Versioned(ClashingOfferSpider):
        extractor_version = version

    spider = Versioned.from_crawler(get_crawler(Versioned), start="http://shop.test/")
    stats = Reparser(spider, index, blobs, ItemStore(index.db)).run(url_pattern=r"/page/0$")
    assert index.db.offers.find_one({"_id": "S0"})["price"] == kept
    assert stats.superseded == (1 if kept == "3" else 0)
