"""scrapy-redis's Redis dupefilter, keyed by webfarm's request fingerprint.

The fingerprint is the canonical URL (tracking parameters and fragment
dropped), method and body, so ``?utm_source=x`` variants are one page. Closing a
worker never deletes the shared set.
"""

from __future__ import annotations

from scrapy import Request, Spider
from scrapy_redis import defaults
from scrapy_redis.dupefilter import RFPDupeFilter

from webfarm.redisconn import redis_client


class RedisDupeFilter(RFPDupeFilter):
    fingerprinter = None

    @classmethod
    def from_spider(cls, spider: Spider) -> RedisDupeFilter:
        settings = spider.settings
        key = settings.get("SCHEDULER_DUPEFILTER_KEY", defaults.SCHEDULER_DUPEFILTER_KEY)
        df = cls(redis_client(settings), key=key % {"spider": spider.name},
                 debug=settings.getbool("DUPEFILTER_DEBUG"))
        df.fingerprinter = spider.crawler.request_fingerprinter
        return df

    def request_fingerprint(self, request: Request) -> str:
        if self.fingerprinter is None:
            return super().request_fingerprint(request)
        return self.fingerprinter.fingerprint(request).hex()

    def close(self, reason: str = "") -> None:
        """Keep the shared set: other workers still use it; reset is explicit."""
