"""The one settings module of webfarm.

Every setting can come from an environment variable (the deployment values below by
name, the rest by :func:`_from_environment` at the end), so scrapyd jobs and containers
need no file edits; ``-s NAME=value`` (or scrapyd's ``-d setting=``) still overrides
any of them. Each setting is listed in the README's table.
An empty ``REDIS_URL`` / ``MONGO_URI`` / ``BLOB_STORE_URI`` means "use the
embedded local service under ``WEBFARM_DATA_DIR``".
"""

from __future__ import annotations

import json as _json
import os

from scrapy.settings import default_settings as _scrapy

_READ_BY_NAME: set[str] = set()  # variables read below by name (their own parsing)


_SET_BY_NAME: dict[str, str] = {}  # setting -> variable, of those the environment set


def _env(name: str, default: str = "", setting: str = "") -> str:
    """Variable ``name`` (empty: unset, ``default``), for ``setting`` (``name`` if not
    given)."""
    _READ_BY_NAME.add(name)
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    _SET_BY_NAME[setting or name] = name
    return value


def _env_bool(name: str, default: bool) -> bool:
    """Variable ``name`` as a boolean, read as every setting's is (:func:`_typed`): one that
    does not read as one stops the process (``WEBFARM_SSRF_GUARD=disabled`` left the guard
    on without a word)."""
    raw = _env(name)
    return bool(_typed(name, name, raw, default)) if raw else default


def _typed(setting: str, variable: str, raw: str, default: object) -> object:
    """``raw`` as its setting's type (the type of its default here or in Scrapy); a value
    that does not read as one stops the process with what to give."""
    low = raw.lower()
    try:
        if isinstance(default, bool):
            if low in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                return low in ("1", "true", "yes", "on")
            kind = "a boolean (true/false, 1/0)"
        elif isinstance(default, int) and setting.startswith("WEBFARM_"):
            kind = "a whole number"
            return int(raw)
        elif isinstance(default, float):  # a float stays one: the start-up check reads
            kind = "a number"             # a setting by its value's type
            return float(raw)
        elif isinstance(default, int):  # Scrapy's counts: it reads some of them as floats
            kind = "a number"
            return int(raw) if raw.lstrip("-").isdigit() else float(raw)
        elif isinstance(default, (dict, list, tuple)):
            kind = "JSON" + (" (an object)" if isinstance(default, dict) else " (a list)")
            if not isinstance(default, dict) and not raw.startswith("["):
                return raw  # comma-separated, as -s gives it (getlist splits it)
            value = _json.loads(raw)
            if isinstance(value, dict) == isinstance(default, dict):
                return value
        else:
            return raw
    except ValueError:
        pass
    raise SystemExit(f"{variable}={raw!r} (the environment) is not {kind} for {setting}; "
                     "unset it or give one")


BOT_NAME = "webfarm"
SPIDER_MODULES = ["spiders"]
NEWSPIDER_MODULE = "spiders"
COMMANDS_MODULE = "webfarm.commands"
# `scrapy genspider -t site NAME DOMAIN`: webfarm's spider templates (and the offline test
# each new site gets) live here; Scrapy's own (-t basic, ...) are still found.
TEMPLATES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "webfarm", "templates")

# --- where things live -----------------------------------------------------
REDIS_URL = _env("REDIS_URL")
MONGO_URI = _env("MONGO_URI")
MONGO_DATABASE = _env("MONGO_DATABASE", "webfarm")
BLOB_STORE_URI = _env("BLOB_STORE_URI")
AWS_ENDPOINT_URL = _env("AWS_ENDPOINT_URL")
WEBFARM_DATA_DIR = _env("WEBFARM_DATA_DIR")

