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
import os
import re
from collections.abc import Mapping
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


#: Variables read by name that name no setting (the browser, the fetch API's key).
_VARIABLES = frozenset({"WEBFARM_CHROMIUM", "WEBFARM_FETCH_API_KEY"})


def _known_variables() -> frozenset[str]:
    """Every ``WEBFARM_*`` variable a process reads: a webfarm setting's own name, Scrapy's
    ``NAME`` as ``WEBFARM_NAME`` (settings/base.py ``_env_name``), and the few read by
    name only."""
    return _VARIABLES | frozenset(
        name if name.startswith("WEBFARM_") else f"WEBFARM_{name}" for name in _known())


def misspelt_variables(environ: Mapping[str, str]) -> list[str]:
    """One line for each ``WEBFARM_*`` environment variable no setting reads: ``-s
    WEBFARM_HOST_DELEY=2`` was named as a slip, ``WEBFARM_IDLE_TIMEOT=0 scrapy crawl``
    went unsaid, and the README sets settings through the environment."""
    known = _known_variables()
    lines = []
    for name in sorted(environ):
        if not name.startswith("WEBFARM_") or name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=CLOSE)
        hint = f"did you mean {close[0]}?" if close else "the README's Settings table lists them"
        lines.append(f"environment variable {name}: no setting reads it; {hint}")
    return lines


def misspelt_names(settings: BaseSettings) -> list[str]:
    """One line for each setting that looks like a slip, with the name meant; then each
    ``WEBFARM_*`` environment variable that names no setting."""
    return _misspelt_settings(settings) + misspelt_variables(os.environ)


def _misspelt_settings(settings: BaseSettings) -> list[str]:
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
