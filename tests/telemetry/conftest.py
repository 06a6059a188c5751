"""The OTLP collector the end-to-end trace tests export to, one per module (test_ray_trace defines its
own, one per test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from otlp_collector import OtlpCollector, running_collector


@pytest.fixture(scope="module")
def collector() -> Iterator[OtlpCollector]:
    with running_collector() as running:
        yield running
