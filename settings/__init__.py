"""Project settings: everything lives in :mod:`settings.base`."""

from settings.base import *  # noqa: F403
