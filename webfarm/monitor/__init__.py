"""Monitoring: shared per-host figures in Redis, a Prometheus endpoint, alert rules.

* :mod:`webfarm.monitor.metrics` — the figures every worker adds to Redis in time
  buckets, and the reader that turns a window of buckets into rates.
* :mod:`webfarm.monitor.extension` — the Scrapy side: a downloader middleware that
  counts fetches where they happen, and an extension that flushes them, samples the
  frontier and runs the alert rules.
* :mod:`webfarm.monitor.alerts` — the rules and their cooldowns; :mod:`webfarm.monitor.notify`
  — the log line and the webhook.
* :mod:`webfarm.monitor.prometheus` — the per-worker ``/metrics`` endpoint.
* :mod:`webfarm.monitor.table` — the per-host table of ``scrapy frontier``.
"""