# --- identity and politeness -------------------------------------------------
WEBFARM_USER_AGENT_PLACEHOLDER = "webfarm/0.1 (+https://example.invalid/set-WEBFARM_USER_AGENT)"
USER_AGENT = _env("WEBFARM_USER_AGENT", WEBFARM_USER_AGENT_PLACEHOLDER, "USER_AGENT")
ROBOTSTXT_OBEY = True  # middlewares/robots.py: RFC 9309, shared through Redis
# robots.txt groups match this product token; empty: USER_AGENT's ("webfarm" of "webfarm/0.1").
WEBFARM_ROBOTS_AGENT = _env("WEBFARM_ROBOTS_AGENT")
WEBFARM_ROBOTS_CACHE_SECONDS = 86400.0  # a fetched robots.txt is reused this long (max 24 h)
WEBFARM_ROBOTS_RETRY_DELAY = 300.0  # seconds before an unreachable (5xx) robots.txt is retried
# Unreachable this long without a cached copy: treat as "unavailable" (allow all); 0 = never.
WEBFARM_ROBOTS_OUTAGE_ALLOW_AFTER = 30 * 86400.0
WEBFARM_ROBOTS_WAIT = 30.0  # seconds to wait for another worker's robots.txt fetch
WEBFARM_ROBOTS_LOCK_SECONDS = 15.0  # a fetching worker's claim, renewed while it lives
WEBFARM_MAX_CRAWL_DELAY = 60.0  # a larger robots.txt Crawl-delay is capped (and logged)
WEBFARM_RETRY_AFTER = True  # honour Retry-After on 429/503 by deferring the host
WEBFARM_RETRY_AFTER_MAX = 3600.0  # a longer Retry-After is capped (and logged)
WEBFARM_RATE_LIMIT_BACKOFF = True  # a 429 doubles its host's delay; other answers lower it
DOWNLOAD_DELAY = 0.0
CONCURRENT_REQUESTS = 16
CONCURRENT_REQUESTS_PER_DOMAIN = 8
DOWNLOAD_TIMEOUT = 30
DOWNLOAD_MAXSIZE = 32 * 1024 * 1024
DOWNLOAD_WARNSIZE = 8 * 1024 * 1024
# Links followed from one page: its first anchors only (webfarm/links.py; 0: all).
WEBFARM_MAX_LINKS_PER_PAGE = 10_000
# Crawler traps (middlewares/traps.py): links found on pages whose path repeats a run of
# segments more than this many times in a row (/a/a/a, /a/b/a/b/a/b), or that has more
# segments than this, are not followed (as Heritrix's defaults; 0: no limit).
WEBFARM_MAX_PATH_REPEATS = 2
WEBFARM_MAX_PATH_SEGMENTS = 20
COOKIES_ENABLED = False
TELNETCONSOLE_ENABLED = False
# Scrapy 2.19's remote-control HTTP endpoint runs code sent to it: off in a crawler fleet.
REMOTE_CONTROL_ENABLED = False
REQUEST_FINGERPRINTER_CLASS = "webfarm.urls.RequestFingerprinter"
# Query parameters dropped before fingerprinting (empty: webfarm.urls.DEFAULT_TRACKING_PARAMS).
WEBFARM_STRIP_PARAMS: list[str] = []

# --- the frontier (Redis) ----------------------------------------------------
SCHEDULER = "webfarm.scheduler.Scheduler"
SCHEDULER_QUEUE_CLASS = "webfarm.frontier.Frontier"
SCHEDULER_FLUSH_ON_START = False  # wipe the spider's frontier as a worker starts (the demo)
DUPEFILTER_CLASS = "webfarm.dupefilter.BloomDupeFilter"  # or webfarm.dupefilter.SetDupeFilter
WEBFARM_BLOOM_CAPACITY = 1_000_000  # URLs before the Bloom filter adds a layer
WEBFARM_BLOOM_ERROR_RATE = 0.001
# URLs of one host a spider's frontier admits through the dupefilter, across all workers
# and runs (a trap in the query string, ?month= without end, stops there); 0 = no limit.
WEBFARM_HOST_BUDGET = 0
# Fingerprints a worker remembers sending to the frontier (a repeat is dropped locally, not
# serialised and sent to Redis to be found a duplicate there); 0 = off.
WEBFARM_RECENT_FINGERPRINTS = 100_000
# Hosts whose re-learnable state (the latency rule's delay, proxy stickiness, "said once"
# lines) a worker keeps, the most recently used: a broad crawl meets hosts without end.
WEBFARM_HOST_MEMORY = 10_000
# Bytes of one queued request's JSON (URL, headers, body, meta, cb_kwargs): Redis keeps every
# queued request in memory, so a spider passing page bodies along is refused; 0 = no limit.
WEBFARM_MAX_ENTRY_BYTES = 1 << 20
# Seconds between two requests to one host, across all workers (robots.txt Crawl-delay,
# Retry-After and the latency rule can only make it longer).
WEBFARM_HOST_DELAY = 1.0
WEBFARM_LEASE_SECONDS = 600.0
# Seconds a due host outside a worker's allowed_domains (another crawl's, in the spider's
# shared frontier) waits for a worker of its own before this one takes it and gives it back.
WEBFARM_OFFSITE_WAIT = 60.0
WEBFARM_RETRY_TIMES = 5  # attempts before a request goes to the dead-letter queue
WEBFARM_RETRY_BACKOFF_BASE = 2.0  # seconds; full jitter over base * 2**attempt
WEBFARM_RETRY_BACKOFF_MAX = 600.0
WEBFARM_FLUSH_INTERVAL = 0.5  # seconds between flushes of buffered links and acks
# A worker stops after the frontier was empty this long (0 = run forever, for fleets).
WEBFARM_IDLE_TIMEOUT = 10.0

