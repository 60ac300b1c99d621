"""``scrapy seed``, ``scrapy frontier`` and ``scrapy dlq`` as a user runs them: real
subprocesses on a real Valkey and the test web; assertions on output and Redis state."""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess

import pymongo
import pytest
import redis
from scrapy.settings import Settings
from scrapy.utils.project import get_project_settings

from tests import runner
from tests.testweb import Response, TestWeb
from webfarm.commands import seed
from webfarm.commands._common import CommandError, spider_class
from webfarm.frontier import Entry, Frontier
from webfarm.queue import open_frontier
from webfarm.serialize import loads
from webfarm.urls import host_of

FRONTIER_KEYS = {
    "spider", "prefix", "redis", "queued", "hosts", "ready_hosts", "delayed", "leased",
    "leases_by_worker", "dead", "seen", "seen_exact", "dupefilter", "dupefilter_bytes",
    "bloom_layers", "retried", "waited", "expired", "default_delay", "host_budget", "hosts_listed",
    "at",
    "per_host",
}
LETTER_KEYS = {"reason", "status", "error", "attempts", "first", "last", "host", "priority",
               "worker", "method", "url", "requeueable"}


@pytest.fixture(scope="module")
def small_web():
    """A small shop of its own (26 pages, 10 products in its sitemap) on 127.0.0.5."""
    with TestWeb(hosts=("127.0.0.5",), categories=2, products_per_category=5) as web:
        yield web


@pytest.fixture()
def shop(small_web):
    small_web.clear_hits()
    small_web.clear_routes()
    return small_web


@pytest.fixture()
def client(redis_url):
    server = redis.Redis.from_url(redis_url)
    yield server
    server.close()


def frontier_of(client: redis.Redis, delay: float = 1.0) -> Frontier:
    settings = Settings({"DUPEFILTER_CLASS": "webfarm.dupefilter.BloomDupeFilter",
                         "SCHEDULER_QUEUE_CLASS": "webfarm.frontier.Frontier",
                         "WEBFARM_HOST_DELAY": delay})
    return open_frontier(settings, "generic", client)


def run(stores, *args: str, **env: str) -> runner.Result:
    # Plain HTTP: these tests are about the frontier, not the browser rung.
    env = {"WEBFARM_RENDER": "http", **stores, **env}
    return runner.scrapy(list(args), runner.env_for(**env), timeout=120)


def ok(result: runner.Result) -> str:
    assert result.returncode == 0, result.output[-3000:]
    return result.stdout


