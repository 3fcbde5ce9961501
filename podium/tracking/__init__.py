"""The MLflow adapter: plain functions with explicit ids, no Prefect.

- `client`: the client, retry settings, outages (`TrackingUnavailable`), `TrackingRun`
- `runs`: the MLflow run of a podium run and its params
- `records`: one LoggedModel per checkpoint, its metrics and verdict
- `datasets`: a run's dataset inputs and lineage tags, re-scores, lookups by digest
- `models`: the champion as an MLflow model folder, logged into its checkpoint's LoggedModel
- `registry`: registered versions and the champion alias
"""
