"""What Scrapy's developer commands (``parse``, ``shell``, ``fetch``, ``view``, ``check``,
``bench``) need in a webfarm project: Scrapy's own in-memory scheduler, not the shared
frontier.

Their requests carry callbacks that are not spider methods (``parse``'s closure, the
shell's ``Deferred.callback``, ``check``'s contract wrappers), which no frontier can
store, so on the frontier they failed with "is not an instance method" and fetched
nothing, as they do under scrapy-redis (``check`` even said OK, having run no
contract). And a page fetched to try a spider must not join the fleet's crawl: its
links would be queued for every worker. Metrics are off too, since they read the
frontier. Everything else (render, proxies, politeness, the SSRF guard) stays as a
crawl has it. A ``-s`` on the command line still wins.
"""

from __future__ import annotations

import argparse
from typing import Any

from scrapy.settings import SETTINGS_PRIORITIES

#: Settings these commands get unless given with ``-s``.
LOCAL = {
    "SCHEDULER": "scrapy.core.scheduler.Scheduler",
    "DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter",
    "WEBFARM_METRICS": False,
}


class LocalScheduling:
    """Mixin for a Scrapy command: :data:`LOCAL` over the project's settings."""

    settings: Any
    local: dict[str, Any] = LOCAL

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)  # type: ignore[misc]
        for name, value in self.local.items():
            if (self.settings.getpriority(name) or 0) < SETTINGS_PRIORITIES["cmdline"]:
                self.settings.set(name, value, priority="cmdline")
