"""``scrapy genspider -t site NAME DOMAIN`` writes a site spider and a test that passes.

Runs in a copy of the project (the real one is not touched): the generated spider
loads, is ruff-clean, and its offline test passes on the stand-in page and fails
when the page no longer matches.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runner import ROOT

BIN = Path(sys.executable).parent


def _ignore(folder: str, names: list[str]) -> set[str]:
    skip = {".venv", ".webfarm", ".git", "build", "__pycache__", ".pytest_cache", ".ruff_cache",
            "bench"}
    skip |= {n for n in names if n.endswith(".egg-info")}
    if Path(folder) == ROOT / "tests":  # keep conftest and helpers, not the suite
        skip |= {n for n in names if n.startswith("test_") or n == "sites"}
    return skip & set(names)


def run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("genspider") / "project"
    shutil.copytree(ROOT, path, ignore=_ignore)
    return path


def test_genspider_site_writes_a_spider_and_a_passing_offline_test(project):
    made = run([str(BIN / "scrapy"), "genspider", "-t", "site", "acme-shop",
                "shop.acme.example"], project)
    assert made.returncode == 0, made.stdout + made.stderr
    spider = project / "spiders" / "acme_shop.py"
    test = project / "tests" / "test_site_acme_shop.py"
    page = project / "tests" / "sites" / "acme_shop" / "page.html"
    assert spider.exists() and test.exists() and page.exists(), made.stdout

    source = spider.read_text()
    for needed in ("from spiders.base import WebfarmSpider", "class AcmeShopSpider(WebfarmSpider)",
                   "class AcmeShopItem", "key_fields", 'render = "auto"', "def extract(",
                   'hosts = ["shop.acme.example"]', "url=canonical_url(response.url)"):
        assert needed in source, needed
    lint = run([str(BIN / "ruff"), "check", "--no-cache", str(spider), str(test)], project)
    assert lint.returncode == 0, lint.stdout + lint.stderr

    listed = run([str(BIN / "scrapy"), "list"], project)
    assert "acme-shop" in listed.stdout.split(), listed.stdout + listed.stderr

    pytest_cmd = [str(BIN / "pytest"), "-q", "-p", "no:cacheprovider", str(test)]
    passed = run(pytest_cmd, project)
    assert passed.returncode == 0 and "3 passed" in passed.stdout, passed.stdout[-3000:]

    # The generated test checks the page: a page that changed makes it fail.
    page.write_text(page.read_text().replace("<h1>Example page", "<h1>Another page"))
    failed = run(pytest_cmd, project)
    assert failed.returncode == 1 and "1 failed" in failed.stdout, failed.stdout[-3000:]

    # Generating again keeps what the user edited; Scrapy's templates are still there.
    again = run([str(BIN / "scrapy"), "genspider", "-t", "site", "acme-shop",
                 "shop.acme.example"], project)
    assert "already exists" in again.stdout and spider.read_text() == source
    listing = run([str(BIN / "scrapy"), "genspider", "-l"], project).stdout.split()
    assert {"site", "basic", "crawl"} <= set(listing)


@pytest.mark.parametrize(("name", "why"), [
    ("my shop", "use letters, digits, _ and - (e.g. my_shop)"),
    ("class", "'class' is a Python keyword, which no module may be named; e.g. class_site"),
])
def test_a_name_no_module_can_take_is_refused_and_the_project_still_loads(project, name, why):
    """``my shop`` wrote ``spiders/my shop.py`` with ``class My shopSpider``: a SyntaxError
    in every later command of the project, ``scrapy crawl`` and scrapyd's included."""
    made = run([str(BIN / "scrapy"), "genspider", "-t", "site", name, "shop.example"], project)
    assert made.returncode == 2, made.stdout + made.stderr
    assert made.stderr.strip().splitlines()[-1] == f"webfarm: cannot name a spider {name!r}: {why}"
    assert not (project / "spiders" / f"{name}.py").exists()
    listed = run([str(BIN / "scrapy"), "list"], project)
    assert listed.returncode == 0 and "generic" in listed.stdout.split(), listed.stderr[-2000:]
