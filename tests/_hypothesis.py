"""``given`` / ``settings`` / ``st`` from hypothesis, or stand-ins when it is not installed.

hypothesis is a CPU-side test dependency; a GPU machine may not have it. A module-level
``from hypothesis import ...`` would then fail to import, and one collection error aborts the whole
``pytest -m gpu tests`` run, GPU tests included. With the stand-ins the property-based tests are
collected as skipped (with the reason) and every other test of the module still runs.
"""

from __future__ import annotations

import pytest

try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - exercised only where hypothesis is missing
    _REASON = "hypothesis is not installed (property-based test)"

    class _Strategy:
        """Absorbs strategy combinators used at import time (``st.integers(...).map(...)`` etc.)."""

        def __getattr__(self, name):
            return lambda *args, **kwargs: self

    class _Strategies:
        def __getattr__(self, name):
            return lambda *args, **kwargs: _Strategy()

    st = _Strategies()

    def settings(*args, **kwargs):
        return lambda fn: fn

    def given(*args, **kwargs):
        def decorate(fn):
            # A no-argument stand-in: the original's arguments are hypothesis-drawn, not fixtures.
            @pytest.mark.skip(reason=_REASON)
            def skipped():
                pass

            skipped.__name__, skipped.__qualname__, skipped.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
            skipped.__module__ = fn.__module__
            return skipped

        return decorate

__all__ = ["given", "settings", "st"]
