"""The catalogue one test-web host serves: deterministic pages, no I/O, stdlib only.

Every host is a :class:`Shop` with its own name, so the same path on two hosts gives two
different bodies. Rendering depends only on the constructor arguments, so bodies, ETags and
content hashes are the same on every run.

Paths served (``C`` categories, ``P`` products per category, ``per_page`` products a page)::

    /                           home: nav to every category, /about, featured products
    /about                      about page
    /category/<slug>            same body as ?page=1 (home and product pages link here)
    /category/<slug>?page=N     N in 1..ceil(P/per_page); anything else is 404
    /product/<sku>              name, price, description, SKU, category link, related links
    /print/product/<sku>        byte-identical body to /product/<sku> (every product links it)
    /robots.txt                 allow all, "Sitemap: <base>/sitemap.xml"
    /sitemap.xml                every /product/<sku> (canonical URL, no params)
    /sitemap_index.xml          points to /sitemap-products.xml.gz
    /sitemap-products.xml.gz    gzip of a sitemap with the same URLs as /sitemap.xml
    anything else               404 HTML page

Unknown query parameters are ignored (real shops ignore tracking parameters), so every
tracking variant below returns the same body as its clean URL.

Link variants that appear in the HTML (the duplicates a crawler must see through):

- category listings link product number ``j`` of the category (0-based) as
  ``/product/<sku>`` if ``j % 3 == 0``, ``/product/<sku>?utm_source=nav&utm_medium=category``
  if ``j % 3 == 1``, and ``/product/<sku>#reviews`` if ``j % 3 == 2``;
- home links the first product of each category as
  ``/product/<sku>?utm_campaign=featured&gclid=wf-test``;
- product pages link up to three related products as ``/product/<sku>?utm_content=related``, their
  own ``#reviews`` anchor, and ``/print/product/<sku>``;
- the footer links ``/about?fbclid=wf-test``;
- pagination: page N links ``?page=N-1`` and ``?page=N+1`` (relative, query only); the last
  page also links ``?page=1`` (a loop back to the start);
- the first host's home page links the second host's home (the only cross-host link).

``expected_pages`` is what a crawler that follows every in-host ``<a href>`` from ``/`` and
canonicalises URLs must store: tracking parameters (``utm_*``, ``gclid``, ``fbclid``)
removed, fragment dropped, then ``w3lib.url.canonicalize_url`` (query arguments sorted).
It contains ``/``, ``/about``, every ``/category/<slug>`` *and* every ``?page=N`` of it,
every ``/product/<sku>`` and every ``/print/product/<sku>``; not robots.txt, sitemaps, 404s
or the other host. ``expected_contents`` counts distinct bodies among them:
``/category/<slug>`` equals its ``?page=1`` and each print page equals its product, so
with the defaults (3 x 12, 5 a page) a host has 86 pages and 47 distinct bodies.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import math
import random
from dataclasses import dataclass
from urllib.parse import parse_qs

TRACKING_PARAMS = ("utm_source", "utm_medium", "utm_campaign", "utm_content", "gclid", "fbclid")
"""Every query parameter the site adds to links that does not change the page."""

SHOP_NAMES = (
    "Acme Outfitters", "Bluebird Supply Co.", "Copperleaf Goods", "Driftwood Market",
    "Evergreen Emporium", "Foxglove & Sons", "Granite Hardware", "Hollow Oak Traders",
)
CATEGORY_SLUGS = ("garden", "kitchen", "workshop", "books", "outdoor", "toys", "lighting")
_ADJECTIVES = (
    "Sturdy", "Classic", "Compact", "Deluxe", "Rustic", "Modern", "Handmade", "Folding",
    "Vintage", "Heavy-duty", "Featherweight", "Everyday", "Weatherproof",
)
_NOUNS = (
    "Trowel", "Watering Can", "Kettle", "Skillet", "Chisel", "Workbench", "Atlas", "Notebook",
    "Lantern", "Hammock", "Kite", "Spinning Top", "Desk Lamp", "Pruner", "Colander", "Vise",
)
_LASTMOD = "2024-01-01"

CSS = (
    "body{font-family:Georgia,serif;margin:0 auto;max-width:52em;color:#222}"
    "nav a{margin-right:1em}.price{font-weight:bold;color:#063}"
    "footer{margin-top:3em;font-size:.8em;color:#666}"
)


_REVIEW_WORDS = (
    "great", "value", "arrived", "quickly", "works", "as", "described", "would", "buy",
    "again", "the", "a", "and", "not", "very", "quite", "sturdy", "flimsy", "colour", "size",
    "after", "weeks", "use", "recommend", "my", "family", "loves", "it", "box", "was",
    "damaged", "but", "item", "fine", "cheaper", "than", "shop", "down", "road",
)


@dataclass(frozen=True)
class Product:
    sku: str
    name: str
    price_cents: int
    description: str
    category: str  # slug
    position: int  # 0-based place in its category

    @property
    def price(self) -> str:
        return f"${self.price_cents // 100}.{self.price_cents % 100:02d}"


@dataclass(frozen=True)
class Category:
    slug: str
    title: str
    products: tuple[Product, ...]


@dataclass(frozen=True)
class Page:
    """What the site answers for one path: the server adds headers and validators."""

    status: int
    content_type: str
    body: bytes


HTML_TYPE = "text/html; charset=utf-8"


class Shop:
    """One host's catalogue. ``base_url`` is needed for robots.txt and sitemaps only."""

    def __init__(
        self,
        index: int,
        base_url: str,
        categories: int = 3,
        products_per_category: int = 12,
        per_page: int = 5,
        peer_url: str | None = None,
        reviews_kb: int = 0,
    ) -> None:
        if categories < 1 or products_per_category < 1 or per_page < 1:
            raise ValueError("categories, products_per_category and per_page must be >= 1")
        self.reviews_kb = max(0, reviews_kb)
        self._reviews: dict[str, str] = {}
        self.index = index
        self.base_url = base_url.rstrip("/")
        self.per_page = per_page
        self.peer_url = peer_url
        self.name = SHOP_NAMES[index] if index < len(SHOP_NAMES) else f"Shop {index + 1}"
        self.categories: dict[str, Category] = {}
        self.products: dict[str, Product] = {}
        for c in range(categories):
            slug = CATEGORY_SLUGS[c] if c < len(CATEGORY_SLUGS) else f"category-{c + 1}"
            items = tuple(self._product(c, slug, i) for i in range(products_per_category))
            self.categories[slug] = Category(slug, slug.replace("-", " ").title(), items)
            self.products.update((p.sku, p) for p in items)

    def _product(self, c: int, slug: str, i: int) -> Product:
        adjective = _ADJECTIVES[(i * 5 + c + self.index) % len(_ADJECTIVES)]
        noun = _NOUNS[(i + c * 3) % len(_NOUNS)]
        name = f"{adjective} {noun}"
        cents = 499 + ((c + 1) * 7919 + (i + 1) * 104729 + self.index * 3571) % 20000
        description = (
            f"The {name.lower()} from {self.name} is built to last. "
            f"Item {i + 1} of our {slug} range, chosen by our buyers for everyday use. "
            f"Ships in {2 + (i + c) % 5} working days."
        )
        return Product(f"WF{c + 1:02d}-{i + 1:04d}", name, cents, description, slug, i)

    # ---- what a crawler should find -------------------------------------------------------

    def pages_of(self, category: Category) -> int:
        return max(1, math.ceil(len(category.products) / self.per_page))

    def page_paths(self) -> list[str]:
        """Clean path+query of every page reachable by in-host links from ``/``."""
        paths = ["/", "/about"]
        for cat in self.categories.values():
            paths.append(f"/category/{cat.slug}")
            paths += [f"/category/{cat.slug}?page={n}" for n in range(1, self.pages_of(cat) + 1)]
        for sku in self.products:
            paths += [f"/product/{sku}", f"/print/product/{sku}"]
        return paths

    def expected_pages(self) -> set[str]:
        """Canonical URLs a link-following crawler must store (see the module docstring)."""
        from w3lib.url import canonicalize_url  # only needed here; the server stays stdlib

        return {canonicalize_url(self.base_url + p) for p in self.page_paths()}

    def expected_contents(self) -> int:
        """How many distinct bodies the expected pages have."""
        bodies = set()
        for p in self.page_paths():
            path, _, query = p.partition("?")
            bodies.add(hashlib.sha256(self.render(path, query).body).digest())
        return len(bodies)

    # ---- rendering ------------------------------------------------------------------------

    def render(self, path: str, query: str = "") -> Page:
        """The page for ``path`` (no query) with raw ``query``; unknown paths give a 404 page."""
        if path == "/":
            return _html(self._home())
        if path == "/about":
            return _html(self._about())
        if path == "/robots.txt":
            text = f"User-agent: *\nAllow: /\n\nSitemap: {self.base_url}/sitemap.xml\n"
            return Page(200, "text/plain; charset=utf-8", text.encode())
        if path == "/sitemap.xml":
            return Page(200, "application/xml", self._sitemap())
        if path == "/sitemap_index.xml":
            return Page(200, "application/xml", self._sitemap_index())
        if path == "/sitemap-products.xml.gz":
            return Page(200, "application/gzip", gzip.compress(self._sitemap(), mtime=0))
        if path.startswith("/category/"):
            cat = self.categories.get(path[len("/category/"):])
            page = _page_number(query)
            if cat is not None and page is not None and 1 <= page <= self.pages_of(cat):
                return _html(self._category(cat, page))
        for prefix in ("/product/", "/print/product/"):
            if path.startswith(prefix) and path[len(prefix):] in self.products:
                return _html(self._product_page(self.products[path[len(prefix):]]))
        return self.not_found(path)

    def not_found(self, path: str) -> Page:
        body = self._layout("Page not found", f"<h1>Not found</h1><p>No page at <code>"
                            f"{html.escape(path)}</code>.</p>", "404")
        return Page(404, HTML_TYPE, body.encode())

    def _layout(self, title: str, main: str, kind: str, head: str = "") -> str:
        nav = "".join(
            f'<a href="/category/{c.slug}">{html.escape(c.title)}</a>'
            for c in self.categories.values()
        )
        name = html.escape(self.name)
        return (
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)} | {name}</title>\n{head}"
            f"<style>{CSS}</style>\n"
            "<script>window.dataLayer = window.dataLayer || [];"
            f' dataLayer.push({{"shop": {self.index}, "page": "{kind}"}});</script>\n'
            f"</head>\n<body>\n<header><a class=\"logo\" href=\"/\">{name}</a>\n"
            f"<nav><a href=\"/\">Home</a>{nav}<a href=\"/about\">About</a></nav></header>\n"
            f"<main>\n{main}\n</main>\n"
            f"<footer>&copy; 2024 {name} &middot; "
            "<a href=\"/about?fbclid=wf-test\">About us</a></footer>\n</body>\n</html>\n"
        )

    def _home(self) -> str:
        cats = "".join(
            f'<li><a href="/category/{c.slug}">{html.escape(c.title)}</a>'
            f" ({len(c.products)} products)</li>"
            for c in self.categories.values()
        )
        featured = "".join(
            f'<li><a href="/product/{c.products[0].sku}?utm_campaign=featured&amp;gclid=wf-test">'
            f"{html.escape(c.products[0].name)}</a></li>"
            for c in self.categories.values()
        )
        peer = ""
        if self.peer_url:
            peer = (f'<p>Visit our sister shop at <a href="{self.peer_url}/">'
                    f"{self.peer_url}</a>.</p>")
        main = (
            f"<h1>Welcome to {html.escape(self.name)}</h1>\n<h2>Departments</h2><ul>{cats}</ul>\n"
            f"<h2>Featured</h2><ul>{featured}</ul>\n{peer}"
        )
        return self._layout("Home", main, "home")

    def _about(self) -> str:
        main = (
            f"<h1>About {html.escape(self.name)}</h1>\n<p>We have sold honest goods since "
            f"{1950 + self.index * 7}. {len(self.products)} products in "
            f"{len(self.categories)} departments.</p>\n<p><a href=\"/\">Back to the shop</a></p>"
        )
        return self._layout("About us", main, "about")

    def _category(self, cat: Category, page: int) -> str:
        start = (page - 1) * self.per_page
        items = []
        for p in cat.products[start:start + self.per_page]:
            href = f"/product/{p.sku}" + (
                "", "?utm_source=nav&amp;utm_medium=category", "#reviews"
            )[p.position % 3]
            items.append(
                f'<li class="product"><a href="{href}">{html.escape(p.name)}</a>'
                f' <span class="price">{p.price}</span></li>'
            )
        last = self.pages_of(cat)
        pager = []
        if page > 1:
            pager.append(f'<a rel="prev" href="?page={page - 1}">Previous</a>')
        if page < last:
            pager.append(f'<a rel="next" href="?page={page + 1}">Next</a>')
        else:
            pager.append('<a href="?page=1">Back to first page</a>')
        main = (
            f"<h1>{html.escape(cat.title)}</h1>\n<p>Page {page} of {last}</p>\n"
            f"<ul class=\"products\">{''.join(items)}</ul>\n"
            f"<div class=\"pager\">{' '.join(pager)}</div>"
        )
        head = f'<link rel="canonical" href="/category/{cat.slug}?page={page}">\n'
        return self._layout(f"{cat.title} - page {page}", main, "category", head)

    def _product_page(self, p: Product) -> str:
        cat = self.categories[p.category]
        n = len(cat.products)
        related = [cat.products[(p.position + k) % n] for k in (1, 2, 3) if k < n]
        rel = "".join(
            f'<li><a href="/product/{r.sku}?utm_content=related">{html.escape(r.name)}</a></li>'
            for r in related
        )
        main = (
            f"<article class=\"product\">\n<h1>{html.escape(p.name)}</h1>\n"
            f"<p class=\"price\">{p.price}</p>\n<p class=\"sku\">SKU: {p.sku}</p>\n"
            f"<p class=\"description\">{html.escape(p.description)}</p>\n"
            f"<p>Category: <a href=\"/category/{cat.slug}\">{html.escape(cat.title)}</a></p>\n"
            f"<p><a href=\"#reviews\">Read reviews</a> &middot; "
            f"<a href=\"/print/product/{p.sku}\">Printable version</a></p>\n"
            f"<section id=\"reviews\"><h2>Reviews</h2>{self._reviews_of(p)}</section>\n"
            f"<h2>Related products</h2><ul class=\"related\">{rel}</ul>\n</article>"
        )
        head = f'<link rel="canonical" href="/product/{p.sku}">\n'
        return self._layout(p.name, main, "product", head)

    def _reviews_of(self, p: Product) -> str:
        """``reviews_kb`` KB of review text, the same on every request and different for
        every product (real product pages weigh about 100 KB; the default is none)."""
        if not self.reviews_kb:
            return "<p>No reviews yet.</p>"
        if p.sku not in self._reviews:
            rng = random.Random(f"{self.index}/{p.sku}")
            words = _ADJECTIVES + _NOUNS + _REVIEW_WORDS
            parts: list[str] = []
            size = 0
            while size < self.reviews_kb * 1024:
                text = " ".join(rng.choice(words) for _ in range(rng.randint(12, 40)))
                parts.append(f'<div class="review"><p>{text.capitalize()}.</p></div>\n')
                size += len(parts[-1])
            self._reviews[p.sku] = "".join(parts)
        return self._reviews[p.sku]

    def _sitemap(self) -> bytes:
        urls = "".join(
            f"<url><loc>{self.base_url}/product/{sku}</loc><lastmod>{_LASTMOD}</lastmod></url>\n"
            for sku in self.products
        )
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
            f"{urls}</urlset>\n"
        ).encode()

    def _sitemap_index(self) -> bytes:
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
            f"<sitemap><loc>{self.base_url}/sitemap-products.xml.gz</loc>"
            f"<lastmod>{_LASTMOD}</lastmod></sitemap>\n</sitemapindex>\n"
        ).encode()


def _html(text: str) -> Page:
    return Page(200, HTML_TYPE, text.encode("utf-8"))


def _page_number(query: str) -> int | None:
    """``page`` from the query (1 when absent); None when it is not a positive integer."""
    values = parse_qs(query).get("page")
    if not values:
        return 1
    return int(values[0]) if values[0].isdigit() else None