# Retries go through the frontier (backoff, dead-letter queue), not Scrapy's RetryMiddleware.
RETRY_ENABLED = True
# webfarm's components join Scrapy's own in the _BASE dicts (None there drops one of Scrapy's),
# so a project's or spider's DOWNLOADER_MIDDLEWARES / SPIDER_MIDDLEWARES / EXTENSIONS (its
# custom_settings, -s, scrapyd's setting=) adds to them. Replacing them dropped the SSRF
# guard, robots.txt, the frontier's retries and politeness without a word.
# Items of spiders not based on WebfarmSpider (CrawlSpider, SitemapSpider) keep their page's URL.
# `scrapy check`: @returns and @scrapes see the spider's items, not its page records.
SPIDER_CONTRACTS_BASE = {**_scrapy.SPIDER_CONTRACTS_BASE,
                         "scrapy.contracts.default.ReturnsContract": None,
                         "scrapy.contracts.default.ScrapesContract": None,
                         "webfarm.contracts.ReturnsContract": 2,
                         "webfarm.contracts.ScrapesContract": 3}
# A UTF-16 page's links get UTF-8 requests, before RefererMiddleware (700) sets a header.
SPIDER_MIDDLEWARES_BASE = {**_scrapy.SPIDER_MIDDLEWARES_BASE,
                           "middlewares.limits.LinkEncodingMiddleware": 710,
                           # Scrapy's, the dropped URL's log line cut short, once per host
                           "scrapy.spidermiddlewares.urllength.UrlLengthMiddleware": None,
                           "middlewares.limits.UrlLengthMiddleware": 800,
                           "middlewares.traps.PathTrapMiddleware": 810,
                           "middlewares.sources.ItemSourceMiddleware": 950}
