"""``scrapy shell``: Scrapy's, on its in-memory scheduler (see webfarm.commands._local).

Like Scrapy's shell, it filters no duplicates: ``fetch()`` of the same URL again fetches.
"""

from scrapy.commands.shell import Command as ScrapyCommand

from webfarm.commands._local import LOCAL, FromStore


class Command(FromStore, ScrapyCommand):
    local = {**LOCAL, "DUPEFILTER_CLASS": "scrapy.dupefilters.BaseDupeFilter"}
