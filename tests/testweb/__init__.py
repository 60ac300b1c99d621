"""The local test web: catalogue shops served over HTTP on loopback addresses (stdlib only).

``TestWeb`` serves; ``site`` documents which URLs exist and what a crawler must store.
"""

from tests.testweb.server import (
    Handler,
    Hit,
    RequestInfo,
    Response,
    TestWeb,
    Writer,
    catalogue_response,
    validators_for,
)
from tests.testweb.site import TRACKING_PARAMS, Page, Shop

__all__ = [
    "TRACKING_PARAMS",
    "Handler",
    "Hit",
    "Page",
    "RequestInfo",
    "Response",
    "Shop",
    "TestWeb",
    "Writer",
    "catalogue_response",
    "validators_for",
]