DOWNLOADER_MIDDLEWARES_BASE = {
    **_scrapy.DOWNLOADER_MIDDLEWARES_BASE,
    # A frontier request outside this worker's hosts goes back for another worker.
    "scrapy.downloadermiddlewares.offsite.OffsiteMiddleware": None,
    "middlewares.offsite.FrontierOffsiteMiddleware": 50,
    "middlewares.ssrf.SSRFGuardMiddleware": 50,
    "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
    # RFC 9309 robots.txt, shared by workers (Scrapy's allows all on 5xx and errors).
    "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware": None,
    "middlewares.robots.RobotsMiddleware": 100,
    "middlewares.retry.FrontierRetryMiddleware": 550,
    # HTTP first, browser when needed, fetch API last; sets meta["playwright"] before the
    # proxy middleware gives browser requests one context per proxy.
    "middlewares.render.RenderMiddleware": 560,
    # Hostile servers (middlewares/limits.py): Scrapy's redirect and decompression middlewares
    # in the same slots, but bodies over DOWNLOAD_MAXSIZE (also inflated: gzip bombs),
    # redirect loops and chains past REDIRECT_MAX_TIMES are dead-lettered with a reason.
    "scrapy.downloadermiddlewares.redirect.MetaRefreshMiddleware": None,
    "middlewares.limits.MetaRefreshMiddleware": 580,
    # Wrong, missing or unknown charsets: read the page with an encoding its bytes fit.
    "middlewares.limits.CharsetMiddleware": 585,
    "scrapy.downloadermiddlewares.httpcompression.HttpCompressionMiddleware": None,
    "middlewares.limits.HttpCompressionMiddleware": 590,
    "scrapy.downloadermiddlewares.redirect.RedirectMiddleware": None,
    "middlewares.limits.RedirectMiddleware": 600,
    # Before HttpProxyMiddleware (750), which turns the chosen proxy's userinfo into a header.
    "middlewares.proxies.ProxyMiddleware": 740,
    # A request leaving long after its hand-out (robots.txt, a busy CPU) takes its host's
    # turn again, so the host's next request is not early (middlewares/departure.py).
    "middlewares.departure.DepartureMiddleware": 940,
    # Next to the downloader: counts every response and network error before anything
    # converts it (webfarm.monitor; off with WEBFARM_METRICS).
    "webfarm.monitor.extension.MonitorMiddleware": 950,
}
# The latency rule runs per host in webfarm.throttle and is shared through Redis;
# Scrapy's AutoThrottle would only slow this one worker.
AUTOTHROTTLE_ENABLED = False
WEBFARM_AUTOTHROTTLE = True
AUTOTHROTTLE_TARGET_CONCURRENCY = 1.0
AUTOTHROTTLE_MAX_DELAY = 60.0
# Scrapy's, with CONCURRENT_REQUESTS_PER_DOMAIN kept at a slot without delay (webfarm/downloader.py)
DOWNLOADER = "webfarm.downloader.Downloader"
EXTENSIONS_BASE = {
    **_scrapy.EXTENSIONS_BASE,
    # -o / FEEDS export the spider's items, not its PageItems (webfarm/feeds.py)
    "scrapy.extensions.feedexport.FeedExporter": None,
    "webfarm.feeds.FeedExporter": 0,
    # CLOSESPIDER_ITEMCOUNT / _TIMEOUT_NO_ITEM count the spider's items, not page records
    "scrapy.extensions.closespider.CloseSpider": None,
    "webfarm.feeds.CloseSpider": 0,
    # item_scraped_count (and "scraped N items") counts them too; pages: webfarm/pages/recorded
    "scrapy.extensions.corestats.CoreStats": None,
    "webfarm.feeds.CoreStats": 0,
    "webfarm.throttle.HostThrottle": 500,
    # AUTOTHROTTLE_ENABLED: the shared rule above does it (Scrapy's with it switched off)
    "scrapy.extensions.throttle.AutoThrottle": None,
    "webfarm.throttle.WorkerAutoThrottle": 0,
    "webfarm.recrawl.RecrawlExtension": 520,  # continuous recrawl (WEBFARM_RECRAWL_INTERVAL)
    "webfarm.stopping.StopProgress": 530,  # a stopping worker says what it still stores
    "webfarm.monitor.extension.MonitorExtension": 510,
    "webfarm.gctune.GcTuning": 530,  # fewer, cheaper garbage collections (WEBFARM_GC_*)
    # memusage/max read once more at the end: a crawl under a minute said its start-up size
    "scrapy.extensions.memusage.MemoryUsage": None,
    "webfarm.memusage.PeakMemoryUsage": 0,
    # requests the frontier does not hold (scrapy fetch/parse/shell, a webfarm_local login):
    # retried and said as in Scrapy, where the frontier would retry or dead-letter them
    "webfarm.outcomes.UnqueuedOutcomes": 540,
}
# The project's own components (a spider's custom_settings may name more).
SPIDER_MIDDLEWARES: dict[str, int | None] = {}
DOWNLOADER_MIDDLEWARES: dict[str, int | None] = {}
EXTENSIONS: dict[str, int | None] = {}
# Garbage collection: freeze the startup heap and raise the collector's thresholds while a
# spider runs (webfarm/gctune.py); the thresholds are CPython's (gen0 objects, gen1, gen2).
WEBFARM_GC_TUNING = True
WEBFARM_GC_THRESHOLDS = [100000, 20, 20]

