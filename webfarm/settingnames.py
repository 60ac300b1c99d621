"""Setting names that look like slips, said before a crawl starts.

Scrapy ignores a setting no component reads, so ``-s WEBFARM_HOST_DELAI=0.5``,
``-s CONCURENT_REQUESTS=1`` or ``-s webfarm_host_delay=0.1`` ran the crawl with the
defaults and no word said. :func:`misspelt_names` names each setting, given on the
command line, by a spider's ``custom_settings`` or by scrapyd, that is no known setting
but is close to one (or is a known one in lower case), and any unknown ``WEBFARM_``
name. A project's own setting names (for its own middlewares) pass in silence unless
they are a letter or two from a known one.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from functools import lru_cache
from pathlib import Path

from scrapy.settings import SETTINGS_PRIORITIES, BaseSettings, default_settings

from webfarm.settingtypes import _project_module

#: Where a setting came from, by its priority, in the words a user set it with.
_SOURCES = {"cmdline": "-s", "spider": "the spider's custom_settings", "project": "settings"}
#: How alike a name must be to a known one to be taken for a slip of it (difflib's ratio:
#: CONCURENT_REQUESTS to CONCURRENT_REQUESTS is 0.97, REDIS_HOST to REDIS_URL 0.63).
CLOSE = 0.85


#: Packages whose own settings webfarm does not set but a user may: their names as
#: their code spells them (``"PLAYWRIGHT_CONTEXTS"``), so none is taken for a slip.
_PACKAGES = {"scrapy_playwright": re.compile(r"[\"'](PLAYWRIGHT_[A-Z0-9_]+)[\"']")}


@lru_cache(maxsize=1)
def _known() -> frozenset[str]:
    names = {n for n in vars(default_settings) if n.isupper()}
    project = _project_module()
    if project is not None:
        names |= {n for n in vars(project) if n.isupper()}
    for package, spelled in _PACKAGES.items():
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            for source in Path(folder).rglob("*.py"):
                names |= set(spelled.findall(source.read_text(errors="replace")))
    return frozenset(names)


def misspelt_names(settings: BaseSettings) -> list[str]:
    """One line for each setting that looks like a slip, with the name meant."""
    known = _known()
    by_priority = {priority: name for name, priority in SETTINGS_PRIORITIES.items()}
    lines = []
    for name in sorted(settings):
        if name in known or not isinstance(name, str):
            continue
        source = _SOURCES.get(by_priority.get(settings.getpriority(name) or 0, ""), "settings")
        if name.upper() in known:
            lines.append(f"{source} {name}: setting names are upper case; Scrapy ignores "
                         f"this one: write {name.upper()}")
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=CLOSE)
        if close:
            lines.append(f"{source} {name}: no such setting, Scrapy ignores it; did you "
                         f"mean {close[0]}?")
        elif name.startswith("WEBFARM_"):
            lines.append(f"{source} {name}: no such webfarm setting, it is ignored (the "
                         "README's Settings table lists them)")
    return lines
