"""Same content: which page variants hash alike, which do not, and near-duplicates."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import textwrap

import pytest

from webfarm.content import (
    DEFAULT_VOLATILE_PATTERNS,
    content_hash,
    fingerprint,
    hamming,
    is_html,
    normalise_html,
    simhash,
)

PAGE = """<!DOCTYPE html>
<html>
<head>
  <meta charset="utf-8">
  <meta name="csrf-token" content="{csrf}">
  <title>Blue kettle - Shop</title>
  <style>{style}</style>
  <script nonce="{nonce}">{script}</script>
</head>
<body>
  <!-- rendered by web-3 at {stamp} -->
  <nav><a href="/">Home</a> <a href="/cart;jsessionid={session}">Cart</a></nav>
  <h1>Blue kettle</h1>
  <p class="price">Price: <b>{price}</b> EUR</p>
  <p>Last updated {stamp}.</p>
  <form action="/buy" method="post">
    <input type="hidden" name="csrfmiddlewaretoken" value="{csrf}">
    <button>Buy</button>
  </form>
  {extra}
  <a href="{next}">Next product</a>
</body>
</html>
"""

BASE = {
    "csrf": "c5rfT0kenAAA111",
    "nonce": "n0nce1",
    "style": "p { color: red }",
    "script": "window.t = 1714557603;",
    "stamp": "2024-05-01 12:00:03",
    "session": "0A1B2C3D4E5F",
    "price": "29.90",
    "extra": "",
    "next": "/product/2",
}


def page(**changes: str) -> bytes:
    return PAGE.format(**{**BASE, **changes}).encode("utf-8")


def h(body: bytes) -> str:
    return content_hash(body, "text/html; charset=utf-8")


def test_normalised_text_keeps_text_and_links_only() -> None:
    text = normalise_html(page())
    assert text == (
        "Blue kettle - Shop </> Home </cart> Cart Blue kettle Price: 29.90 EUR "
        "Last updated ~. Buy <~/product/2> Next product".replace("<~", "<")
    )


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(page(csrf="OtherToken999zzz"), id="csrf-in-hidden-input-and-meta"),
        pytest.param(page(nonce="zz9", script="window.t = 1714557999; track()"), id="script"),
        pytest.param(page(style="body { margin: 0 } p { color: blue }"), id="style"),
        pytest.param(page(session="FFEE99887766"), id="session-id-in-link"),
        # Tracking parameters a site adds per visit: the frontier drops them from URLs, and
        # they made each fetch a new content (a probe: utm_source=nl1, then nl2).
        pytest.param(page(next="/product/2?utm_source=nl1&utm_medium=mail"), id="utm-in-link"),
        pytest.param(page(next="/product/2?gclid=Cj0KCQ&fbclid=IwAR3"), id="click-ids-in-link"),
        pytest.param(page(stamp="2024-05-02 08:15:59"), id="timestamp-comment-and-text"),
        pytest.param(
            page().replace(b"<!-- rendered by web-3 at 2024-05-01 12:00:03 -->", b"<!-- x -->"),
            id="comment",
        ),
        pytest.param(
            b"\n".join(line.strip() for line in page().splitlines()).replace(b"\n", b""),
            id="minified",
        ),
        pytest.param(
            page().replace(b"\n", b"\r\n\t\t   ").replace(b"> <", b">\n\n<"), id="reindented"
        ),
    ],
)
def test_variants_that_hash_alike(variant: bytes) -> None:
    assert variant != page()
    assert h(variant) == h(page())


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(page(price="31.90"), id="price"),
        pytest.param(page(next="/product/3"), id="link-target"),
        pytest.param(page(next="/product/2?color=red"), id="link-query"),
        pytest.param(page(extra="<p>Out of stock.</p>"), id="extra-paragraph"),
        pytest.param(page().replace(b"Blue kettle</h1>", b"Red kettle</h1>"), id="heading"),
    ],
)
def test_variants_that_do_not_hash_alike(variant: bytes) -> None:
    assert h(variant) != h(page())


def test_volatile_patterns() -> None:
    cases = {
        "Updated 2024-05-01T12:00:03.120+02:00 ok": "Updated ~ ok",
        "Date: Wed, 01 May 2024 12:00:03 GMT.": "Date: ~.",
        "at 05/01/2024 3:04 pm today": "at ~ today",
        "now 23:59:59 here": "now ~ here",
        "posted 3 minutes ago": "posted ~",
        "updated an hour ago, a few seconds ago": "updated ~, ~",
        "Page generated in 0.123 seconds": "Page ~",
        "Ray ID: 8a1b2c3d4e5f6a7b": "Ray ID: ~",
    }
    for raw, expected in cases.items():
        assert normalise_html(f"<p>{raw}</p>".encode()) == expected, raw
    links = {
        # session ids the frontier drops from URLs are dropped from links too
        "https://e.com/x?PHPSESSID=abc123&y=1": "https://e.com/x?y=1",
        "/shop;jsessionid=A1B2C3?page=2": "/shop?page=2",
        "/logout?_wpnonce=9f8e7d6c": "/logout?_wpnonce=~",
        "/feed?csrf_token=abc%2Fdef&x=1": "/feed?csrf_token=~&x=1",
        "/list?page=2&_=1714557603": "/list?page=2&_=~",
        "/cdn-cgi/l/email-protection#7a1b0e": "/cdn-cgi/l/email-protection#~",
    }
    for href, expected in links.items():
        assert normalise_html(f'<a href="{href}">x</a>'.encode()) == f"<{expected}> x", href
    # bare dates, prices, versions and plain numbers are content
    kept = "Published 2024-05-01, price 1,299.00, v2.3.4, order 1714557603, 9:30 to 17:00"
    assert normalise_html(f"<p>{kept}</p>".encode()) == kept


def test_unicode_spaces_collapse_like_ascii_ones() -> None:
    """No-break, thin, ideographic spaces and line separators are whitespace too: a page
    that only swaps them for spaces is the same content."""
    odd = "<p>Blue\u00a0kettle\u3000\u2009 now\u2028\x1fhere\u205f</p><p>\u00a0</p>"
    assert normalise_html(odd.encode()) == "Blue kettle now here"
    assert h(odd.encode()) == h(b"<p>Blue kettle now here</p>")


def test_volatile_fragments_are_masked_anywhere_in_a_large_page() -> None:
    """Date-times are looked for around clock times only; those far into a 100 KB page,
    next to each other or at its very ends are masked all the same."""
    filler = " ".join(f"word{i % 97}" for i in range(12_000))  # about 100 KB of text
    stamps = ["Wed, 01 May 2024 12:00:03 GMT", "2024-05-01T12:00:03Z", "23:59:59"]
    other = ["Thu, 02 May 2024 08:30:00 GMT", "2024-05-02T08:30:00Z", "00:00:01"]

    def page(times: list[str], ray: str) -> bytes:
        middle = f"{filler} Updated {times[0]} and {times[1]} {filler} Ray ID: {ray}"
        return f"<p>{times[2]} {middle} at {times[2]}</p>".encode()

    a, b = page(stamps, "8a1b2c3d4e5f"), page(other, "9f8e7d6c5b4a")
    assert h(a) == h(b)
    assert "~ and ~" in normalise_html(a) and normalise_html(a).startswith("~ word0")
    assert normalise_html(a).endswith("Ray ID: ~ at ~")
    assert h(a) != h(a.replace(b"word5 ", b"word6 ", 1))


@pytest.mark.parametrize("many_colons", [False, True])
def test_clock_times_are_found_as_the_regex_finds_them(
    many_colons: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The colon scan that finds clock times (before the date-time patterns run near
    them) finds what ``\\d:\\d\\d`` finds: Unicode digits, runs like 1:23:45, a colon at
    either end; with many colons it hands over to re itself."""
    from webfarm import volatile

    if many_colons:
        monkeypatch.setattr(volatile, "_CLOCK_COLONS", 0)
    rng = random.Random(11)
    alphabet = ["1", "2", "0", ":", ":", " ", "a", "\u0663", "\u00b2", "x", "9"]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        want = [m.span() for m in volatile._CLOCK.finditer(text)]
        assert volatile._clocks(text) == want, text


