"""Signals that carry per-host politeness facts to the shared frontier.

A middleware that learns something about a host (robots.txt ``Crawl-delay``, a
``Retry-After``, a latency sample) sends a signal; the frontier scheduler turns
it into the host's delay in Redis, which gates every worker. Send with
``crawler.signals.send_catch_log(signal, **kwargs)``.
"""

# host: str ("host[:port]" as webfarm.urls.host_of), delay: float seconds, source: str
# ("robots", "autothrottle", ...). Sets the host's minimum delay between two requests.
# The scheduler keeps each source's delay and sends the frontier the largest; that of
# LEARNED, sent again after a host's responses, only for the hosts used last.
host_delay = object()
LEARNED = "autothrottle"  # the latency rule's source (webfarm.throttle)

# host: str, floor: float, maximum: float seconds. The host answered 429: its delay doubles,
# for every worker (at least ``floor``, at most ``maximum``), and comes down by itself.
host_limited = object()

# host: str, seconds: float, source: str ("retry-after", ...). No request to the host for
# at least ``seconds`` from now (does not change its delay afterwards).
host_defer = object()

# request: Request, about to reach its host through the browser. Sent (and awaited, with
# ``send_catch_log_async``) just before a render navigates: the frontier scheduler waits
# there for the host's turn, which it may have handed out a page-open or a browser start
# ago, and keeps the host's next hand-out a delay after it.
render_arrival = object()

# request: Request of the frontier, about to leave for its host over HTTP well after its
# hand-out (middlewares.departure: it waited for robots.txt, or for a busy CPU). Sent and
# awaited: the frontier scheduler takes the host's turn for it, as for a render.
request_departure = object()

# host: str, selector: str. The spider's render_check selector came in none of a host's
# first renders (webfarm.download): the render middleware has no render of that host wait
# for it, in any worker (the host's render memory in Redis).
render_check_missing = object()