# --- SSRF guard (middlewares/ssrf.py, webfarm/netguard.py) ---------------------------
# Requests whose host resolves to a loopback, private, link-local (cloud metadata),
# multicast or reserved address are dead-lettered, redirect hops included.
WEBFARM_SSRF_GUARD = _env_bool("WEBFARM_SSRF_GUARD", True)
# Comma-separated CIDRs allowed anyway (e.g. 10.20.0.0/16 for an intranet crawl).
WEBFARM_ALLOWED_NETWORKS = _env("WEBFARM_ALLOWED_NETWORKS")
WEBFARM_SSRF_DNS_CACHE = 30.0  # seconds a checked resolution is reused
# Read pages whose declared charset does not fit their bytes with one that does
# (valid UTF-8 wins, else the declared one, else windows-1252); middlewares/limits.py.
WEBFARM_CHARSET_FIX = True

# --- proxy rotation (middlewares/proxies.py, webfarm/proxies.py, webfarm/proxyconfig.py)
# Off when empty. Comma/newline-separated proxy URLs (http://user:pass@host:port#name),
# or the path of a file with one per line. Only ids (host:port or #name) reach logs,
# stats and Redis; health is shared by all workers under webfarm:proxies:<id>.
WEBFARM_PROXIES = _env("WEBFARM_PROXIES")
WEBFARM_PROXY_BAN_STATUSES = [403, 429]  # statuses that mean "this proxy is banned"
WEBFARM_PROXY_BAN_MARKERS: list[str] = []  # body snippets that mean the same (case-insensitive)
WEBFARM_PROXY_RETRY_TIMES = 3  # other proxies tried for one request before giving up
WEBFARM_PROXY_BACKOFF_BASE = 30.0  # seconds of the first cooldown; doubles per failure
WEBFARM_PROXY_BACKOFF_MAX = 3600.0  # longest cooldown
WEBFARM_PROXY_MAX_FAILURES = 5  # consecutive failures before a proxy is retired
WEBFARM_PROXY_HEALTH_REFRESH = 1.0  # seconds between reads of the shared health
WEBFARM_PROXY_STATE_TTL = 86400.0  # seconds a proxy's health is kept in Redis
# A ban counts against a proxy only if another one fetched the host fine this recently.
WEBFARM_PROXY_HOST_WINDOW = 600.0
WEBFARM_PROXY_STICKY = False  # True: each host keeps its proxy while that one is healthy
WEBFARM_PROXY_BROWSER_BYPASS = ""  # Playwright proxy "bypass" list for browser contexts

# --- HTTP first, browser when needed (middlewares/render.py, webfarm/render.py) -------
# Render mode when neither meta["render"], WEBFARM_RENDER_HOSTS nor the spider's `render`
# says otherwise: auto (HTTP, escalate pages that need JavaScript), http, browser or api.
WEBFARM_RENDER = _env("WEBFARM_RENDER", "auto").lower()
if WEBFARM_RENDER not in ("auto", "http", "browser", "api"):
    raise SystemExit(f"WEBFARM_RENDER={WEBFARM_RENDER!r} is not a render mode; use auto, http, "
                     "browser or api")
# Mode per host: "host=mode,host=mode" or JSON {"host": "mode"}; a domain covers subdomains.
WEBFARM_RENDER_HOSTS = _env("WEBFARM_RENDER_HOSTS")
WEBFARM_RENDER_MEMORY_SECONDS = 21600.0
# Share of a browser-first host's requests still tried over HTTP, to notice it changed.
WEBFARM_RENDER_PROBE_RATE = 0.05
# A host goes browser-first once this many of its pages, and this share of them, needed JS.
WEBFARM_RENDER_HOST_MIN_PAGES = 2
WEBFARM_RENDER_HOST_SHARE = 0.9
WEBFARM_RENDER_MIN_TEXT = 50  # visible characters below which a page with scripts is "empty"
WEBFARM_RENDER_CHECK_WAIT = 10.0  # seconds a render waits for a render_check selector
# The browser (scrapy-playwright on a system Chromium, found on PATH or $WEBFARM_CHROMIUM).
# Only requests with meta["playwright"] use it; the driver starts with the first of them.
# scrapy-playwright's handler, with the HTTP client's response headers bounded
# (webfarm/download.py): a server that sends headers without end is dead-lettered.
DOWNLOAD_HANDLERS = {
    "http": "webfarm.download.DownloadHandler",
    "https": "webfarm.download.DownloadHandler",
}
WEBFARM_MAX_HEADER_BYTES = 256 * 1024  # Chromium's limit; 0: unbounded (Scrapy's way)
PLAYWRIGHT_BROWSER_PROVIDER = "webfarm.browser.SystemChromiumProvider"
PLAYWRIGHT_ABORT_REQUEST = "webfarm.browser.abort_request"  # SSRF guard + skipped resources
PLAYWRIGHT_MAX_CONTEXTS = 8  # at least one per proxy (+1 without proxies)
PLAYWRIGHT_MAX_PAGES_PER_CONTEXT = 4
PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT = 30_000  # ms
WEBFARM_BROWSER_SKIP_RESOURCES = ["image", "media", "font"]
# The last rung, off unless set; the key is read from $WEBFARM_FETCH_API_KEY only.
WEBFARM_FETCH_API_URL = _env("WEBFARM_FETCH_API_URL")
WEBFARM_FETCH_API_HOSTS = _env("WEBFARM_FETCH_API_HOSTS")  # comma-separated: always via the API
WEBFARM_FETCH_API_TIMEOUT = 60.0

