"""The README's settings table names every setting the project reads.

Users tune a crawl from that one table; a setting added to the code but not to the
table is one they cannot find. This reads the code's string literals, not a list kept
by hand, so a new setting fails here until its row is written.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("webfarm", "pipelines", "middlewares", "settings", "spiders")
# A setting's name as a whole string literal: settings.get("WEBFARM_X"), _env("WEBFARM_X", …)
LITERAL = re.compile(r"""["']((?:WEBFARM|MONGO|BLOB|REDIS)_[A-Z0-9_]*[A-Z0-9])["']""")
TICKED = re.compile(r"`([A-Z_][A-Z0-9_]*)`")


def settings_read() -> set[str]:
    names: set[str] = set()
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*.py"):
            names.update(LITERAL.findall(path.read_text(encoding="utf-8")))
    return names


def settings_table() -> set[str]:
    """Names in the rows of README's ``## Settings`` table; ``A_BASE`` / ``_MAX`` in one
    cell is shorthand for ``A_BASE`` and ``A_MAX``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Settings", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("|"):
            continue
        for cell in line.split("|"):
            full = ""
            for name in TICKED.findall(cell):
                if name.startswith("_") and full:
                    names.add(full.rsplit("_", 1)[0] + name)
                else:
                    full = name
                    names.add(name)
    return names


def test_every_setting_the_project_reads_has_a_row_in_the_readme():
    read = settings_read()
    assert len(read) > 50, "the scan found too few settings: is SOURCES still right?"
    missing = sorted(read - settings_table())
    assert not missing, f"add these to README's ## Settings table: {missing}"