def fails(result: runner.Result, code: int, message: str) -> None:
    """Exit ``code``, one line on stderr containing ``message``, no traceback."""
    assert result.returncode == code, result.output[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.output


def queued_urls(frontier: Frontier, client: redis.Redis) -> list[str]:
    urls = []
    for host in frontier.host_stats():
        for member in client.zrange(frontier.key("q:" + host["host"]), 0, -1):
            urls.append(loads(member.decode().split(":", 3)[3])["url"])
    return sorted(urls)


def stored(stores) -> list[str]:
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    return [doc["url"] for doc in db.pages.find()]


# -- seed ----------------------------------------------------------------------------------


def test_seed_urls_and_file_through_the_dupefilter(stores, client, tmp_path):
    urls = tmp_path / "urls.txt"
    # saved with a byte order mark, as Excel and Notepad do: its first line was refused
    urls.write_text("\ufeff# start pages\nhttp://127.0.0.2:81/a\n\n  http://127.0.0.3:82/b  \n"
                    "http://127.0.0.2:81/a?utm_source=mail\n", encoding="utf-8")
    out = ok(run(stores, "seed", "generic", "http://127.0.0.2:81/c", "-f", str(urls)))
    assert "3 enqueued, 0 already seen, 1 repeated in the input (4 URLs given)" in out
    frontier = frontier_of(client)
    assert queued_urls(frontier, client) == [
        "http://127.0.0.2:81/a", "http://127.0.0.2:81/c", "http://127.0.0.3:82/b"]
    # The entry is what a worker writes: JSON of Request.to_dict, the spider's default callback.
    popped = frontier.pop("test")
    request = loads(popped.payload)
    assert request["callback"] is None and request["method"] == "GET"
    frontier.release([popped.lease_id])

    again = ok(run(stores, "seed", "generic", "http://127.0.0.2:81/c", "-f", str(urls)))
    assert "0 enqueued, 3 already seen" in again
    assert frontier.counts()["queued"] == 3
    forced = ok(run(stores, "seed", "generic", "--force", "http://127.0.0.2:81/c"))
    assert "1 enqueued, 1 of them seen before (--force)" in forced
    assert frontier.counts()["queued"] == 4

    # A host budget bounds seeds too, --force or not: host 127.0.0.2:81 has used 2 of 3, so
    # /p0 is its last new URL; /c, seen before, goes again with --force.
    more = [f"http://127.0.0.2:81/p{i}" for i in range(3)]
    budget = ok(run(stores, "seed", "generic", "--force", "-s", "WEBFARM_HOST_BUDGET=3",
                    "http://127.0.0.2:81/c", *more))
    assert ("2 enqueued, 1 of them seen before (--force), 2 over their host's budget "
            "(WEBFARM_HOST_BUDGET=3)") in budget
    assert frontier.counts()["queued"] == 6


def test_seed_bad_input_is_one_line_and_enqueues_nothing(stores, client, tmp_path, shop):
    bad = tmp_path / "bad.txt"
    bad.write_text("http://127.0.0.2:81/ok\nhttp://127.0.0.2:81/ok2\nmailto:someone@example.com\n")
    fails(run(stores, "seed", "generic", "-f", str(bad)), 2, "bad.txt, line 3: 'mailto:")
    base = shop.base_urls[0]
    shop.route("/page.xml", Response.html("<html><body>not a sitemap</body></html>"))
    fails(run(stores, "seed", "generic", "http://127.0.0.2:81/x", "--sitemap",
              f"{base}/page.xml"), 2, "is not a sitemap (root element <html>")
    assert client.keys("webfarm:*") == []  # nothing half-enqueued, not even the good URLs
    fails(run({**stores, "REDIS_URL": "redis://127.0.0.1:1/0"}, "seed", "generic",
              "http://127.0.0.2/"), 1, "REDIS_URL: cannot reach")


def test_seed_input_checks_in_process(tmp_path):
    """The other one-line refusals, without a process each (the same code paths)."""
    with pytest.raises(CommandError, match="argument: 'ftp://h/y' is not an http"):
        seed_command()._seed("generic", ["http://127.0.0.2/x", "ftp://h/y"], seed_opts())
    with pytest.raises(CommandError, match="nothing to seed"):
        seed_command()._seed("generic", [], seed_opts())
    with pytest.raises(CommandError, match="--sitemap: 'ftp://x/s.xml' is not an http"):
        seed_command()._seed("generic", [], seed_opts(sitemaps=["ftp://x/s.xml"]))
    with pytest.raises(CommandError, match="--max-urls 0: give 1 or more"):
        seed_command()._seed("generic", [], seed_opts(sitemaps=["http://x/s.xml"], max_urls=0))
    with pytest.raises(CommandError, match="--priority 4503599627370497 is out of range: "
                                           "give a whole number from -4503599627370496 to"):
        seed_command()._seed("generic", ["http://127.0.0.2/x"], seed_opts(priority=2**52 + 1))
    # Scrapy's downloader fails on these at every try; the password is not printed. Both
    # are refused before a frontier is opened (no Redis here: an embedded one would start).
    with pytest.raises(CommandError, match=r"argument: 'http://\*\*\*@127.0.0.2/x' cannot be "
                                           "fetched: a user:password@ in the URL"):
        seed_command()._seed("generic", ["http://me:secret@127.0.0.2/x"], seed_opts())
    with pytest.raises(CommandError, match="argument: 'http://127.0.0.2:0/x' cannot be "
                                           "fetched: port 0"):
        seed_command()._seed("generic", ["http://127.0.0.2:0/x"], seed_opts())
    urls = tmp_path / "urls.txt"  # a file given as an argument, without -f
    urls.write_text("http://127.0.0.2/x\n")
    with pytest.raises(CommandError, match=re.escape(
            f"argument: '{urls}' is not an http(s) URL; it is a file: to read URLs from it, "
            f"give -f {urls} (nothing was enqueued)")):
        seed_command()._seed("generic", [str(urls)], seed_opts())
    with pytest.raises(CommandError, match="cannot read .*missing.txt: No such file"):
        seed.UrlFile(str(tmp_path / "missing.txt"))
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CommandError, match="not UTF-8 text"):
        seed.UrlFile(str(binary))
    with pytest.raises(CommandError, match="no spider named 'nosuchspider'"):
        spider_class(get_project_settings(), "nosuchspider")


