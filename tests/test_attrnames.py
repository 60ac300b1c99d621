"""Slips in the names webfarm reads from spider and item classes are said, once a class.

``key_field = ("sku",)`` on an item class stored one record per page (mirrors became
duplicate records) and ``render_chek`` on a spider was ignored, without a word.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import ClassVar

import pytest
import scrapy
from scrapy.utils.misc import walk_modules_iter
from scrapy.utils.spider import iter_spider_classes
from scrapy.utils.test import get_crawler

from spiders.base import WebfarmSpider
from webfarm.attrnames import spider_slips
from webfarm.itemstore import make_entry

NOW = dt.datetime.now(dt.timezone.utc)


@dataclass
class Offer:
    key_field: ClassVar[tuple[str, ...]] = ("sku",)  # the slip
    item_colection: ClassVar[str] = "offers"  # and another
    sku: str
    price: str


class Row(scrapy.Item):
    key_feilds = ("sku",)
    sku = scrapy.Field()


def slips(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "did you mean" in r.getMessage()]


def test_a_slip_in_an_item_class_is_said_once_with_the_name_meant(caplog):
    caplog.set_level(logging.WARNING)
    for n in range(3):
        entry = make_entry(Offer(sku="S1", price="1"), None, f"http://shop.test/{n}", None, NOW)
        assert entry.key == f"http://shop.test/{n}"  # stored as it was: keyed on the page
    make_entry(Row(sku="S2"), None, "http://shop.test/r", None, NOW)
    said = slips(caplog)
    assert len(said) == 3, said
    assert "Offer.key_field is no name the item store reads; did you mean key_fields?" in said[0]
    assert "keyed on the page's URL" in said[0]
    assert any("Offer.item_colection" in s and "item_collection?" in s for s in said)
    assert any("Row.key_feilds" in s for s in said)


def test_a_slip_in_a_dict_item_s_key_is_said(caplog):
    caplog.set_level(logging.WARNING)
    make_entry({"_keys": "sku", "sku": "S1"}, None, "http://shop.test/d", None, NOW)
    assert slips(caplog) == ["a dict item's key '_keys' is no name the item store reads; did "
                             "you mean '_key'?"]


def test_a_slip_in_a_spider_attribute_or_method_is_said(caplog):
    class Acme(WebfarmSpider):
        name = "acme"
        render_chek = "article.product"

        def extact(self, response):
            yield {}

    caplog.set_level(logging.WARNING)
    Acme.from_crawler(get_crawler(Acme), start="http://shop.test/")
    said = slips(caplog)
    assert any("Acme.render_chek" in s and "render_check?" in s for s in said), said
    assert any("Acme.extact" in s and "extract?" in s for s in said), said


def _spiders() -> list[type]:
    return sorted({cls for package in ("spiders", "tests.spiders")
                   for module in walk_modules_iter(package) for cls in iter_spider_classes(module)
                   if issubclass(cls, WebfarmSpider)}, key=lambda c: c.__qualname__)


@pytest.mark.parametrize("cls", _spiders(), ids=lambda c: c.__qualname__)
def test_the_project_s_and_tests_spiders_have_no_slips(cls):
    """The names real spiders use (their own helpers, callbacks) are not taken for slips."""
    assert spider_slips(cls, WebfarmSpider) == []
