"""Any setting from the environment (DESIGN.md: every value overridable by environment
variables), so a container or a scrapyd machine sets it with no file edit. Before, only
the deployment values and a few others were read: ``WEBFARM_HOST_BUDGET=20`` in a
worker's environment did nothing, silently."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import runner

SHOW = ("import json; from scrapy.utils.project import get_project_settings as g; s = g(); "
        "v = lambda x: x.copy_to_dict() if hasattr(x, 'copy_to_dict') else x; "
        "print(json.dumps({n: v(s.get(n)) for n in %r}))")


def settings_with(env: dict[str, str], *names: str) -> dict:
    """The project's settings as a process started with ``env`` reads them."""
    proc = subprocess.run([sys.executable, "-c", SHOW % (names,)], cwd=runner.ROOT,
                          env=runner.env_for(**env), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_a_setting_comes_from_the_variable_of_its_name_as_its_type():
    got = settings_with({
        "WEBFARM_HOST_BUDGET": "20", "WEBFARM_NEARDUP": "off", "WEBFARM_INDEX_BATCH_SECONDS":
        "2", "WEBFARM_ITEM_PIPELINES": '{"pipelines.mine.Clean": 400}',
        # Scrapy's own settings: from WEBFARM_<NAME>, never from a bare LOG_LEVEL or
        # USER_AGENT a container sets for other programs.
        "WEBFARM_DEPTH_LIMIT": "3", "WEBFARM_DOWNLOAD_TIMEOUT": "7.5", "LOG_LEVEL": "DEBUG",
        # WEBFARM_RETRY_TIMES is webfarm's own setting: it does not set Scrapy's RETRY_TIMES.
        "WEBFARM_RETRY_TIMES": "4", "WEBFARM_HOST_DELAY": "",  # empty: unset
        # A whole number for a float setting stays a float: read as an int, the start-up
        # check took the setting for a count and refused -s ...=0.5 ("not a whole number").
        "WEBFARM_STORAGE_RETRY_SECONDS": "60",
        # A list from a comma-separated value, as -s gives it; and settings only code read
        # (not in settings/base.py, so their variables were dropped without a word).
        "WEBFARM_ITEM_INDEXES": "source_url,content_hash",
        "WEBFARM_SCHEDULER_FLUSH_ON_START": "true",
        # Read by name (their own parsing): listed as set by the environment too.
        "WEBFARM_SSRF_GUARD": "off", "WEBFARM_USER_AGENT": "acme-bot/1.0",
    }, "WEBFARM_ITEM_INDEXES", "SCHEDULER_FLUSH_ON_START", "WEBFARM_SSRF_GUARD", "USER_AGENT",
        "WEBFARM_HOST_BUDGET", "WEBFARM_NEARDUP", "WEBFARM_INDEX_BATCH_SECONDS",
        "ITEM_PIPELINES", "DEPTH_LIMIT", "DOWNLOAD_TIMEOUT", "LOG_LEVEL", "WEBFARM_RETRY_TIMES",
        "RETRY_TIMES", "WEBFARM_HOST_DELAY", "WEBFARM_STORAGE_RETRY_SECONDS",
        "WEBFARM_FROM_ENVIRONMENT")
    assert got.pop("WEBFARM_FROM_ENVIRONMENT") == {
        "WEBFARM_HOST_BUDGET": "WEBFARM_HOST_BUDGET", "WEBFARM_NEARDUP": "WEBFARM_NEARDUP",
        "WEBFARM_INDEX_BATCH_SECONDS": "WEBFARM_INDEX_BATCH_SECONDS",
        "ITEM_PIPELINES": "WEBFARM_ITEM_PIPELINES", "DEPTH_LIMIT": "WEBFARM_DEPTH_LIMIT",
        "DOWNLOAD_TIMEOUT": "WEBFARM_DOWNLOAD_TIMEOUT", "WEBFARM_RETRY_TIMES":
        "WEBFARM_RETRY_TIMES",
        "WEBFARM_STORAGE_RETRY_SECONDS": "WEBFARM_STORAGE_RETRY_SECONDS",
        "WEBFARM_ITEM_INDEXES": "WEBFARM_ITEM_INDEXES",
        "SCHEDULER_FLUSH_ON_START": "WEBFARM_SCHEDULER_FLUSH_ON_START",
        "WEBFARM_SSRF_GUARD": "WEBFARM_SSRF_GUARD", "USER_AGENT": "WEBFARM_USER_AGENT",
        # the tests' environment sets these
        "WEBFARM_IDLE_TIMEOUT": "WEBFARM_IDLE_TIMEOUT",
        "WEBFARM_ALLOWED_NETWORKS": "WEBFARM_ALLOWED_NETWORKS"}
    assert isinstance(got["WEBFARM_STORAGE_RETRY_SECONDS"], float)
    assert isinstance(got["WEBFARM_INDEX_BATCH_SECONDS"], float)
    assert got == {
        "WEBFARM_ITEM_INDEXES": "source_url,content_hash", "SCHEDULER_FLUSH_ON_START": True,
        "WEBFARM_SSRF_GUARD": False, "USER_AGENT": "acme-bot/1.0",
        "WEBFARM_HOST_BUDGET": 20, "WEBFARM_NEARDUP": False, "WEBFARM_INDEX_BATCH_SECONDS": 2.0,
        "ITEM_PIPELINES": {"pipelines.mine.Clean": 400}, "DEPTH_LIMIT": 3,
        "DOWNLOAD_TIMEOUT": 7.5, "LOG_LEVEL": "INFO", "WEBFARM_RETRY_TIMES": 4,
        "RETRY_TIMES": 2, "WEBFARM_HOST_DELAY": 1.0, "WEBFARM_STORAGE_RETRY_SECONDS": 60.0}


def test_a_crawl_takes_the_environment_and_the_command_line_wins(web, stores):
    env = runner.env_for(**stores, WEBFARM_HOST_BUDGET="3")
    for base, args, budget in ((web.base_urls[0], [], 3),
                               (web.base_urls[1], ["-s", "WEBFARM_HOST_BUDGET=5"], 5)):
        result = runner.scrapy(["crawl", "generic", "-a", f"start={base}/", *args], env, 120)
        assert result.returncode == 0, result.output[-3000:]
        assert len([h for h in web.hits_for(host=base) if h.path != "/robots.txt"]) == budget
        assert f"has used its budget of {budget} URLs (WEBFARM_HOST_BUDGET)" in result.output


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("WEBFARM_HOST_BUDGET", "lots", "WEBFARM_HOST_BUDGET='lots' (the environment) is not a "
                                    "whole number for WEBFARM_HOST_BUDGET; unset it or give one"),
    ("WEBFARM_NEARDUP", "maybe", "is not a boolean (true/false, 1/0) for WEBFARM_NEARDUP"),
    ("WEBFARM_DOWNLOAD_TIMEOUT", "soon", "is not a number for DOWNLOAD_TIMEOUT"),
    ("WEBFARM_ITEM_PIPELINES", "pipelines.mine.Clean", "is not JSON (an object) for "
                                                       "ITEM_PIPELINES"),
    ("WEBFARM_HOST_BUDGET", "-1", "WEBFARM_HOST_BUDGET=-1 is below 0; give a number, or 0 for "
                                  "no limit, in the environment variable WEBFARM_HOST_BUDGET"),
    # Read by name: any value but 0/false/no/off left the guard on, a slip in silence.
    ("WEBFARM_SSRF_GUARD", "disabled", "WEBFARM_SSRF_GUARD='disabled' (the environment) is "
                                       "not a boolean (true/false, 1/0) for WEBFARM_SSRF_GUARD"),
    ("WEBFARM_LOG_LEVEL", "LOUD", "WEBFARM_LOG_LEVEL='LOUD' (the environment) is not a log "
                                  "level (DEBUG, INFO, WARNING, ERROR or CRITICAL)"),
])
def test_a_variable_that_does_not_read_stops_the_crawl_with_its_name(web, stores, variable,
                                                                      value, message):
    env = runner.env_for(**stores, **{variable: value})
    result = runner.scrapy(["crawl", "generic", "-a", f"start={web.base_urls[0]}/"], env, 60)
    assert result.returncode == 1 and "Traceback" not in result.output, result.output[-2000:]
    assert message in result.stderr, result.stderr[-2000:]
    assert web.hits == []


