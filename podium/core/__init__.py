"""The nouns and the decisions of a podium run: pure, no I/O, importing nothing else of podium.

- `records`: a checkpoint's record and its statuses, the champion
- `events`: what a checkpoint announcement carries, what a report asked of validation, what a validation returned
- `verdict`: a checkpoint's verdict, decided by one function (`decide_verdict`)
- `early_stop`: when training stops early, from the verdicts in step order
- `retention`: which checkpoints storage keeps when a run keeps only some
- `promotion`: the best checkpoint and the promotion decision
- `policy`: the promotion policy's thresholds, guards and confidence, checked on a candidate
- `comparison`: which numbers a promotion compared, on which data (the same-data gate)
- `approval`: a person's decision on a candidate awaiting approval, and what no decision in time means
- `live`: the live checks as two policies over the replicas' numbers: a candidate's shadow on live requests
  (whether it passed) and a new champion's watch after its switch (whether it stays), in one set of states
- `traffic`: a replica's live requests per served version (counts, errors, latency quantiles from fixed buckets),
  and the tallies it writes of a shadow and a watch
- `numbers`: finite or not, listed for people
- `failures`: failure reasons as people read them
- `redaction`: credentials kept out of messages, logs and records
- `served`: how a promoted version is served (an MLflow model, or its files), in the words every output uses
- `version`: podium's version
- `exits`: podium's exit codes, defined once
- `rayjob`: what a KubeRay RayJob's status means for podium: a Prefect flow-run state and an exit code
"""
