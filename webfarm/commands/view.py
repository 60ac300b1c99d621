"""``scrapy view``: Scrapy's, on its in-memory scheduler (see webfarm.commands._local)."""

from scrapy.commands.view import Command as ScrapyCommand

from webfarm.commands._local import FromStore


class Command(FromStore, ScrapyCommand):
    pass