def test_custom_volatile_patterns_replace_the_defaults() -> None:
    a = b"<p>Visitors online: 17. Updated 12:00:01</p>"
    b = b"<p>Visitors online: 42. Updated 12:00:01</p>"
    assert content_hash(a, "text/html") != content_hash(b, "text/html")
    mine = (*DEFAULT_VOLATILE_PATTERNS, r"visitors online: \d+")
    assert content_hash(a, "text/html", volatile=mine) == (
        content_hash(b, "text/html", volatile=mine)
    )
    assert "12:00:01" in normalise_html(a, volatile=())


def test_non_html_is_hashed_as_bytes() -> None:
    pdf = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj <<>> endobj\n"
    assert content_hash(pdf, "application/pdf") == hashlib.sha256(pdf).hexdigest()
    as_json = b'{"a": 1,   "b": 2}'
    assert content_hash(as_json, b"application/json") == hashlib.sha256(as_json).hexdigest()
    # an HTML body served as text/plain is what the server said it is
    assert content_hash(page(), "text/plain") == hashlib.sha256(page()).hexdigest()
    # two token variants of a page hash alike only as HTML
    assert content_hash(page(csrf="x"), "text/plain") != content_hash(page(), "text/plain")


def test_html_is_sniffed_when_type_is_missing() -> None:
    assert is_html(page()) and is_html(b"  <html><body>x") and is_html(b"<BODY>x</BODY>")
    assert not is_html(b"%PDF-1.4") and not is_html(b"hello <b>world</b>")
    assert is_html(b"", "application/xhtml+xml; charset=utf-8")
    assert content_hash(page()) == h(page())
    assert content_hash(page(csrf="zzz"), "") == h(page())
    digest = content_hash(page())
    assert len(digest) == 64 and int(digest, 16) >= 0


