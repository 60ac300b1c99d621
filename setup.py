"""Shim for scrapyd-deploy, which builds eggs through ``setup.py bdist_egg``.

All metadata lives in pyproject.toml (including the ``scrapy`` entry point that
tells scrapyd where the settings are).
"""

from setuptools import setup

setup()
