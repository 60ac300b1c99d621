"""A catalogue that exists only in JavaScript, for the browser-rung examples (stdlib only).

:class:`JsCatalogue` serves, under a path ``prefix`` (default ``/js/``) of one test-web
host, a listing of ``count`` products of that host's shop and one page per product::

    <prefix>                 listing: links to every product page
    <prefix>product/<sku>    name, price, SKU and category of one product
    anything else under it   404

Every page's HTML is an empty ``<div id="app"></div>``, a ``<noscript>`` asking for
JavaScript and an inline script holding the data base64-encoded; the script builds the
links and the product markup when it runs. So a plain HTTP client finds neither links
nor product text (not even in the source), and a browser finds both. The rendered
markup of a product page::

    <article class="product" data-sku="WF01-0001">
      <h1 class="name">…</h1> <p class="price" data-cents="1234">$12.34</p>
      <p class="sku">WF01-0001</p> <p class="category">Garden</p>
    </article>

Install it with ``JsCatalogue(web.shop(base)).install(web, base)``.
"""

from __future__ import annotations

import base64
import html
import json

from tests.testweb.server import RequestInfo, Response, TestWeb
from tests.testweb.site import Product, Shop

_SCRIPT = """
(function () {
  var data = JSON.parse(atob("%s"));
  var app = document.getElementById("app");
  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    for (var k in attrs) { node.setAttribute(k, attrs[k]); }
    if (text !== undefined) { node.textContent = text; }
    return node;
  }
  app.appendChild(el("h1", {}, data.title));
  if (data.products) {
    var list = el("ul", {"class": "products"});
    data.products.forEach(function (p) {
      var item = el("li", {"class": "product-link"});
      item.appendChild(el("a", {"href": data.prefix + "product/" + p.sku}, p.name));
      list.appendChild(item);
    });
    app.appendChild(list);
  }
  if (data.product) {
    var p = data.product, card = el("article", {"class": "product", "data-sku": p.sku});
    card.appendChild(el("h1", {"class": "name"}, p.name));
    card.appendChild(el("p", {"class": "price", "data-cents": String(p.cents)}, p.price));
    card.appendChild(el("p", {"class": "sku"}, p.sku));
    card.appendChild(el("p", {"class": "category"}, p.category));
    card.appendChild(el("a", {"href": data.prefix}, "All products"));
    app.innerHTML = "";
    app.appendChild(card);
  }
})();
"""


class JsCatalogue:
    """Route handler for ``web.route(prefix, catalogue, host=...)`` (see the module doc)."""

    def __init__(self, shop: Shop, prefix: str = "/js/", count: int = 6) -> None:
        self.shop = shop
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.products: list[Product] = list(shop.products.values())[:count]

    def install(self, web: TestWeb, host: str) -> JsCatalogue:
        web.route(self.prefix, self, host=host, prefix=True)
        return self

    def category_title(self, product: Product) -> str:
        return self.shop.categories[product.category].title

    def __call__(self, info: RequestInfo) -> Response:
        rest = info.path[len(self.prefix):]
        if rest == "":
            return self._page("All products", {"products": [
                {"sku": p.sku, "name": p.name} for p in self.products]})
        if rest.startswith("product/"):
            sku = rest[len("product/"):]
            for p in self.products:
                if p.sku == sku:
                    return self._page(p.name, {"product": {
                        "sku": p.sku, "name": p.name, "price": p.price, "cents": p.price_cents,
                        "category": self.category_title(p)}})
        return Response.html("<!DOCTYPE html><title>Not found</title><h1>Not found</h1>", 404)

    def _page(self, title: str, data: dict) -> Response:
        data = {"title": title, "prefix": self.prefix, **data}
        encoded = base64.b64encode(json.dumps(data).encode()).decode()
        body = (
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(self.shop.name)} (JavaScript edition)</title>\n</head>\n<body>\n"
            "<div id=\"app\"></div>\n"
            "<noscript>This catalogue needs JavaScript: please enable JavaScript.</noscript>\n"
            f"<script>{_SCRIPT % encoded}</script>\n</body>\n</html>\n"
        )
        return Response.html(body, validators=True)