BROKEN = [
    b"",
    b"   \n\t ",
    b"<",
    b"<<<>>>",
    b"</p></div></html>",
    b"<p>unclosed <b>bold <i>italic <a href='/x'>link",
    b'<p class="never closed>text</p><p>more</p>',
    b"<html><body><table><tr><td>cell<td>cell2</table></p></b></body>",
    b"\x00\x01\x02<p>nul\x00bytes</p>\x00",
    b"\xff\xfe\xfa\xfb random \x80\x81 bytes <p>x</p>",
    b"<?xml version='1.0' encoding='latin-1'?><html><p>caf\xe9</p></html>",
    b"<script>never closed " + b"x" * 5000,
    b"<!-- never closed comment <p>hidden?</p>",
    b"<p>" + b"&#xD800;&#0;&#x110000;&bogus;&amp" + b"</p>",
    "<p>\ud800 lone surrogate</p>".encode("utf-8", "surrogatepass"),
]


@pytest.mark.parametrize("body", BROKEN)
def test_broken_html_does_not_raise(body: bytes) -> None:
    text = normalise_html(body)
    assert isinstance(text, str)
    for ctype in ("text/html", "text/html; charset=utf-8", "text/html; charset=x-bogus", None):
        assert len(content_hash(body, ctype)) == 64


def test_broken_html_keeps_its_text() -> None:
    text = normalise_html(b"<p>unclosed <b>bold <i>italic <a href='/x'>link")
    assert text == "unclosed bold italic </x> link"
    assert normalise_html(b"") == normalise_html(b"  <html></html> ") == ""
    assert content_hash(b"", "text/html") == hashlib.sha256(b"").hexdigest()


