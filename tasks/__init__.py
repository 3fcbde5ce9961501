"""Units of work: typed functions that tests call without Prefect, and the Prefect tasks around them.

Most are plain calls; some act on the flow run they belong to (`approval` pauses it for a person's
answer, from a thread of its own, while the flow waits; `lineage`, `resume` and `promote` read it).

- `plan`: the preflight, turned into a RunPlan
- `resume`: what a resumed run changes
- `train`: the Ray Train run
- `validate`: one checkpoint's validation and its verdict
- `verdicts`: a checkpoint's verdict carried out (recorded, a failure announced), for every flow that validates
- `tracking`: recording checkpoints in MLflow
- `lineage`: where a run and a model come from
- `promote`: the promotion: the evidence gathered, the one decision taken, its carrying-out
- `evidence`: what a promotion is decided from (the records, the champion, the same-data re-scores, per-row values)
- `carry_out`: a promotion decision carried out in named steps (stage, verify, seal, switch, alias; challenge, shadow)
- `approval`: a person's approval of a candidate, the flow run paused for it
- `shadow`: a candidate shadowed on live requests (`podium serve`), and the verdict on the comparison
- `watch`: a new champion watched on live requests after its switch, rolled back if a limit breaks
- `live`: the one poller the shadow and the watch wait with (decided, stopped, CURRENT moved, over)
- `package`: the served model, built at promotion
- `retention`: storage keeps a run's best checkpoints
- `reconcile`: the registry and the records brought back in line with the serving history
- `rollback`: serving back one champion
- `news`: what podium decided, as Prefect events
- `report`: the Prefect artifacts people read
"""
