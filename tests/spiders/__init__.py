"""Spiders used by the tests only (add with ``-s SPIDER_MODULES=spiders,tests.spiders``)."""