def test_pages_without_text_or_links_hash_on_their_markup() -> None:
    """Script-only shells and image-only pages have no visible text: they must not all
    be the empty page's content (a re-parse of one would read another's body)."""
    shell = b"<html><body><div id=root></div><script src='/app-%s.js'></script></body></html>"
    images = b"<html><body><img src='/a.png'><img src='/b.png'></body></html>"
    empty = hashlib.sha256(b"").hexdigest()
    hashes = {h(shell % b"one"), h(shell % b"two"), h(images), h(b"<html></html>"), empty}
    assert len(hashes) == 5  # each its own content
    # still the same content: other whitespace, a volatile fragment masked
    assert h(shell % b"one") == h(b"<html>\n  <body><div id=root></div>"
                                  b"<script src='/app-one.js'></script></body></html>")
    stamped = b"<html><body><script src='/app.js?sessionid=%s'></script></body></html>"
    assert h(stamped % b"abc123") == h(stamped % b"zz9")
    assert h(b"") == h(b"  \n") == empty  # an empty body is the empty content
    assert fingerprint(images, "text/html", with_simhash=True) == (h(images), None)
    assert h(b"<p>text</p>") == hashlib.sha256(b"text").hexdigest()  # text: as before


def test_deep_nesting_does_not_lose_content() -> None:
    # libxml2 gives up past its depth limit; the content after it must still count
    def deep(tail: str) -> bytes:
        return ("<div>" * 3000 + "deep" + "</div>" * 3000 + f"<p>{tail}</p>").encode()

    assert "tail one" in normalise_html(deep("tail one"))
    assert h(deep("tail one")) != h(deep("tail two"))


def test_wrong_and_missing_charsets() -> None:
    latin1 = "<p>Café crème, 5 €</p>".encode("cp1252")
    # declared utf-8 but is cp1252: replacement characters, no exception
    text = normalise_html(latin1, encoding="utf-8")
    assert text.startswith("Caf") and "cr" in text and "5" in text
    assert normalise_html(latin1, encoding="cp1252") == "Café crème, 5 €"
    # unknown charset name: falls back to <meta>, then UTF-8
    with_meta = b'<meta charset="windows-1252">' + latin1
    assert normalise_html(with_meta, encoding="x-no-such-charset") == "Café crème, 5 €"
    assert content_hash(with_meta, "text/html; charset=x-bogus") == content_hash(
        with_meta, "text/html"
    )
    # the charset of the Content-Type is used when no encoding is given
    assert content_hash(latin1, "text/html; charset=cp1252") == content_hash(
        "<p>Café crème, 5 €</p>".encode(), "text/html; charset=utf-8"
    )
    # a BOM wins over a wrong declaration, as in browsers
    utf16 = "\ufeff<p>Grüße</p>".encode("utf-16-le")
    assert normalise_html(utf16, encoding="iso-8859-1") == "Grüße"


KETTLE_WORDS = (
    "kettle water steel handle lid spout boil litre warranty colour blue red green base "
    "cord power watt temperature auto shut off filter limescale cup capacity weight "
    "price delivery return review star customer quality design kitchen brew tea coffee"
)
HIKING_WORDS = (
    "river mountain forest valley trail summit camp weather rain snow wind map compass "
    "boot jacket tent hike ridge lake bridge path guide season spring autumn winter"
)
WORDS = KETTLE_WORDS.split()
OTHER = HIKING_WORDS.split()


def prose(words: list[str], n: int, seed: int) -> str:
    rng = random.Random(seed)
    sentences = []
    while n > 0:
        k = min(n, rng.randint(6, 16))
        sentences.append(" ".join(rng.choice(words) for _ in range(k)).capitalize() + ".")
        n -= k
    return " ".join(sentences)


