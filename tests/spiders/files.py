"""A spider that follows links to files too (PDFs, images): the README's way, a
``LinkExtractor`` without Scrapy's ignored extensions."""

from __future__ import annotations

from scrapy.linkextractors import LinkExtractor

from spiders.generic import GenericSpider


class FilesSpider(GenericSpider):
    name = "test_files"
    link_extractor = LinkExtractor(unique=True, deny_extensions=[])
