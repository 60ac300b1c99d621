"""``scrapy check``: Scrapy's, on its in-memory scheduler (see webfarm.commands._local).

On the frontier its contract requests (wrapped callbacks) could not be queued, and it
reported "Ran 0 contracts ... OK": every contract skipped, and a pass.
"""

from scrapy.commands.check import Command as ScrapyCommand

from webfarm.commands._local import LocalScheduling


class Command(LocalScheduling, ScrapyCommand):
    pass
