"""Serving the champion live: the Ray Serve deployment `podium serve` runs.

`podium.serving` is the serving location's files (the layout, history, staging); this package answers requests
with what that location names, on Ray Serve, in the replicas' processes:

- `server`: the deployment's class, a replica: the champion over HTTP (MLflow's scoring protocol), following
  CURRENT and SHADOW
- `fast`: the request path without a per-request DataFrame, for models whose input schema allows it
- `traffic`: its requests, errors and latency per version, in Ray Serve's metrics and on /version
- `port`: one `podium serve` per port, claimed before Ray starts
- `ingress`: what answers clients in front of the replicas (Ray Serve's HTTP proxy, or Ray's HAProxy ingress)

Like `podium.training`, it runs under Ray and never imports prefect; MLflow and torch load in the replica, when a
version loads, not at import.
"""
