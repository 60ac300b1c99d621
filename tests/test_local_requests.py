"""``meta["webfarm_local"]``: a request the worker that made it fetches, never queued in
Redis. A login form's POST is one: with two workers on one frontier, the login of one
worker went to whichever worker popped it (that one's cookie jar got the session, the
other crawled the members' pages logged out), and the password was written to Redis."""

from __future__ import annotations

import base64
import contextlib
import threading

import pytest
import redis

from tests import crawlcheck, runner
from tests.testweb import Response, TestWeb

PAGES = 30


def login(info):
    if info.method != "POST" or b"password=s3cret-pw" not in info.body:
        return Response.html("<title>Log in</title>", status=403)
    return Response.html("<title>Welcome</title>", headers={
        "Set-Cookie": f"session=ok-{info.port}; Path=/"})


def members(info):
    if "session=ok-" not in info.headers.get("cookie", ""):
        return Response(302, {"Location": "/login-form"})
    n = int(info.path.rstrip("/").rsplit("/", 1)[-1] or 0) if info.path != "/members/" else 0
    links = "".join(f'<a class="member" href="/members/{i}">{i}</a>'
                    for i in range(n + 1, min(n + 4, PAGES)))
    return Response.html(f"<title>Member {n}</title><body>{links}</body>")


@pytest.fixture()
def club():
    with TestWeb(hosts=("127.0.0.9",)) as web:
        base = web.base_urls[0]
        web.route("/login", login, host=base)
        web.route("/members/", members, host=base)
        yield web


def test_each_worker_logs_in_itself_and_the_password_never_reaches_redis(club, stores,
                                                                         tmp_path):
    base = club.base_urls[0]
    env = runner.env_for(**stores, WEBFARM_HOST_DELAY="0.3", WEBFARM_IDLE_TIMEOUT="2")
    args = ["crawl", "test_members", "-a", f"start={base}/",
            "-s", "SPIDER_MODULES=spiders,tests.spiders"]
    written: list[bytes] = []  # every command Redis got while the workers ran (MONITOR)
    monitor = redis.Redis.from_url(stores["REDIS_URL"]).monitor()
    monitor.__enter__()

    def listen() -> None:
        with contextlib.suppress(redis.RedisError, OSError, ValueError):
            for command in monitor.listen():
                written.append(command["command"].encode("utf-8", "surrogateescape"))

    reader = threading.Thread(target=listen, daemon=True)
    reader.start()
    procs = [runner.popen(args, env, tmp_path / f"{w}.log") for w in "ab"]
    try:
        assert [p.wait(90) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        monitor.connection.disconnect()
        reader.join(10)
    logs = [(tmp_path / f"{w}.log").read_text() for w in "ab"]
    assert all("Traceback" not in log for log in logs)
    logins = club.hits_for(host=base, path="/login")
    assert [h.method for h in logins] == ["POST", "POST"]  # one per worker
    pages = [h for h in club.hits_for(host=base) if h.path.startswith("/members/")]
    assert sorted(h.path for h in pages) == sorted(
        ["/members/"] + [f"/members/{i}" for i in range(1, PAGES)])  # each once
    assert all("session=ok-" in h.headers.get("cookie", "") for h in pages)  # logged in
    assert not club.hits_for(host=base, path="/login-form")
    # The members' pages are kept (a callback of a WebfarmSpider); the login's answer, a
    # page of one worker's session, is not.
    assert set(crawlcheck.pages(stores)) == {base + h.path for h in pages}
    for log in logs:
        assert crawlcheck.stat(log, "webfarm/frontier/local") == 1, log[-2000:]
        assert crawlcheck.stat(log, "webfarm/frontier/dequeued") > 0  # both crawled
    # The form's body, as it would be queued (bytes are base64 in a frontier entry), or as is.
    body = b"user=ann&password=s3cret-pw"
    assert written and not any(b"s3cret-pw" in c or base64.b64encode(body) in c
                               for c in written)


def test_a_login_answered_503_is_tried_again(club, stores):
    """A ``webfarm_local`` request has no lease: a 503 to it used to end it without a word
    (the frontier it was handed to does not hold it): the login's callback never ran, so
    the members' pages were never asked for. A local request is deduplicated in its
    worker."""
    base = club.base_urls[0]
    answered: list[int] = []

    def busy_once(info):
        answered.append(503 if not answered else 200)
        return Response.html("<title>Busy</title>", status=503) if answered[-1] == 503 \
            else login(info)

    club.route("/login", busy_once, host=base)
    club.route("/account", lambda info: Response.html("<title>Account</title>"), host=base)
    env = runner.env_for(**stores, WEBFARM_IDLE_TIMEOUT="1")
    result = runner.scrapy(["crawl", "test_members", "-a", f"start={base}/", "-a",
                            "account_links=2", "-s", "SPIDER_MODULES=spiders,tests.spiders"],
                           env, timeout=90)
    assert result.returncode == 0, result.output[-3000:]
    assert answered == [503, 200]
    # Two links to one local page: fetched once, as Scrapy's own scheduler does (before,
    # a local request was not deduplicated).
    assert len(club.hits_for(host=base, path="/account")) == 1
    pages = [h for h in club.hits_for(host=base) if h.path.startswith("/members/")]
    assert len(pages) == PAGES and all("session=ok-" in h.headers.get("cookie", "")
                                       for h in pages)
    assert crawlcheck.stat(result.stderr, "retry/count") == 1


def test_a_login_queued_to_the_frontier_is_said_once_with_what_to_do(club, stores):
    """The textbook FormRequest login, with cookies off (webfarm's default): the password
    went to Redis, the session cookie was not sent on, and the members' pages redirected
    back to the form ("redirect loop"), with no word of why."""
    base = club.base_urls[0]
    result = runner.scrapy(["crawl", "test_members", "-a", f"start={base}/", "-a", "local=0",
                            "-s", "COOKIES_ENABLED=False",
                            "-s", "SPIDER_MODULES=spiders,tests.spiders"],
                           runner.env_for(**stores), timeout=120)
    assert result.returncode == 0, result.output[-3000:]
    assert result.output.count("is a POST queued to the shared frontier") == 1
    assert ("and COOKIES_ENABLED is False: the session cookie it sets is not sent with the "
            "next requests") in result.output
    assert "meta={'webfarm_local': True} and COOKIES_ENABLED=True" in result.output
