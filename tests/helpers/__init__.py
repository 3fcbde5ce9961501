"""What the tests share, in the test process (never the user's code that Ray's workers import: that stays in
tests/integration, on their path).

- `commands`: the `podium` command run as a user runs it, in its own process.
- `prefect_queries`: flow runs, task runs, events, artifacts and logs read back from the Prefect API.
- `servers`: an MLflow server, a Ray head (`ray start`), a model server; waiting for one; filling a disk.
- `s3_server`: an S3 server (moto) on loopback, and a relay that drops its connections on demand.
- `served_checks`: the champion loaded and answered the MLflow ways.
"""
