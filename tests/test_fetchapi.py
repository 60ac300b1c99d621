"""The fetch API's answer turned into the page: JSON that UTF-8 cannot carry as it is."""

from __future__ import annotations

import json

from scrapy import Request
from scrapy.http import TextResponse

from webfarm.fetchapi import FetchAPI


def answer(payload: str) -> TextResponse:
    return TextResponse("http://api.test/fetch", status=200, body=payload.encode(),
                        encoding="utf-8", headers={"Content-Type": "application/json"})


def test_half_a_surrogate_pair_in_the_answer_still_gives_the_page():
    # What json.dumps writes for a page text whose emoji was cut in half.
    payload = json.dumps({"status": 200, "url": "http://shop.test/p", "headers": {
        "X-Note": "cut \ud83d", "Content-Language": "en"},
        "content": "<html><body><p>great \ud83d</p></body></html>"})
    assert "\\ud83d" in payload
    api = FetchAPI("http://api.test/fetch", "", 60.0)
    page = api.page(Request("http://shop.test/p"), answer(payload))
    assert page.status == 200 and page.url == "http://shop.test/p"
    assert page.body == b"<html><body><p>great \xed\xa0\xbd</p></body></html>"
    assert page.css("p::text").get().startswith("great \ufffd")
    assert page.headers["X-Note"] == b"cut ?" and page.headers["Content-Language"] == b"en"
