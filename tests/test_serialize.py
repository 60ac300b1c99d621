"""Queued requests are JSON without secrets, and foreign entries are refused."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
import scrapy
from scrapy.utils.request import request_from_dict

from webfarm import serialize


class Product(scrapy.Item):
    name = scrapy.Field()
    price = scrapy.Field()


@dataclasses.dataclass
class Offer:
    seller: str
    product: Product | None = None


class Spider(scrapy.Spider):
    name = "s"

    def parse_item(self, response):  # pragma: no cover - only referenced by name
        pass


def test_round_trip_keeps_request_fields():
    spider = Spider()
    req = scrapy.Request(
        "http://example.com/a?b=1", callback=spider.parse_item, method="POST", body=b"\x00\xffdata",
        headers={"X-Test": "1"}, meta={"depth": 2, "render": "browser"}, priority=7,
        cb_kwargs={"page": 3},
    )
    data = serialize.dumps(req.to_dict(spider=spider))
    json.loads(data)  # plain JSON
    back = request_from_dict(serialize.loads(data), spider=spider)
    assert back.url == req.url and back.method == "POST" and back.body == b"\x00\xffdata"
    assert back.callback == spider.parse_item
    assert back.meta == {"depth": 2, "render": "browser"}
    assert back.priority == 7 and back.cb_kwargs == {"page": 3}
    assert back.headers[b"X-Test"] == b"1"


def test_credentials_never_serialised():
    req = scrapy.Request(
        "http://example.com/",
        headers={"Proxy-Authorization": "Basic c2VjcmV0", "Authorization": "Bearer tok",
                 "Cookie": "sid=1"},
        meta={"proxy": "http://user:secret@proxy.local:3128", "_auth_proxy": "x"},
    )
    data = serialize.dumps(req.to_dict())
    assert "secret" not in data and "c2VjcmV0" not in data and "tok" not in data
    assert "sid=1" not in data
    assert serialize.loads(data)["meta"]["proxy"] == "http://proxy.local:3128"


@pytest.mark.parametrize(
    "entry, why",
    [
        (b"\x80\x04\x95pickle", "not JSON"),
        (b'{"no": "url"}', "no 'url'"),
        (b'{"url": "http://x/", "_class": "os.system"}', "not allowed"),
        (b'{"url": "http://x/", "callback": "__init__"}', "must name a spider method"),
        (b"[1, 2]", "no 'url'"),
    ],
)
def test_foreign_entries_refused(entry, why):
    with pytest.raises(serialize.SerializationError, match=why):
        serialize.loads(entry)


def test_scrapy_playwright_page_methods_are_queued_and_checked():
    """A scrapy-playwright spider's PageMethods travel through the frontier; those that
    would let a Redis writer reach the worker's files (or run a function) do not."""
    from scrapy_playwright.page import PageMethod

    methods = [PageMethod("wait_for_selector", "div.price", timeout=5000),
               PageMethod("evaluate", "window.scrollBy(0, document.body.scrollHeight)")]
    req = scrapy.Request("http://example.com/",
                         meta={"playwright": True, "playwright_page_methods": methods})
    back = serialize.loads(serialize.dumps(req.to_dict()))["meta"]["playwright_page_methods"]
    assert [(type(m), m.method, m.args, m.kwargs) for m in back] == [
        (PageMethod, "wait_for_selector", ("div.price",), {"timeout": 5000}),
        (PageMethod, "evaluate", ("window.scrollBy(0, document.body.scrollHeight)",), {})]
    for method, why in [("screenshot", r"cannot queue PageMethod\('screenshot'\): a queued "
                                       r"request may wait for or act on the page only"),
                        (print, "cannot queue a PageMethod that calls <built-in function "
                                "print>: name a Page method instead")]:
        with pytest.raises(serialize.SerializationError, match=why):
            serialize.dumps(scrapy.Request("http://example.com/", meta={
                "playwright_page_methods": [PageMethod(method, path="/etc/passwd")]}).to_dict())
    # An entry written to Redis by someone else: refused on the way out too.
    for forged in (["set_input_files", ["input"], {"files": "/etc/passwd"}], ["click"],
                   "click"):
        entry = json.dumps({"url": "http://x/", "meta": {"playwright_page_methods": [
            {"__page_method__": forged}]}})
        with pytest.raises(serialize.SerializationError, match="PageMethod"):
            serialize.loads(entry)


