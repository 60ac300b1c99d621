"""The per-worker Prometheus endpoint (``WEBFARM_PROMETHEUS_PORT``).

Counters are this worker's own since it started (Prometheus sums workers); the
frontier gauges and firing alerts are the shared ones read from Redis at scrape
time (every worker reports the same value: aggregate them with ``max``).

Label cardinality is bounded: at most ``WEBFARM_PROMETHEUS_TOP_HOSTS`` hosts get
their own ``host`` label, the busiest when the slots were handed out; every other
host is summed into ``host="other"``. A host keeps its slot for the worker's
life, so every series stays a monotonic counter (no spurious resets in ``rate``).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from webfarm.monitor.metrics import GAUGES, OTHER_HOSTS, SPIDER_HOST, MetricsStore, Recorder

logger = logging.getLogger(__name__)
OTHER = "other"
RULES = ("success_rate", "queue_growth", "dead_letters", "no_progress")
MAX_ERROR_KINDS = 20  # per host label; the rest are kind="other"

# name -> help; the exporter's metric names (the Grafana dashboard test reads this).
METRICS = {
    "webfarm_requests": "Fetches sent to the downloader",
    "webfarm_responses": "Responses by status class, before retries and HTTP-error filtering",
    "webfarm_errors": "Fetches that ended in a network error, by exception class",
    "webfarm_download_latency_seconds": "Download latency",
    "webfarm_response_bytes": "Response body bytes",
    "webfarm_fetches": "Responses by fetch method (http, browser or api)",
    "webfarm_items": "Items that went through every pipeline",
    "webfarm_duplicates": "Pages whose content was already stored",
    **{f"webfarm_frontier_{g}": f"Frontier {g.replace('_', ' ')} (shared, sampled)"
       for g in GAUGES},
    "webfarm_alerts_firing": "Alerts firing now, per rule",
}


class WorkerCollector(Collector):
    def __init__(self, spider: str, recorder: Recorder, store: MetricsStore, top_hosts: int,
                 alerts_key: str) -> None:
        self.spider = spider
        self.recorder = recorder
        self.store = store
        self.top_hosts = top_hosts
        self.alerts_key = alerts_key
        self._labelled: set[str] = set()
        self._lock = threading.Lock()

    def _label_of(self, totals: dict[str, dict[str, float]]) -> dict[str, str]:
        with self._lock:
            busiest = sorted((h for h in totals if h != OTHER_HOSTS),
                             key=lambda h: -totals[h].get("requests", 0.0))
            for host in busiest:
                if len(self._labelled) >= self.top_hosts:
                    break
                self._labelled.add(host)
            label = {h: (h if h in self._labelled else OTHER) for h in totals}
            label[OTHER_HOSTS] = OTHER
            return label

    def collect(self) -> Iterator[Metric]:
        totals = self.recorder.totals()
        totals.pop(SPIDER_HOST, None)
        label = self._label_of(totals)
        merged: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for host, metrics in totals.items():
            for name, value in metrics.items():
                merged[label[host]][name] += value
        yield from self._counters(merged)
        yield from self._shared()

    def _counters(self, merged: dict[str, dict[str, float]]) -> Iterator[Metric]:
        sp = self.spider
        fam = {n: CounterMetricFamily(n, METRICS[n], labels=["spider", "host"]) for n in
               ("webfarm_requests", "webfarm_response_bytes", "webfarm_items",
                "webfarm_duplicates")}
        responses = CounterMetricFamily("webfarm_responses", METRICS["webfarm_responses"],
                                        labels=["spider", "host", "status_class"])
        errors = CounterMetricFamily("webfarm_errors", METRICS["webfarm_errors"],
                                     labels=["spider", "host", "kind"])
        fetches = CounterMetricFamily("webfarm_fetches", METRICS["webfarm_fetches"],
                                      labels=["spider", "host", "method"])
        latency = SummaryMetricFamily("webfarm_download_latency_seconds",
                                      METRICS["webfarm_download_latency_seconds"],
                                      labels=["spider", "host"])
        for host in sorted(merged):
            m = merged[host]
            fam["webfarm_requests"].add_metric([sp, host], m.get("requests", 0.0))
            fam["webfarm_response_bytes"].add_metric([sp, host], m.get("bytes", 0.0))
            fam["webfarm_items"].add_metric([sp, host], m.get("items", 0.0))
            fam["webfarm_duplicates"].add_metric([sp, host], m.get("duplicates", 0.0))
            for name, value in sorted(m.items()):
                if name.startswith("status:"):
                    responses.add_metric([sp, host, name[7:]], value)
            kinds = sorted(((n[6:], v) for n, v in m.items() if n.startswith("error:")),
                           key=lambda kv: -kv[1])
            rest = sum(v for _, v in kinds[MAX_ERROR_KINDS:])
            for kind, value in kinds[:MAX_ERROR_KINDS]:
                errors.add_metric([sp, host, kind], value)
            if rest:
                errors.add_metric([sp, host, OTHER], rest)
            fetches.add_metric([sp, host, "http"], m.get("fetch_http", 0.0))
            fetches.add_metric([sp, host, "browser"], m.get("fetch_browser", 0.0))
            fetches.add_metric([sp, host, "api"], m.get("fetch_api", 0.0))
            latency.add_metric([sp, host], m.get("latency_count", 0.0),
                               m.get("latency_sum", 0.0))
        yield from fam.values()
        yield from (responses, errors, fetches, latency)

    def _shared(self) -> Iterator[Metric]:
        try:
            gauges = self.store.last_gauges()
            raw = self.store.server.hgetall(self.alerts_key)
        except Exception as exc:  # a scrape must answer even when Redis does not
            logger.debug("Prometheus: shared figures unavailable: %s", exc)
            return
        for name in GAUGES:
            metric = f"webfarm_frontier_{name}"
            g = GaugeMetricFamily(metric, METRICS[metric], labels=["spider"])
            if gauges is not None:
                g.add_metric([self.spider], gauges[name])
            yield g
        # Per rule, not per host: a thousand failing hosts must not make a thousand series.
        count: dict[str, int] = dict.fromkeys(RULES, 0)
        for key, value in raw.items():
            try:
                state = json.loads(value)
            except ValueError:
                continue
            if state.get("status") == "firing":
                alert = key.decode().partition(":")[0]
                count[alert] = count.get(alert, 0) + 1
        firing = GaugeMetricFamily("webfarm_alerts_firing", METRICS["webfarm_alerts_firing"],
                                   labels=["spider", "alert"])
        for alert, n in sorted(count.items()):
            firing.add_metric([self.spider, alert], n)
        yield firing
