"""``scrapy services up|down|status``: manage the embedded local servers by hand.

Workers start the services on demand anyway; this command is for looking at them,
starting them ahead of a crawl, and stopping them when the machine is done crawling.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, ClassVar

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from webfarm.commands._common import pipe_may_close
from webfarm.services import EmbeddedServices, ServiceError, default_data_dir

ACTIONS = ("up", "down", "status")
#: The setting that, when set, makes workers use a real server instead of the embedded one.
EXTERNAL = {"redis": "REDIS_URL", "mongo": "MONGO_URI", "blobs": "BLOB_STORE_URI"}


class Command(ScrapyCommand):
    requires_project = False
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "up|down|status [--json] [--data-dir DIR]"

    def short_desc(self) -> str:
        return "Start, stop or show the embedded local services (Valkey, SecantusDB, blobs)"

    def long_desc(self) -> str:
        return (
            "Start (up), stop (down) or show (status) the embedded Valkey, SecantusDB and "
            "blob folder that workers use when REDIS_URL, MONGO_URI or BLOB_STORE_URI are "
            "unset. They live under --data-dir, else WEBFARM_DATA_DIR, else .webfarm next "
            "to scrapy.cfg, and are shared by every worker of the machine."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument(
            "--json", dest="json", action="store_true", help="print JSON instead of a table"
        )
        parser.add_argument(
            "--data-dir", dest="data_dir", metavar="DIR", default=None,
            help="data folder of the services (default: WEBFARM_DATA_DIR or .webfarm)",
        )

    @pipe_may_close
    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if len(args) != 1 or args[0] not in ACTIONS:
            raise UsageError(f"expected one action: {'|'.join(ACTIONS)}", print_help=False)
        action = args[0]
        services = EmbeddedServices(self._data_dir(opts))
        try:
            if action == "up":
                services.up()
            elif action == "down":
                stopped = services.down()
                if not opts.json:
                    for name, how in stopped.items():
                        print(f"{name}: {how}")
                    if not stopped:
                        print("nothing was running")
            report = services.status()
        except ServiceError as exc:
            print(f"scrapy services {action}: {exc}", file=sys.stderr)
            self.exitcode = 1
            return
        if opts.json:
            # Which services workers do not use: the setting naming their own (its value
            # may hold a password, so only its name). The table says it in a note.
            for name, info in report.items():
                info["workers_use"] = self._external(name)
            print(json.dumps({"data_dir": str(services.data_dir), "services": report}, indent=2))
        else:
            print(format_table(report))
            for line in self._external_notes():
                print(line)

    def _data_dir(self, opts: argparse.Namespace) -> Path:
        """--data-dir, then the WEBFARM_DATA_DIR setting (env or -s), then the default."""
        if opts.data_dir:
            return Path(opts.data_dir)
        configured = self.settings.get("WEBFARM_DATA_DIR") if self.settings else None
        return Path(configured) if configured else default_data_dir()

    def _external(self, name: str) -> str | None:
        """The setting workers use instead of the embedded service ``name``, if set."""
        setting = EXTERNAL.get(name)
        if setting and self.settings is not None and self.settings.get(setting):
            return setting
        return None

    def _external_notes(self) -> list[str]:
        """Say when workers would not use what this table shows."""
        return [
            f"note: {setting} is set, so workers use it instead of the embedded {name}"
            for name in EXTERNAL if (setting := self._external(name))
        ]


def _state(name: str, running: bool) -> str:
    if name == "blobs":  # a folder, not a process
        return "ready" if running else "absent"
    return "running" if running else "stopped"


def format_table(report: dict[str, dict[str, Any]]) -> str:
    """A small aligned table: service, state, pid, URL, data path."""
    rows = [("SERVICE", "STATE", "PID", "URL", "DATA")]
    for name, info in report.items():
        rows.append((
            name,
            _state(name, info["running"]),
            str(info["pid"]) if info.get("pid") else "-",
            info.get("url") or "-",
            info.get("data") or "-",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)