def test_a_long_url_list_is_streamed_with_progress_and_still_all_or_nothing(
        redis_url, client, tmp_path, monkeypatch, capsys):
    """A URL file was held whole, then every entry built in memory before the first push:
    836 MB for a million URLs, about 8 GB for the ten million a data team may have. It is
    now checked in one pass and read again a line at a time (stdin through a temporary
    file), with a line every PROGRESS_EVERY URLs; a bad line still enqueues nothing."""
    monkeypatch.setattr(seed, "PROGRESS_EVERY", 1000)
    urls = [f"http://h{i % 7}.test/p/{i}" for i in range(2500)]
    good = "\n".join(urls[:1200] + ["# a comment", ""] + urls[1200:] + [urls[5]]) + "\n"
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join(urls + ["ftp://x/"]) + "\n")
    command = seed_command()
    command.settings.set("REDIS_URL", redis_url)
    with pytest.raises(CommandError, match=r"bad.txt, line 2501: 'ftp://x/' is not an http"
                                           r".*nothing was enqueued"):
        command._seed("generic", [], seed_opts(files=[str(bad)]))
    assert client.keys("webfarm:*") == []
    monkeypatch.setattr("sys.stdin", io.StringIO(good))
    command._seed("generic", [], seed_opts(files=["-"]))
    out = capsys.readouterr()
    assert out.out.strip() == ("seeded generic: 2500 enqueued, 0 already seen, 1 repeated in "
                               "the input (2501 URLs given)")
    assert out.err.splitlines() == ["seeding generic: 1,000 of about 2,501 URLs sent",
                                    "seeding generic: 2,000 of about 2,501 URLs sent"]
    assert queued_urls(frontier_of(client), client) == sorted(urls)


def test_seeds_outside_a_site_spider_s_hosts_are_said_at_once(redis_url, client, capsys):
    """Its workers' offsite filter hands such URLs back until they are dead letters: said
    when they are seeded, not minutes later in a worker's log. They are enqueued all the
    same (a worker run with -a start= or -a domains= may take them)."""
    command = seed_command()
    command.settings.set("REDIS_URL", redis_url)
    # Another port of its host is outside too: its workers follow 8081 only (the message
    # named the host without its port, and such a URL was counted inside).
    # One given twice is one request, and counted outside once (15 of 13 were said).
    urls = ["http://127.0.0.2:8081/a", "http://127.0.0.3:8081/b", "http://127.0.0.3/c",
            "http://127.0.0.2:9090/d", "http://127.0.0.3:8081/b"]
    command._seed("catalogue", urls, seed_opts())
    out = capsys.readouterr()
    assert out.out.startswith("seeded catalogue: 4 enqueued")
    assert out.err.splitlines() == [
        "seed catalogue: 3 of the URLs are outside the spider's hosts (127.0.0.2:8081): a "
        "worker hands them back until they are dead letters, unless workers run with "
        "-a domains=HOST,... (or -a start=URL,...) that include them"]
    command._seed("generic", urls, seed_opts())  # its hosts come from -a only: not judged
    assert capsys.readouterr().err == ""


def seed_command() -> seed.Command:
    command = seed.Command()
    command.settings = get_project_settings()
    return command


def seed_opts(**overrides):
    import argparse

    values = {"files": [], "sitemaps": [], "force": False, "priority": 0, "max_urls": 10}
    return argparse.Namespace(**{**values, **overrides})



