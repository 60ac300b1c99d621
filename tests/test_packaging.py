"""The project installs as a package and scrapyd-deploy can build an egg of it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.runner import ROOT

SKIP = shutil.ignore_patterns(".venv", ".webfarm", ".git", "build", "*.egg-info", "__pycache__",
                              ".pytest_cache", ".ruff_cache", "tests")


def test_scrapyd_deploy_builds_a_complete_egg(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(ROOT, project, ignore=SKIP)
    egg = tmp_path / "webfarm.egg"
    deploy = Path(sys.executable).parent / "scrapyd-deploy"
    proc = subprocess.run([str(deploy), "--build-egg", str(egg)], cwd=project,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with zipfile.ZipFile(egg) as z:
        names = set(z.namelist())
        assert z.read("EGG-INFO/entry_points.txt").decode().split() == [
            "[scrapy]", "settings", "=", "settings"]
    for needed in ("settings/base.py", "spiders/generic.py", "pipelines/index.py",
                   "webfarm/scheduler.py", "webfarm/commands/crawl.py",
                   "webfarm/frontier/scripts/ops.lua", "webfarm/frontier/scripts/common.lua",
                   "webfarm/frontier/scripts/bloom.lua"):
        assert needed in names, needed
    assert not any(n.startswith("tests/") for n in names)


def test_installed_distribution_declares_its_dependencies():
    from importlib.metadata import requires

    deps = " ".join(requires("webfarm") or [])
    for name in ("scrapy", "scrapy-redis", "scrapy-playwright", "itemadapter", "pymongo",
                 "boto3", "w3lib"):
        assert name in deps, name
    assert 'extra == "local"' in deps and 'extra == "test"' in deps