# --- storage ----------------------------------------------------------------
# Scrapy's pipeline manager, noting each item's page before the first pipeline: an item a
# project's pipeline returns anew (of any priority) is stored with its page's URL and hash.
ITEM_PROCESSOR = "pipelines.chain.ItemChainManager"
# The storage pipelines are in the _BASE dict, as Scrapy keeps its own components: a project's
# or a spider's ITEM_PIPELINES (custom_settings, -s, scrapyd's setting=) adds to them instead
# of silently replacing them, which acknowledged every page with nothing stored. None there
# turns one off, e.g. {"pipelines.items.ItemStorePipeline": None}.
ITEM_PIPELINES_BASE = {
    "pipelines.content.ContentHashPipeline": 100,
    "pipelines.blobs.BlobStorePipeline": 300,
    "pipelines.index.IndexPipeline": 500,
    "pipelines.items.ItemStorePipeline": 600,  # structured items (webfarm/itemstore.py)
}
ITEM_PIPELINES: dict[str, int | None] = {}  # the project's own: cleaning before 600
# Threads that run blocking storage calls (boto3, pymongo) off the reactor.
WEBFARM_STORAGE_THREADS = 16
# Run the pipelines' store calls (pymongo, boto3) in a helper process, off the crawler's GIL.
WEBFARM_STORAGE_PROCESS = True
# Run the helper processes (storage, hashing) under Linux's SCHED_BATCH policy: their wakeups
# then do not preempt the crawler on its CPU; their CPU share stays nice 0's.
WEBFARM_HELPER_SCHED_BATCH = True
# First refetch interval of a new page (seconds, or "30m", "6h", "2d"; the refetch policy
# moves it later).
WEBFARM_REFETCH_INTERVAL = _env("WEBFARM_REFETCH_INTERVAL", "86400")
# Object computing refetch_interval/next_fetch_at on every fetch (import path; from_crawler);
# webfarm.refetch.RefetchPolicy adapts each page's interval to its estimated change rate,
# webfarm.index.FixedRefetch keeps WEBFARM_REFETCH_INTERVAL for every page.
WEBFARM_REFETCH_POLICY = "webfarm.refetch.RefetchPolicy"
# Bounds of RefetchPolicy's interval (seconds, or "30m", "6h", "2d"); a spider's refetch_min /
# refetch_max / refetch_interval / refetch_cost attributes override them for that spider.
WEBFARM_REFETCH_MIN = _env("WEBFARM_REFETCH_MIN", "3600")
WEBFARM_REFETCH_MAX = _env("WEBFARM_REFETCH_MAX", "2592000")  # 30 days
# What one fetch is worth in seconds of one page being out of date: larger = fewer fetches.
WEBFARM_REFETCH_COST = _env("WEBFARM_REFETCH_COST", "14400")
# Per URL/host overrides, first match wins: [{"pattern": REGEX, "min"/"max"/"interval"/"cost"}]
# (a list here, JSON in the environment), e.g. [{"pattern": "/pricing", "max": "2h"}].
WEBFARM_REFETCH_RULES = _env("WEBFARM_REFETCH_RULES")
WEBFARM_REFETCH_MEMORY = 30  # checks a page's change-rate estimate remembers (decay 1 - 1/N)
# Continuous recrawl inside workers: every N seconds one worker (Redis lock) enqueues the due
# pages; 0 = off (use `scrapy recrawl SPIDER`). A recrawling worker never stops for idleness.
WEBFARM_RECRAWL_INTERVAL = 0.0
WEBFARM_RECRAWL_BATCH = 10_000  # most overdue pages enqueued per round
# Pages (or items) per bulk write, and the longest a page waits for its batch (seconds);
# an item is done, and its request acknowledged, only once its batch is written. Its
# response counts against SCRAPER_SLOT_MAX_ACTIVE_SIZE until then: keep the window short.
# The storage pipelines hold a response for a few hundred ms (hash, blob, batched writes), so
# Scrapy's 5 MB cap let about 50 pages of 100 KB in flight and idled the downloader (pages/s
# = responses in flight / pipeline latency); 10 MB: 90 -> 98 pages/s at 100 KB, 20 MB no more.
SCRAPER_SLOT_MAX_ACTIVE_SIZE = 10_000_000
WEBFARM_INDEX_BATCH_SIZE = 200
# Fields indexed in every item collection besides its key, e.g. ["source_url"]: each index
# is work on every item write, so none by default.
WEBFARM_ITEM_INDEXES: list[str] = []
# 0.2 s over 0.1 s: half the batches, each with a fixed cost in the crawler, the storage
# process and MongoDB: MongoDB's CPU a page 5-9% lower, one crawler's pages/s the same
# (README, WEBFARM_INDEX_BATCH_SECONDS).
WEBFARM_INDEX_BATCH_SECONDS = 0.2
WEBFARM_INDEX_WRITERS = 2  # batches written at once (pages and items, each)
# A failing MongoDB/S3 is retried with backoff this long; then the request goes back to the
# frontier (retried later, nothing acknowledged).
WEBFARM_STORAGE_RETRY_SECONDS = 300.0
WEBFARM_BLOB_CONCURRENCY = 8  # blob writes at once (threads and S3 connections they may use)
WEBFARM_S3_MAX_ATTEMPTS = 5  # botocore "standard" retry mode attempts per S3 call
# Blob keys a worker remembers as stored (up to twice this many, about 110 B each): a page
# with content stored lately skips the store (no S3 HEAD, no body sent); 0: ask every time.
WEBFARM_RECENT_BLOBS = 100_000
# New blobs: zstd (about 6x less CPU than gzip -6 on HTML, 3% more bytes at level 3) or gzip
# (for tools that read only gzip); empty level = the codec's default (zstd 3, gzip 6).
# Blobs are read by their magic bytes, so changing this never strands stored ones.
WEBFARM_BLOB_COMPRESSION = "zstd"
WEBFARM_BLOB_COMPRESSION_LEVEL = None
# Near-duplicates: SimHash of the normalised text (off the reactor), recorded within this many
# bits (<= 3 is found exactly by the 4x16-bit band index; see webfarm/neardup.py).
WEBFARM_NEARDUP = True
WEBFARM_NEARDUP_DISTANCE = 3
# Helper processes that compute content hashes and SimHashes (pipelines/content.py): on
# large pages that is ms of mostly Python (5 ms at 100 KB), which in a thread would hold the
# GIL the reactor needs. 0 = hash in the storage threads.
WEBFARM_HASH_PROCESSES = 1
# Extra regexes masked before content hashing (added to webfarm.content's built-in list).
WEBFARM_VOLATILE_PATTERNS: list[str] = []
# Mask times (date-times, clock times with seconds, "3 minutes ago") before hashing. Off for
# sites where a time is the content (timetables, events, results): a changed time is then
# a changed page, stored again.
WEBFARM_VOLATILE_TIMES = True

