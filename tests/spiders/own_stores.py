"""A spider that keeps its frontier, pages and blobs in a Redis database, a MongoDB database
and a blob store of its own, through
``custom_settings`` (named by environment variables, so each test picks fresh ones)."""

from __future__ import annotations

import os

from spiders.generic import GenericSpider

_OWN = (("REDIS_URL", "OWN_STORES_REDIS"), ("MONGO_DATABASE", "OWN_STORES_DATABASE"),
        ("BLOB_STORE_URI", "OWN_STORES_BLOBS"))


class OwnStoresSpider(GenericSpider):
    name = "test_own_stores"
    custom_settings = {setting: os.environ[var] for setting, var in _OWN if os.environ.get(var)}
