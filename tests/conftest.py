"""Shared pytest setup: tests marked ``gpu`` are skipped, with the reason, without an sm_90 device.

Use ``@pytest.mark.gpu`` (or ``from tests._gpu import requires_sm90``) on tests that need the device.
"""

from __future__ import annotations

import pytest

from tests._gpu import sm90_skip_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = sm90_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