def article(words: list[str], seed: int, banner: str = "") -> bytes:
    paragraphs = "".join(f"<p>{prose(words, 60, seed * 100 + i)}</p>\n" for i in range(12))
    return f"<html><body>{banner}<h1>Title</h1>{paragraphs}</body></html>".encode()


def test_simhash_near_and_far() -> None:
    base = simhash(normalise_html(article(WORDS, 1)))
    banner = '<div class="banner"><a href="/sale">Summer sale: 20% off everything</a></div>'
    with_banner = simhash(normalise_html(article(WORDS, 1, banner)))
    unrelated = simhash(normalise_html(article(OTHER, 2)))
    assert 0 < hamming(base, with_banner) <= 6
    assert hamming(base, unrelated) >= 20
    assert 0 <= base < 2**64
    assert simhash("") == 0
    assert 0 < simhash("one two", bits=128) < 2**128
    assert simhash("one") != simhash("two")  # under three words: one shingle
    for bad in (60, 32, 576):
        with pytest.raises(ValueError):
            simhash("x", bits=bad)


def test_simhash_votes_the_same_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Huge pages are voted on in chunks of shingles (bounded memory): same result."""
    from webfarm import neardup

    text = prose(WORDS, 5000, 7)
    whole = simhash(text)
    monkeypatch.setattr(neardup, "_CHUNK", 333)
    assert simhash(text) == whole


def test_simhash_values_do_not_change() -> None:
    # contents.simhash holds these: a new algorithm would orphan every stored value
    # (a page would stop matching its near-duplicates stored before).
    assert simhash("the quick brown fox jumps over the lazy dog") == 0x83629D4CF90E139F
    assert simhash("Ça coûte 12,50 € — naïve café’s “crème” brûlée") == 0x98A34CF96C6B51F5


def test_fingerprint_remembers_bodies_it_met(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body met before is answered from memory, but only with the same arguments;
    the memory is bounded."""
    from collections import OrderedDict

    from webfarm import content

    body = "<p>Чайник синий, 12:00:03</p>".encode("cp1251")
    want = {  # computed without the memory: content_hash() does not use it
        "cp1251": content_hash(body, "text/html", "cp1251"),
        "utf-8": content_hash(body, "text/html", "utf-8"),
        "no patterns": content_hash(body, "text/html", "cp1251", ()),
    }
    assert len(set(want.values())) == 3  # the charset and the patterns matter here
    monkeypatch.setattr(content, "_CACHE", OrderedDict())
    monkeypatch.setattr(content, "FINGERPRINT_CACHE", 3)
    normalised: list[bytes] = []
    real = content.normalise_html
    monkeypatch.setattr(content, "normalise_html",
                        lambda body, *a: normalised.append(body) or real(body, *a))
    first = fingerprint(body, "text/html", "cp1251", DEFAULT_VOLATILE_PATTERNS, True)
    assert first == (want["cp1251"], simhash("Чайник синий, ~"))
    again = fingerprint(body, "text/html", "cp1251", list(DEFAULT_VOLATILE_PATTERNS), True)
    assert again == first and len(normalised) == 1  # from memory
    # another charset, other patterns, no SimHash: each computed, and right
    assert fingerprint(body, "text/html", "utf-8", DEFAULT_VOLATILE_PATTERNS, True)[0] == \
        want["utf-8"]
    assert fingerprint(body, "text/html", "cp1251", (), True)[0] == want["no patterns"]
    assert fingerprint(body, "text/html", "cp1251", DEFAULT_VOLATILE_PATTERNS) == (
        want["cp1251"], None)
    assert len(normalised) == 4
    for i in range(5):
        fingerprint(f"<p>page {i}</p>".encode(), "text/html")
    assert len(content._CACHE) == 3


