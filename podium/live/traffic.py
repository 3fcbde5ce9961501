"""Requests, errors and latency per served version, counted by each replica of `podium serve`.

Two views of the same counts:

- Ray Serve's metrics (`ray.serve.metrics`), exported by Ray's metrics agent in Prometheus format, what Ray's
  dashboard and a Prometheus or Grafana of the cluster show. Ray names them with its `ray_` prefix:

      ray_podium_serve_requests_total{serving_version, serving, ...}       requests a version answered
      ray_podium_serve_errors_total{serving_version, serving, status, ...} of those, answers other than 200
      ray_podium_serve_latency_ms_bucket{serving_version, serving, le, ...} the replica's time per request

  `serving` is the serving location (credentials hidden), `serving_version` the version that answered (not
  `version`: Ray adds `Version`, its release, to every metric); Ray Serve adds `deployment`, `replica` and
  `application`.
- The replica's own tally (podium.core.traffic.Traffic), since it started, which its `/version` and `/health`
  answers carry: a look without Prometheus.

And, for the watch after a switch, each version's requests past its warm-up and its last stretch of them
(podium.core.traffic.VersionWindow).

Only client requests to /invocations that a version answered count: not the requests answered 503 before any
version is loaded, nor the copies a shadow's candidate gets (the shadow's tally counts those).
"""

from __future__ import annotations

import time
from typing import Any

from ray import serve
from ray.serve.exceptions import RayServeException
from ray.serve.metrics import Counter, Histogram  # Ray Serve's own: they carry the replica's tags

from podium.core.redaction import redact_uri
from podium.core.traffic import LATENCY_BUCKETS_MS, Traffic, VersionWindow

REQUESTS_METRIC = "podium_serve_requests"
ERRORS_METRIC = "podium_serve_errors"
LATENCY_METRIC = "podium_serve_latency_ms"


class ReplicaTraffic:
    """One replica's counts of the requests each version answered, in Ray's metrics and in its own tally. The
    replica is named by Ray Serve's replica tag when it runs in one (as its metrics are), else by `replica`."""

    def __init__(self, serving: str, replica: str):
        try:  # in a Ray Serve replica, the name its metrics carry (their `replica` tag)
            replica = serve.get_replica_context().replica_tag
        except RayServeException:
            pass
        self.replica, self.since = replica, time.time()
        self.tally = Traffic()
        self.windows: dict[str, VersionWindow] = {}  # version -> what the watch compares
        # Ray Serve annotates tag_keys as a one-tuple (Tuple[str]); any tuple of names is what it takes
        by_version: Any = ("serving", "serving_version")
        self._requests = Counter(REQUESTS_METRIC, "Requests to /invocations answered by each served version.",
                                 tag_keys=by_version)
        self._errors = Counter(ERRORS_METRIC, "Requests to /invocations a served version answered with a status "
                                              "other than 200, by status.", tag_keys=(*by_version, "status"))
        self._latency = Histogram(LATENCY_METRIC, "Time a replica took to answer a request to /invocations, in ms, "
                                                  "by served version.", boundaries=list(LATENCY_BUCKETS_MS),
                                  tag_keys=by_version)
        defaults = {"serving": redact_uri(serving)}
        for metric in (self._requests, self._errors, self._latency):
            metric.set_default_tags(dict(defaults))
        self._tags: dict[str, dict[str, str]] = {}  # version -> its tags, made once

    def record(self, version: str, seconds: float, status: int, fast: bool = False) -> None:
        """One request `version` answered with `status`, in `seconds` (`fast`: on the fast path), on the request's
        path: no lock, no I/O."""
        ms = seconds * 1000.0
        tags = self._tags.get(version)
        if tags is None:
            tags = self._tags[version] = {"serving_version": version}
            self.windows[version] = VersionWindow()
        self.tally.add(version, ms, status)
        self.windows[version].add(time.monotonic(), ms, status, fast)
        self._requests.inc(1, tags)
        self._latency.observe(ms, tags)
        if status != 200:
            self._errors.inc(1, {"serving_version": version, "status": str(status)})

    def as_dict(self) -> dict[str, Any]:
        """This replica's counts since it started, by version (what /version shows)."""
        return {"replica": self.replica, "since": self.since, "versions": self.tally.as_dict()}
