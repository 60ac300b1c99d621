"""Item keys that two pages give different values: found while re-parsing, and said.

An item is upserted on its key (``key_fields``). When the key does not tell two records
apart (two shops' SKUs that meet, a product id shared by its variants), one page's item
replaces the other's: the document holds the page fetched last, with no word.
A re-parse reads every page once, so it sees it: the same key from two pages with other
values. Before, two re-parses in a row of two shops' catalogues said "418 changed" and
"558 changed" for 279 documents, with the extractor unchanged, and left them a mix of the
two shops. The same values from two pages (a product on its page and its print page) are
one record shown twice, and fine.
"""

from __future__ import annotations

import hashlib
import json

from webfarm.itemstore import ItemEntry

MAX_KEYS = 200_000  # keys remembered per run (a clash repeats: the first ones show it)


class KeyClashes:
    """The item keys met in one run, each with its values' hash and page; and the
    collections whose clash was said."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self._met: dict[bytes, tuple[bytes, str]] = {}
        self._said: set[str] = set()

    def meet(self, entry: ItemEntry) -> str | None:
        """The other page's URL when ``entry``'s key came from it with other values."""
        key = hashlib.blake2b(json.dumps([entry.collection, entry.key], sort_keys=True,
                                         default=str).encode(), digest_size=8).digest()
        values = bytes.fromhex(entry.digest)[:8]
        met = self._met.get(key)
        if met is None:
            if len(self._met) < self.max_keys:
                self._met[key] = (values, entry.source_url)
            return None
        if met[0] == values or met[1] == entry.source_url:
            return None
        return met[1]

    def advice_once(self, entry: ItemEntry, other_url: str, spider: str = "SPIDER"
                    ) -> str | None:
        """What to say of a clash, the first time one of ``entry``'s collection is met."""
        if entry.collection in self._said:
            return None
        self._said.add(entry.collection)
        fields = ", ".join(entry.key_fields)
        return (f"{entry.collection!r} item {entry.key!r} came from two pages with other "
                f"values ({other_url}, {entry.source_url}). The document keeps the item of "
                "the page fetched last. If the two pages are one record and one of them an "
                "older copy (not refetched since the site changed), refetch it: scrapy seed "
                f"{spider} --force URL. If they are two records, their key ({fields}) does not "
                "tell them apart: add the field that does to key_fields (for a spider of "
                "several sites, the host: key_fields = ('shop', 'sku')) (said once per "
                "collection)")
