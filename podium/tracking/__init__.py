"""The MLflow adapter: plain functions with explicit ids, no Prefect.

- `client`: the client, retry settings, outages (`TrackingUnavailable`), `TrackingRun`
- `runs`: the MLflow run of a podium run and its params
- `records`: one LoggedModel per checkpoint, its metrics and verdict
- `datasets`: a run's dataset inputs and lineage tags, re-scores, lookups by digest
- `models`: the champion as an MLflow model folder, logged into its checkpoint's LoggedModel (each promotion's build
  at a path of its own, the files its registered version names)
- `registry`: the registry read: registered versions, what an alias names, which serving location owns it
- `ledger`: the registry written: every alias, version, tag and claim that mirrors what serves (the only writer)
"""
