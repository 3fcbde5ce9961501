"""A replica's live traffic per version (podium.core.traffic): counts, errors by status, and latency quantiles
estimated from fixed buckets, against the exact quantiles of the latencies counted."""

from __future__ import annotations

import json
import math
import random

import pytest

from podium.core.traffic import (
    LATENCY_BUCKETS_MS,
    RECENT_S,
    WARMUP_REQUESTS,
    Traffic,
    VersionTraffic,
    VersionWindow,
    binomial_tail,
    count_above,
    quantile_from_buckets,
)


def test_each_version_counts_its_own_requests_and_errors_by_status():
    traffic = Traffic()
    for _ in range(5):
        traffic.add("v000001", 12.0, 200)
    traffic.add("v000002", 30.0, 200)
    traffic.add("v000002", 2.0, 400)
    traffic.add("v000002", 900.0, 500)
    traffic.add("v000002", 3.0, 400)
    said = traffic.as_dict()
    assert list(said) == ["v000001", "v000002"]
    assert said["v000001"]["requests"] == 5 and said["v000001"]["errors"] == 0
    assert said["v000001"]["error_statuses"] == {}
    assert said["v000002"]["requests"] == 4 and said["v000002"]["errors"] == 3
    assert said["v000002"]["error_statuses"] == {"400": 2, "500": 1}
    assert said["v000002"]["latency_ms"]["max"] == 900.0
    json.dumps(said)  # what /version answers


def test_latency_quantiles_from_buckets_are_within_a_bucket_of_the_exact_ones():
    rng = random.Random(54)
    latencies = [rng.lognormvariate(math.log(20), 0.6) for _ in range(5000)]
    counted = VersionTraffic()
    for ms in latencies:
        counted.add(ms, 200)
    ordered = sorted(latencies)
    for q in (0.5, 0.95, 0.99):
        exact = ordered[math.ceil(q * len(ordered)) - 1]
        estimate = counted.latency_quantile_ms(q)
        assert estimate is not None
        upper = min(b for b in LATENCY_BUCKETS_MS if b >= exact)
        lower = max((b for b in LATENCY_BUCKETS_MS if b < exact), default=0.0)
        assert lower <= estimate <= upper, (q, exact, estimate)
    assert counted.latency_quantile_ms(0.0) == min(latencies)
    assert counted.latency_quantile_ms(1.0) == max(latencies)


def test_the_tally_stays_one_bucket_list_however_many_requests_it_counts():
    counted = VersionTraffic()
    for i in range(20000):
        counted.add(float(i % 97), 200)
    assert counted.requests == 20000 and len(counted.buckets) == len(LATENCY_BUCKETS_MS) + 1


def test_a_quantile_interpolates_within_its_bucket_as_prometheus_does():
    # 10 values in (0, 10], 10 in (10, 20]: the median is the first bucket's upper bound, p75 halfway the second
    assert quantile_from_buckets([10, 10, 0], [10.0, 20.0], 0.5, lowest=1.0, highest=20.0) == 10.0
    assert quantile_from_buckets([10, 10, 0], [10.0, 20.0], 0.75, lowest=1.0, highest=20.0) == 15.0
    # beyond the last boundary: up to the slowest value measured, never past it
    assert quantile_from_buckets([0, 0, 4], [10.0, 20.0], 0.5, lowest=30.0, highest=50.0) == 40.0
    assert quantile_from_buckets([0, 0, 0], [10.0, 20.0], 0.5, lowest=math.inf, highest=0.0) is None
    with pytest.raises(ValueError, match="quantile 1.5"):
        quantile_from_buckets([1, 0, 0], [10.0, 20.0], 1.5, lowest=1.0, highest=1.0)


def test_a_version_with_no_request_has_no_latency():
    assert VersionTraffic().as_dict() == {"requests": 0, "errors": 0, "error_statuses": {},
                                          "latency_ms": {"p50": None, "p95": None, "max": None}}


def test_a_version_s_warm_up_is_kept_apart_and_its_last_stretch_is_its_last_seconds_of_answers():
    window = VersionWindow()
    for i in range(WARMUP_REQUESTS):
        window.add(float(i), 500.0, 200, fast=False)  # cold: slow, through MLflow's code
    for i in range(100):
        window.add(100.0 + i, 5.0, 500 if i == 0 else 200, fast=True)
    assert window.warmup.requests == WARMUP_REQUESTS and window.warmup.slowest_ms == 500.0
    assert (window.settled.requests, window.settled.failures, window.fast) == (100, 1, 100)
    last, fast = window.last_stretch()
    assert last.requests == fast == int(RECENT_S) + 1 and last.failures == 0 and last.slowest_ms == 5.0


def test_values_above_a_line_are_counted_from_buckets_and_a_binomial_tail_says_how_likely():
    counts = VersionTraffic()
    for ms in [1.0] * 10 + [35.0] * 10 + [90.0] * 5:
        counts.add(ms, 200)
    assert count_above(counts.buckets, LATENCY_BUCKETS_MS, 50.0) == 5  # the 90 ms ones, a bucket above
    assert count_above(counts.buckets, LATENCY_BUCKETS_MS, 35.0) == 5 + 5  # half of (30, 40]
    assert binomial_tail(0, 10, 0.05) == 1.0 and binomial_tail(11, 10, 0.05) == 0.0
    assert binomial_tail(1, 1, 0.05) == pytest.approx(0.05)
    assert binomial_tail(2, 30, 0.05) == pytest.approx(1 - 0.95 ** 30 - 30 * 0.05 * 0.95 ** 29)
    assert binomial_tail(20, 20, 0.05) < 1e-20
