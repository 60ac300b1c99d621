# webfarm: `make demo` crawls the bundled demo site on the embedded services;
# `make test` runs the whole test suite. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Test processes: most tests wait on a crawl's delays, not the CPU, so two share 2 cores
# (17 min in one process, under 10 in two). A test file stays in one process, so its
# module fixtures (two scrapyd servers, a test web) start once. Tests marked serial measure
# time at a server (gaps between requests): they run alone afterwards, as the other
# process's CPU load bunched a browser's requests (0.17 s after 0.46 s at a 0.4 s delay).
TEST_WORKERS ?= 2

.PHONY: setup demo test lint bench chromium services-down clean

setup: $(STAMP) chromium

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# Playwright cannot download its browser here: use the system Chromium.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { echo "installing Chromium (apt-get)"; \
	    if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	    $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium; }

demo: setup
	$(PY) -m tests.demo

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile -m 'not serial'
	$(VENV)/bin/pytest -m serial

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: setup
	$(PY) bench/run_all.py $(ARGS)

services-down: $(STAMP)
	$(VENV)/bin/scrapy services down

clean: services-down
	rm -rf .webfarm build dist *.egg-info