def test_a_log_level_on_the_command_line_is_upper_cased_or_refused_in_one_line(stores):
    """``-L debug`` and ``-s LOG_LEVEL=LOUD`` went to ``logging`` as given: Scrapy's
    traceback (``ValueError: Unknown level``) before any output, for every command that
    starts a crawler."""
    from scrapy.exceptions import UsageError
    from scrapy.settings import Settings

    from webfarm.commands._common import check_log_level

    settings = Settings({"LOG_LEVEL": "INFO"})
    settings.set("LOG_LEVEL", " debug", priority="cmdline")
    check_log_level(settings)
    assert settings["LOG_LEVEL"] == "DEBUG" and settings.getpriority("LOG_LEVEL") == 40
    with pytest.raises(UsageError, match="LOG_LEVEL='LOUD' is not a log level; give DEBUG"):
        check_log_level(Settings({"LOG_LEVEL": "LOUD"}))
    for args in (["crawl", "generic", "-a", "start=http://127.0.0.2:1/"], ["reparse", "generic"],
                 ["fetch", "http://127.0.0.2:1/"]):
        result = runner.scrapy([*args, "-L", "loud"], runner.env_for(**stores), 60)
        assert result.returncode == 2 and "Traceback" not in result.output, result.output
        assert result.stderr.splitlines()[-1].endswith(
            ": error: LOG_LEVEL='loud' is not a log level; give DEBUG, INFO, WARNING, ERROR or "
            "CRITICAL"), result.stderr[-2000:]