def test_frontier_shows_the_delay_of_a_spiders_download_delay_attribute(stores):
    """Scrapy maps the deprecated attribute onto DOWNLOAD_DELAY in a crawl only: the
    commands showed the project's delay for such a spider."""
    doc = json.loads(ok(run(stores, "frontier", "test_delay_attribute", "--json",
                            "-s", "SPIDER_MODULES=spiders,tests.spiders")))
    assert doc["default_delay"] == 3.5

def test_seed_a_sitemap_then_crawl_with_no_start_urls(stores, client, shop):
    """robots.txt -> sitemap; index -> gzip sitemap; then a worker with only -a domains."""
    base = shop.base_urls[0]
    products = {u for u in shop.expected_pages(base) if "/product/" in u and "/print/" not in u}
    out = ok(run(stores, "seed", "generic", "--sitemap", base))
    assert f"{len(products)} enqueued, 0 already seen" in out
    assert "2 sitemap documents read" in out  # robots.txt and sitemap.xml
    again = ok(run(stores, "seed", "generic", "--sitemap", f"{base}/sitemap_index.xml"))
    assert f"0 enqueued, {len(products)} already seen" in again
    frontier = frontier_of(client)
    assert set(queued_urls(frontier, client)) == products

    crawl = run(stores, "crawl", "generic", "-a", f"domains={host_of(base)}",
                WEBFARM_IDLE_TIMEOUT="1")
    assert crawl.returncode == 0, crawl.output[-3000:]
    pages = stored(stores)
    assert len(pages) == len(set(pages)) and set(pages) == shop.expected_pages(base)
    fetched = [h.path for h in shop.hits_for(host=base) if h.path.startswith("/product/")]
    assert len(fetched) == len(set(fetched))  # seeded pages fetched once, not again as links
    doc = json.loads(ok(run(stores, "frontier", "generic", "--json")))
    assert (doc["queued"], doc["leased"], doc["delayed"], doc["dead"]) == (0, 0, 0, 0)
    assert doc["seen"] >= len(shop.expected_pages(base))


# -- frontier ------------------------------------------------------------------------------


def test_frontier_table_json_and_reset(stores, client):
    frontier = frontier_of(client, delay=0)
    entries = [Entry("busy.test", 0, f"b{i}".encode(), json.dumps({"url": f"http://busy.test/{i}"}))
               for i in range(5)]
    entries += [Entry("quiet.test:8080", 0, b"q", json.dumps({"url": "http://quiet.test:8080/"}))]
    frontier.push(entries)
    frontier.set_delay("quiet.test:8080", 60.0)  # not due again while the test runs
    frontier.defer_host("busy.test", 300)
    frontier.pop("vm1:81:a1b2c3")  # quiet.test's only entry: now leased by that worker

    table = ok(run(stores, "frontier", "generic", "--top", "1"))
    lines = table.splitlines()
    assert lines[0].startswith("frontier webfarm:{generic}: on redis://")
    assert any(line.split()[:2] == ["queued", "5"] for line in lines)
    assert "  leased   1   in flight on 1 worker: vm1:81:a1b2c3 (1)" in lines
    header = next(i for i, line in enumerate(lines) if line.startswith("HOST"))
    assert lines[header].split() == ["HOST", "QUEUED", "URLS", "DELAY", "NEXT", "ALLOWED"]
    busy = lines[header + 1].split()
    # WEBFARM_HOST_DELAY=0 in the tests' environment: the command reads the same settings
    assert busy[:4] == ["busy.test", "5", "5", "0s"] and busy[-2] == "in" and busy[-1][-1] in "sm"
    assert "quiet.test" not in table and lines[header + 2] == "… and 1 more hosts (--top 0 " \
        "lists all)"

    doc = json.loads(ok(run(stores, "frontier", "generic", "--json")))
    assert set(doc) == FRONTIER_KEYS
    assert (doc["queued"], doc["hosts"], doc["ready_hosts"], doc["leased"]) == (5, 1, 0, 1)
    assert doc["leases_by_worker"] == {"vm1:81:a1b2c3": 1}
    assert doc["dupefilter"] == "bloom" and doc["seen"] == 6 and doc["dupefilter_bytes"] > 0
    assert [h["host"] for h in doc["per_host"]] == ["busy.test", "quiet.test:8080"]
    assert set(doc["per_host"][0]) == {"host", "queued", "urls", "delay", "next_allowed_in"}
    assert doc["per_host"][0]["urls"] == 5 and doc["host_budget"] == 0
    assert 200 < doc["per_host"][0]["next_allowed_in"] <= 300
    assert doc["per_host"][1]["delay"] == 60.0

    # A worker exchanged lately: reset under it, its "lost writes" warning promised pages
    # the reset had deleted, and it pushed its links into the emptied frontier.
    fails(run(stores, "frontier", "generic", "--reset", "--yes"), 2,
          "1 worker(s) of generic exchanged with the frontier in the last 2 minutes "
          "(vm1:81:a1b2c3); stop them first")
    frontier.release_worker("vm1:81:a1b2c3")  # as a worker closing does
    frontier.pop("vm2:82:d4e5f6")
    fails(run(stores, "frontier", "generic", "--reset"), 2, "(vm2:82:d4e5f6); stop them")
    # A worker of this machine killed with kill -9 still counts: said as gone, not as live.
    gone = subprocess.Popen(["true"])
    gone.wait()
    killed = f"{socket.gethostname()}:{gone.pid}:0a0b0c"
    frontier.pop(killed)
    fails(run(stores, "frontier", "generic", "--reset", "--yes"), 2,
          f"; 1 of them ({killed}) named this machine and no process of theirs runs here: "
          "killed, they count until 2 minutes after their last exchange; stop them first")
    # Its lease is no work in flight: the summary says the worker is gone (it looked live
    # for the lease's 10 minutes).
    frontier.push([Entry("held.test", 0, b"h", json.dumps({"url": "http://held.test/"}))])
    assert frontier.pop(killed) is not None
    assert f"{killed} (1; gone, its leases expire)" in ok(run(stores, "frontier", "generic"))
    frontier.release_worker(killed)
    fails(run(stores, "frontier", "generic", "--reset", "--force"), 2, "add --yes to confirm")
    assert frontier.counts()["queued"] == 7  # quiet.test's, given back by vm1; held.test's
    out = ok(run(stores, "frontier", "generic", "--reset", "--yes", "--force"))
    assert "reset generic: deleted" in out
    assert client.keys("webfarm:{generic}:*") == []


