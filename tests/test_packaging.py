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


def test_redis_clients_parse_replies_with_hiredis():
    """``redis[hiredis]`` is a dependency: without it redis-py parses every frontier reply
    in Python (measured 0.75x -> 0.78x bare Scrapy with it, bench_pipeline)."""
    from redis._parsers import _AsyncHiredisParser, _HiredisParser
    from scrapy.settings import Settings

    from webfarm.redisconn import async_redis_client, redis_client

    settings = Settings({"REDIS_URL": "redis://127.0.0.1:1/0"})
    for client, parser in ((redis_client(settings), _HiredisParser),
                           (async_redis_client(settings), _AsyncHiredisParser)):
        pool = client.connection_pool
        connection = pool.connection_class(**pool.connection_kwargs)  # not connected
        assert isinstance(connection._parser, parser), type(connection._parser)


def test_shipped_deploy_files_send_nothing_to_an_example_address_and_keep_job_logs():
    """A probe: `scrapyd-deploy -a` uploaded the egg, with the credentials, to the example
    target 10.0.0.12 as well; and scrapyd.conf kept 5 job logs per spider while listing 100
    finished jobs, so a failed job's log (the one place saying why) was soon gone."""
    import configparser
    import ipaddress
    from urllib.parse import urlsplit

    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "scrapy.cfg")
    targets = {name: cfg[name]["url"] for name in cfg.sections() if name.startswith("deploy")}
    assert targets == {"deploy:local": "http://127.0.0.1:6800/"}
    assert all(ipaddress.ip_address(urlsplit(url).hostname).is_loopback
               for url in targets.values())
    conf = configparser.ConfigParser(interpolation=None)
    conf.read(ROOT / "deploy" / "scrapyd.conf")
    keep = conf["scrapyd"]
    assert keep.getint("jobs_to_keep") >= keep.getint("finished_to_keep") > 0