# --- monitoring and alerts (webfarm/monitor/) --------------------------------
# Per-host figures in Redis, per time bucket: webfarm:{SPIDER}:m:<bucket start>.
WEBFARM_METRICS = True
WEBFARM_METRICS_BUCKET = 60  # seconds per bucket (rates are read over whole buckets)
WEBFARM_METRICS_RETENTION = 7200.0  # seconds a bucket is kept; memory ~ hosts x buckets
WEBFARM_METRICS_FLUSH_INTERVAL = 5.0  # seconds between a worker's pipelined writes
# Seconds between frontier samples and alert-rule runs (one worker at a time, Redis lock).
WEBFARM_MONITOR_INTERVAL = 15.0
# Per-worker Prometheus /metrics (0 = off); give each worker on a machine its own port.
WEBFARM_PROMETHEUS_PORT = 0
WEBFARM_PROMETHEUS_ADDR = _env("WEBFARM_PROMETHEUS_ADDR", "127.0.0.1")
WEBFARM_PROMETHEUS_TOP_HOSTS = 20  # hosts with their own label; the rest are host="other"
WEBFARM_ALERTS = True
WEBFARM_ALERT_WEBHOOK = _env("WEBFARM_ALERT_WEBHOOK")  # POST alerts as JSON here (unset: log)
WEBFARM_ALERT_WEBHOOK_TIMEOUT = 5.0
WEBFARM_ALERT_COOLDOWN = 1800.0  # seconds before the same alert is announced again
# A host's success rate (2xx/3xx of all outcomes) below RATE and below DROP x the window
# before, over WINDOW seconds with at least MIN_REQUESTS outcomes.
WEBFARM_ALERT_SUCCESS_WINDOW = 300.0
WEBFARM_ALERT_SUCCESS_RATE = 0.5
WEBFARM_ALERT_SUCCESS_DROP = 0.5
WEBFARM_ALERT_SUCCESS_RECOVER = 0.8  # resolved once the rate is back above this
WEBFARM_ALERT_MIN_REQUESTS = 20
# The queue grew by GROWTH (fraction) and at least MIN entries over WINDOW, throughput flat.
WEBFARM_ALERT_QUEUE_WINDOW = 900.0
WEBFARM_ALERT_QUEUE_GROWTH = 0.2
WEBFARM_ALERT_QUEUE_MIN = 1000
WEBFARM_ALERT_DEAD_WINDOW = 600.0  # at least DEAD_LETTERS new dead letters within this
WEBFARM_ALERT_DEAD_LETTERS = 50
WEBFARM_ALERT_STALL_SECONDS = 300.0  # no fetch ended this long while work is queued/delayed/leased

