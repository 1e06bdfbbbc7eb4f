"""The one exception type the data layer raises for bad input."""

from __future__ import annotations


class DataError(ValueError):
    """A corpus, data file or data setting is unusable; the message says what is wrong and how to fix it."""