def test_simhash_words_are_what_the_regex_finds() -> None:
    """SimHash splits words with bytes.split where it can; every word must still be
    what ``\\w+`` finds: accents, other scripts, digits of other scripts, joiners,
    emoji, lone surrogates and ASCII punctuation between them."""
    from webfarm import neardup

    rng = random.Random(5)
    alphabet = [*"ab Z_9.,;:-'\"<>/=?&\t", "\u00e9", "\u2019", "\u00a0", "\u0663", "\u00df",
                "\u0130", "\u0301", "\u4e2d", "\u200b", "\U0001f600", "\u00b2", "\u01c5",
                "\ud800", "\x00"]
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        want = [w.encode() for w in neardup._WORD.findall(text)]
        assert neardup._words(text) == want, repr(text)


def test_simhash_is_stable_across_processes() -> None:
    # it is stored, so it must not depend on PYTHONHASHSEED or the machine
    code = textwrap.dedent(
        """
        from webfarm.content import simhash
        print(simhash("the quick brown fox jumps over the lazy dog " * 20))
        """
    )
    values = set()
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        values.add(int(out.stdout))
    assert values == {simhash("the quick brown fox jumps over the lazy dog " * 20)}


def test_hamming() -> None:
    assert hamming(0, 0) == 0
    assert hamming(0b1011, 0b0001) == 2
    assert hamming(2**64 - 1, 0) == 64


def test_volatile_patterns_setting_adds_to_the_defaults() -> None:
    from scrapy.settings import Settings

    from pipelines.content import PageHasher
    from webfarm.content import fingerprint, volatile_patterns

    one = b"<html><body><p>Order ref ORD-1234 placed</p><p>Price 9.99</p></body></html>"
    two = one.replace(b"ORD-1234", b"ORD-9876")
    assert content_hash(one, "text/html") != content_hash(two, "text/html")
    settings = Settings({"WEBFARM_VOLATILE_PATTERNS": [r"\bORD-\d+"]})
    hasher = PageHasher.from_settings(settings, threads=None)  # type: ignore[arg-type]
    assert hasher.volatile[: len(DEFAULT_VOLATILE_PATTERNS)] == DEFAULT_VOLATILE_PATTERNS
    assert fingerprint(one, "text/html", volatile=hasher.volatile) == fingerprint(
        two, "text/html", volatile=hasher.volatile)
    changed_price = one.replace(b"9.99", b"8.99")
    assert fingerprint(one, "text/html", volatile=hasher.volatile) != fingerprint(
        changed_price, "text/html", volatile=hasher.volatile)
    assert volatile_patterns("a\n\nb") == (*DEFAULT_VOLATILE_PATTERNS, "a", "b")
    with pytest.raises(ValueError, match="WEBFARM_VOLATILE_PATTERNS: '\\(oops'"):
        volatile_patterns(["(oops"])


def test_volatile_times_off_keeps_a_changed_time_a_change() -> None:
    """A timetable or an event page: its time is the content. With the built-in masking
    a moved departure was "unchanged", its new body never stored."""
    from scrapy.settings import Settings

    from pipelines.content import PageHasher

    page = b"<p>Flight LH123 departs %s</p><p>Request ID: %s</p><p>Seen 3 minutes ago</p>"
    one, two = page % (b"2026-12-24 10:15", b"a1b2c3d4e5"), page % (b"2026-12-24 11:45",
                                                                    b"f6e5d4c3b2")
    assert content_hash(one, "text/html") == content_hash(two, "text/html")  # the default
    off = PageHasher.from_settings(Settings({"WEBFARM_VOLATILE_TIMES": False}),
                                   threads=None).volatile  # type: ignore[arg-type]
    assert content_hash(one, "text/html", volatile=off) != content_hash(
        two, "text/html", volatile=off)
    # the other built-in patterns still apply: a new request id alone is no change
    assert content_hash(one, "text/html", volatile=off) == content_hash(
        one.replace(b"a1b2c3d4e5", b"0f0f0f0f0f"), "text/html", volatile=off)
    again = one.replace(b"3 minutes", b"9 minutes")
    assert content_hash(one, "text/html", volatile=off) != content_hash(
        again, "text/html", volatile=off)