# -- dlq -----------------------------------------------------------------------------------


def dead_letters_setup(client: redis.Redis) -> Frontier:
    frontier = frontier_of(client, delay=0)
    cases = [("http://a.test/1", "gave up after 5 attempts: HTTP 503", 503, None),
             ("http://a.test/2", "gave up after 5 attempts: HTTP 503", 503, None),
             ("http://user:s3cret@b.test/3", "download failed: TunnelError", None,
              "TunnelError via http://proxyuser:pw@proxy.test:8080")]
    for url, reason, status, error in cases:  # one at a time: a known order in the list
        frontier.push([Entry(host_of(url), 7, url.encode(), json.dumps({"url": url}))])
        popped = frontier.pop("w")
        frontier.retry(popped.lease_id, 0, reason)  # one earlier attempt
        popped = frontier.pop("w")
        assert popped is not None and loads(popped.payload)["url"] == url
        frontier.dead(popped.lease_id, reason, status=status, error=error)
    frontier.dead(None, "malformed queue entry", payload="\x00garbage")
    return frontier


def test_dlq_list_requeue_and_purge(stores, client):
    frontier = dead_letters_setup(client)
    table = ok(run(stores, "dlq", "generic"))
    assert table.splitlines()[0] == "4 dead letters in webfarm:{generic}:dead"
    assert "REASON" in table and "(not a request)" in table
    assert "gave up after 5 attempts: HTTP 503" in table and "http://a.test/1" in table
    assert "s3cret" not in table and "pw@" not in table and "http://***@b.test/3" in table
    # the proxy error is past its column's 40 characters: cut, and said where it is whole
    assert "TunnelError via http://***@proxy.test:8…" in table
    assert table.splitlines()[-1] == ("(a cell ending in … is cut: --json has every reason "
                                      "and error whole)")

    full = json.loads(ok(run(stores, "dlq", "generic", "--list", "--json", "--limit", "0")))
    assert (full["total"], full["matched"], full["listed"]) == (4, 4, 4)
    letter = full["letters"][0]
    assert set(letter) == LETTER_KEYS
    assert (letter["status"], letter["attempts"], letter["url"]) == (503, 2, "http://a.test/1")
    assert letter["last"] >= letter["first"] > 0 and letter["requeueable"] is True
    assert full["letters"][2]["error"] == "TunnelError via http://***@proxy.test:8080"
    assert full["letters"][3]["requeueable"] is False
    some = json.loads(ok(run(stores, "dlq", "generic", "--json", "--reason", "503",
                             "--limit", "1")))
    assert (some["total"], some["matched"], some["listed"]) == (4, 2, 1)
    # One host's letters: an "HTTP 503" names no host (only --reason was there)
    host = ok(run(stores, "dlq", "generic", "--url", "//a.test/", "--reason", "503"))
    assert host.splitlines()[0] == ("4 dead letters in webfarm:{generic}:dead, 2 with a "
                                    "reason matching '503' and with a URL matching '//a.test/'")
    assert "purged 0 dead letters" in ok(run(stores, "dlq", "generic", "--purge", "--url",
                                             "//b.test/", "--reason", "503"))
    fails(run(stores, "dlq", "generic", "--url", "("), 2, "--url '(' is not a regular")

    out = ok(run(stores, "dlq", "generic", "--requeue", "--reason", "HTTP 50[0-9]$"))
    assert "requeued 2 dead letters" in out
    counts = frontier.counts()
    assert (counts["queued"], counts["dead"]) == (2, 2)
    popped = [frontier.pop("w2") for _ in range(2)]
    assert sorted(loads(p.payload)["url"] for p in popped) == ["http://a.test/1",
                                                               "http://a.test/2"]
    assert [p.attempts for p in popped] == [0, 0]  # attempts reset
    rest = ok(run(stores, "dlq", "generic", "--requeue"))
    assert "requeued 1 dead letters" in rest and "1 are not requests and stay" in rest
    assert frontier.counts()["dead"] == 1
    assert "purged 0 dead letters" in ok(run(stores, "dlq", "generic", "--purge", "--reason",
                                             "nothing-like-this"))
    assert "purged 1 dead letters" in ok(run(stores, "dlq", "generic", "--purge"))
    assert frontier.counts()["dead"] == 0


