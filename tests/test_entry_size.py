"""A request too big for the frontier is refused where the spider yields it, saying what to
pass instead. Redis keeps every queued request in memory, and a spider that hands each
link's callback its page's HTML queued a copy of the page per link: a crawl of 1 MB pages
with 100 links each asks Redis for 100 MB a page."""

from __future__ import annotations

from tests import crawlcheck, runner
from tests.testweb import Response, TestWeb

HOST = "127.0.0.16"


def test_a_request_carrying_a_page_is_refused_and_the_others_are_fetched(stores):
    filler = "<p>" + "lorem ipsum dolor sit amet " * 45_000 + "</p>"  # 1.2 MB, over 1 MiB
    links = "".join(f'<a href="/{name}">{name}</a>' for name in
                    ("light-1", "heavy-1", "light-2", "heavy-2"))
    with TestWeb(hosts=(HOST,), categories=1, products_per_category=1) as web:
        base = web.base_urls[0]
        web.route("/big", Response.html(f"<title>Big</title>{links}{filler}"), host=base)
        for name in ("light-1", "heavy-1", "light-2", "heavy-2"):
            web.route(f"/{name}", Response.html(f"<title>{name}</title>"), host=base)
        result = runner.scrapy(
            ["crawl", "test_carry", "-a", f"start={base}/big",
             "-s", "SPIDER_MODULES=spiders,tests.spiders"],
            runner.env_for(**stores, WEBFARM_IDLE_TIMEOUT="2"), timeout=120)
        fetched = sorted(h.path for h in web.hits_for(host=base))
    assert result.returncode == 0 and "Traceback" not in result.output, result.output[-3000:]
    assert fetched == ["/big", "/light-1", "/light-2"]
    refused = [line for line in result.stderr.splitlines() if "Cannot queue" in line]
    assert len(refused) == 2, refused
    assert all("over WEBFARM_MAX_ENTRY_BYTES=1,048,576" in line
               and "not a page or its body" in line for line in refused), refused
    assert {line.split("<GET ")[1].split(">")[0] for line in refused} == {
        f"{base}/heavy-1", f"{base}/heavy-2"}
    assert crawlcheck.stat(result.stderr, "webfarm/frontier/unserializable") == 2
    assert crawlcheck.stat(result.stderr, "item_scraped_count") == 2