# --- runtime -----------------------------------------------------------------
TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
LOG_LEVEL = _env("WEBFARM_LOG_LEVEL", "INFO", "LOG_LEVEL").upper()
if LOG_LEVEL not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):  # else a traceback
    raise SystemExit(f"WEBFARM_LOG_LEVEL={LOG_LEVEL!r} (the environment) is not a log level "
                     "(DEBUG, INFO, WARNING, ERROR or CRITICAL); unset it or give one")
FEED_EXPORT_ENCODING = "utf-8"


# --- every other setting from the environment too --------------------------------
def _env_name(name: str) -> str:
    """The variable a setting is read from: a webfarm setting's own name; Scrapy's
    ``NAME`` from ``WEBFARM_NAME``, so a ``LOG_LEVEL`` or ``USER_AGENT`` a container sets
    for other programs is not taken for a crawler setting by accident."""
    return name if name.startswith("WEBFARM_") else f"WEBFARM_{name}"


def _from_environment(namespace: dict[str, object]) -> dict[str, str]:
    """Apply ``WEBFARM_*`` environment variables to the settings they name (this module's
    and Scrapy's, see :func:`_env_name`): any setting can be set where the process is
    started (a container, a scrapyd machine) with no file edit. Empty means unset, and a
    variable read above by name keeps its own parsing. Returns setting -> variable."""
    taken: dict[str, str] = {}
    settings = {k: v for k, v in vars(_scrapy).items() if k.isupper()}
    settings.update((k, v) for k, v in namespace.items() if k.isupper())
    for name, default in settings.items():
        variable = _env_name(name)
        if _READ_BY_NAME & {name, variable} or (variable != name and variable in settings):
            continue  # read above; or WEBFARM_X is a setting of its own, not Scrapy's X
        raw = os.environ.get(variable, "").strip()
        if raw:
            namespace[name] = _typed(name, variable, raw, default)
            taken[name] = variable
    return taken


# Which settings came from the environment (for messages and `scrapy settings --get`).
WEBFARM_FROM_ENVIRONMENT = {**_SET_BY_NAME, **_from_environment(globals())}