def test_dlq_table_and_filters_in_process():
    from webfarm.commands import dlq

    assert dlq.mask_credentials("see http://u:p@h/x and https://tok@h2/") == \
        "see http://***@h/x and https://***@h2/"
    with pytest.raises(CommandError, match="is not a regular expression"):
        dlq._pattern("(")
    letter = {"reason": "r", "host": "h.test", "priority": 3, "payload": '{"url": "http://h/"}'}
    assert dlq.requeue_entry(letter) == Entry("h.test", 3, b"", '{"url": "http://h/"}', True)
    for bad in ({**letter, "payload": "{nope"}, {**letter, "host": None},
                {**letter, "host": "a b"}, {**letter, "priority": 1.5}):
        assert dlq.requeue_entry(bad) is None


# -- malformed entries under a real crawl --------------------------------------------------


def test_garbage_in_a_queue_is_dead_lettered_never_run(stores, client, shop):
    base = shop.base_urls[0]
    host = host_of(base)
    frontier = frontier_of(client)
    frontier.push([Entry(host, 0, b"home", json.dumps({"url": f"{base}/"}))])
    queue = frontier.key("q:" + host)
    evil = json.dumps({"url": f"{base}/evil", "_class": "os.system"})
    client.zadd(queue, {
        b"\xff\xfe raw garbage": -100,                                    # not our member format
        b"000000000001:0:1700000000:{not json": -100,                    # our format, not JSON
        f"000000000002:0:1700000000:{evil}".encode(): -100,              # a foreign class
        ("000000000003:0:1700000000:" + json.dumps(
            {"url": f"{base}/evil2", "callback": "no_such_method"})).encode(): -100,
    })
    client.set(frontier.key("q:foreign.test"), b"not a sorted set")      # a foreign key type
    client.zadd(frontier.key("ready"), {"foreign.test": 0})

    crawl = run(stores, "crawl", "generic", "-a", f"domains={host}", WEBFARM_IDLE_TIMEOUT="1")
    assert crawl.returncode == 0, crawl.output[-3000:]
    assert set(stored(stores)) == shop.expected_pages(base)
    assert not [h for h in shop.hits_for(host=base) if h.path.startswith("/evil")]

    doc = json.loads(ok(run(stores, "dlq", "generic", "--json")))
    reasons = sorted(letter["reason"] for letter in doc["letters"])
    assert len(reasons) == 5, reasons
    assert sum("malformed queue entry" in r for r in reasons) == 1
    assert sum("malformed frontier entry: not JSON" in r for r in reasons) == 1
    assert sum("request class 'os.system' is not allowed" in r for r in reasons) == 1
    assert sum("not a request of this spider" in r for r in reasons) == 1
    assert sum("queue key is not a sorted set" in r for r in reasons) == 1
    out = ok(run(stores, "dlq", "generic", "--requeue"))
    # only the entry naming a missing callback is JSON of a request; it fails again on a worker
    assert "requeued 1 dead letters" in out and "4 are not requests and stay" in out