def test_items_passed_to_the_next_callback_come_back_as_items():
    """Scrapy's way to build one item over several pages: ``cb_kwargs={"item": item}``.
    Before, a scrapy.Item or dataclass there could not be queued."""
    offer = Offer("acme", Product(name="kite", price=[b"9", 9.5]))
    req = scrapy.Request("http://example.com/", cb_kwargs={"offer": offer, "seen": [offer]},
                         meta={"item": Product(name="x")})
    back = serialize.loads(serialize.dumps(req.to_dict()))
    assert back["cb_kwargs"] == {"offer": offer, "seen": [offer]}
    assert type(back["cb_kwargs"]["offer"].product) is Product
    assert back["meta"]["item"] == Product(name="x")
    # Forged entries: no import on an entry's word, no class that is not a project item.
    for path, why in [("os:system", "not an item class"),
                      ("collections:OrderedDict", "not an item class"),
                      ("builtins:dict", "not an item class"),
                      ("no.such.module:Item", "not loaded in this worker"),
                      (f"{__name__}:Product.__class__", "not loaded"),
                      (f"{__name__}:Product", "cannot rebuild")]:
        entry = json.dumps({"url": "http://x/", "meta": {"item": {
            "__item__": [path, {"colour": "red"}]}}})
        with pytest.raises(serialize.SerializationError, match=why):
            serialize.loads(entry)


def test_a_request_class_a_worker_would_not_rebuild_is_refused_when_yielded():
    """Before, it was queued, then dead-lettered as malformed by the worker taking it."""

    class PagedRequest(scrapy.Request):
        pass

    with pytest.raises(serialize.SerializationError,
                       match=r"its class .*PagedRequest is not one a worker rebuilds"):
        serialize.dumps(PagedRequest("http://example.com/").to_dict())
    serialize.dumps(scrapy.FormRequest("http://example.com/", formdata={"q": "1"}).to_dict())


def test_an_item_class_of_an_installed_project_package_is_rebuilt(monkeypatch):
    """A project installed into site-packages (a container image): its dataclass items are
    the project's, named by the package of its settings module."""
    import scrapy.core.downloader  # noqa: F401 - loaded, as in a crawl

    entry = json.dumps({"url": "http://x/", "meta": {"item": {"__item__": [
        "scrapy.core.downloader:Slot", {"concurrency": 1, "delay": 0.5, "jitter": 0.0}]}}})
    with pytest.raises(serialize.SerializationError, match="not an item class"):
        serialize.loads(entry)  # an installed library's dataclass
    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "scrapy.settings")  # "the project is scrapy"
    assert serialize.loads(entry)["meta"]["item"].delay == 0.5


def test_unserialisable_meta_gives_clear_error():
    req = scrapy.Request("http://example.com/", meta={"obj": object()})
    with pytest.raises(serialize.SerializationError, match="JSON types"):
        serialize.dumps(req.to_dict())


@pytest.mark.parametrize("callback", [
    lambda response: None,
    functools.partial(Spider.parse_item, None),
    str.upper,
], ids=["lambda", "partial", "builtin"])
def test_a_callback_a_queued_request_cannot_name_is_refused_with_the_fix(callback):
    """Scrapy's ValueError escaped the scheduler, and the task handling the rest of the
    callback's output ended with 'Task exception was never retrieved'."""
    from scrapy.utils.request import RequestFingerprinter

    from webfarm.queue import request_entry

    request = scrapy.Request("http://example.com/", callback=callback)
    with pytest.raises(serialize.SerializationError,
                       match=r"is not a method of the spider; .*pass values with cb_kwargs"):
        request_entry(request, Spider(), RequestFingerprinter())


def test_tuples_and_sets_come_back_as_they_were_queued():
    """A callback got a list for a tuple in cb_kwargs or meta: ``pos == (1, 2)`` was false,
    and a dict keyed by it raised "unhashable type: 'list'"."""
    spider = Spider()
    kwargs = {"pos": (1, 2), "empty": (), "nested": [(b"\xff", ("a",))],
              "tags": {"b", "a"}, "fixed": frozenset({3}), "plain": [1, 2]}
    req = scrapy.Request("http://example.com/", callback=spider.parse_item,
                         cb_kwargs=kwargs, meta={"path": ("x", "y")})
    back = request_from_dict(serialize.loads(serialize.dumps(req.to_dict(spider=spider))),
                             spider=spider)
    assert back.cb_kwargs == kwargs and back.meta == {"path": ("x", "y")}
    assert type(back.cb_kwargs["pos"]) is tuple and type(back.cb_kwargs["plain"]) is list
    assert type(back.cb_kwargs["fixed"]) is frozenset
    assert {back.cb_kwargs["pos"]: 1}  # hashable again
    # Stored with its page for re-parse, too.
    assert serialize.loads_value(serialize.dumps_value(kwargs)) == kwargs
    # A set someone else wrote with a list in it is refused, not a crash.
    with pytest.raises(serialize.SerializationError, match="malformed set"):
        serialize.loads('{"url": "http://a.test/", "meta": {"s": {"__set__": [[1]]}}}')
