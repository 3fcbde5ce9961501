"""The MLflow adapter: plain functions with explicit ids, no Prefect.

- `client`: the client, retry settings, outages (`TrackingUnavailable`), `TrackingRun`
- `runs`: the MLflow run of a podium run and its params
- `records`: one LoggedModel per checkpoint, its metrics and verdict
- `registry`: registered versions and the champion alias
"""