def test_a_reader_that_stops_early_ends_the_listing_quietly(monkeypatch):
    """``scrapy frontier SPIDER | head``: the listing stops with the reader, as ``ls |
    head`` does; it ended with a BrokenPipeError traceback."""
    import os
    import sys

    from webfarm.commands import dlq, frontier, recrawl
    from webfarm.commands._common import pipe_may_close

    read, write = os.pipe()
    os.close(read)  # the reader is gone
    monkeypatch.setattr(sys, "stdout", os.fdopen(write, "w"))

    @pipe_may_close
    def listing() -> None:
        for n in range(20_000):  # past any pipe and stdout buffer
            print(f"host-{n}.example 3 queued")

    listing()  # returns: no BrokenPipeError
    print("after")  # and nothing is left to fail at exit
    sys.stdout.flush()
    for command in (frontier.Command, dlq.Command, recrawl.Command):
        assert command.run.__wrapped__  # type: ignore[attr-defined]


def test_a_second_requeue_or_purge_waits_for_the_first(redis_url, tmp_path):
    """Two `scrapy dlq --requeue` at once both pushed the same letters before removing
    them: 5,501 requeued from 5,001 letters, 1,000 URLs queued twice."""
    frontier = frontier_of(redis.Redis.from_url(redis_url))
    frontier.push([Entry("a.test", 0, b"fp-a", json.dumps({"url": "http://a.test/x"}))])
    frontier.dead(frontier.pop("w").lease_id, "HTTP 500", status=500)
    server = redis.Redis.from_url(redis_url)
    server.set("webfarm:{generic}:dlq:busy", "scrapy dlq --requeue on box:7", px=60_000)
    env = runner.env_for(REDIS_URL=redis_url)
    busy = runner.scrapy(["dlq", "generic", "--requeue"], env, 60)
    assert busy.returncode == 1 and ("another change to generic's dead letters is running "
                                     "(scrapy dlq --requeue on box:7)") in busy.stderr
    assert frontier.counts()["dead"] == 1 and frontier.counts()["queued"] == 0
    server.delete("webfarm:{generic}:dlq:busy")
    done = runner.scrapy(["dlq", "generic", "--requeue"], env, 60)
    assert done.returncode == 0 and "requeued 1 dead letters" in done.stdout, done.output
    assert frontier.counts()["queued"] == 1 and server.get("webfarm:{generic}:dlq:busy") is None


def test_a_mistyped_option_is_named_not_taken_for_a_missing_spider(stores):
    """Scrapy hands a command the options it does not know as arguments: `scrapy reparse
    acme --dryrun` said "name one spider", as if the spider were missing."""
    for command, slip in (("reparse", "--dryrun"), ("frontier", "--rest")):
        result = run(stores, command, "generic", slip)
        assert result.returncode == 2 and "Traceback" not in result.output, result.output
        assert f"error: no option {slip} (see `scrapy {command} -h`)" in result.stderr
    result = run(stores, "dlq")
    assert result.returncode == 2 and "error: name one spider: scrapy dlq SPIDER" in \
        result.stderr