def test_json_ld_counts_other_scripts_do_not() -> None:
    """JSON-LD is the data extractors read first: a product out of stock there, with the
    visible text unchanged, is a change. Other scripts (nonces, build ids) are not."""
    page = ('<html><head><title>Kettle</title><script type="application/ld+json">'
            '{"@type": "Product", "offers": {"availability": "%s"}}</script>'
            '<script nonce="%s">boot()</script></head><body><h1>Kettle</h1>'
            '<button>Add to cart</button></body></html>')
    in_stock = (page % ("InStock", "n1")).encode()
    assert h(in_stock) != h((page % ("OutOfStock", "n1")).encode())
    assert h(in_stock) == h((page % ("InStock", "n2")).encode())
    reformatted = in_stock.replace(b'{"@type": "Product", ', b'{\n  "@type":  "Product",\n  ')
    assert h(in_stock) == h(reformatted)
    # the same in the fallback for documents libxml2 cannot build (deep nesting here)
    deep = "<div>" * 3000 + "x" + "</div>" * 3000
    assert h((page % ("InStock", "n1")).replace("<h1>", deep + "<h1>").encode()) != h(
        (page % ("OutOfStock", "n1")).replace("<h1>", deep + "<h1>").encode())
    assert "InStock" in normalise_html(
        b"<script type='Application/LD+JSON '>{\"a\": \"InStock\"}</script>")


def test_structured_data_in_attributes_counts_other_attributes_do_not() -> None:
    """Microdata, RDFa and data ``<meta>`` are written for machines, as JSON-LD is: two
    product pages that differed only there were one content, and a re-parse of the second
    read the first one's body, another host's too (its price, its form's target)."""
    shop = ('<html><head><title>Kettle</title>{meta}</head><body><div itemscope>'
            '<h1 itemprop="name">Kettle</h1>{prop}<img src="/k.jpg?v={v}" class="{cls}" '
            'data-track="{v}"><a href="/buy">Buy</a></div></body></html>')
    base = {"meta": '<meta property="og:price:amount" content="100.00">',
            "prop": '<meta itemprop="price" content="100.00">', "v": "1", "cls": "a"}

    def kettle(**changes: str) -> bytes:
        return shop.format(**{**base, **changes}).encode()

    for changed in (
        {"prop": '<meta itemprop="price" content="1.00">'},
        {"prop": '<link itemprop="availability" href="https://schema.org/OutOfStock">'},
        {"prop": '<img itemprop="image" src="/other.jpg">'},
        {"prop": '<span property="price" content="1.00">100.00</span>'},  # RDFa
        {"meta": '<meta property="og:price:amount" content="1.00">'},
        {"meta": '<meta name="description" content="A red kettle">'},
        {"meta": '<meta name="twitter:data1" content="1.00">'},
    ):
        assert h(kettle(**changed)) != h(kettle()), changed
    for same in (  # markup, cache-busters, scripts' attributes and page chrome
        {"v": "2", "cls": "b"},
        {"meta": base["meta"] + '<meta name="csrf-token" content="x9">'
                                '<meta name="viewport" content="width=device-width">'},
        {"prop": base["prop"].replace('"price"', ' "price" ').replace("100.00", " 100.00")},
    ):
        assert h(kettle(**same)) == h(kettle()), same
    modified = '<meta itemprop="dateModified" content="2024-05-01T%sZ">' + base["prop"]
    assert h(kettle(prop=modified % "12:00:03")) == h(kettle(prop=modified % "13:41:07"))
    # the same in the fallback for documents libxml2 cannot build (deep nesting here)
    deep = "<div>" * 3000 + "x" + "</div>" * 3000
    assert h(kettle(prop=deep + base["prop"])) != h(
        kettle(prop=deep + '<meta itemprop="price" content="1.00">'))
    assert h(kettle(prop=deep + base["prop"], v="2")) == h(kettle(prop=deep + base["prop"]))
