"""Units of work: plain, typed functions that tests call directly, and the Prefect tasks around them.

- `plan`: the preflight, turned into a RunPlan; `resume`: what a resumed run changes
- `train`: the Ray Train run; `validate`: one checkpoint's validation and its verdict
- `tracking`: recording checkpoints in MLflow; `lineage`: where a run and a model come from
- `promote`: the promotion: `evidence` gathers what it is decided from (the same-data gate, per-row values),
  `carry_out` carries the decision out in named steps, `package` builds the served model
- `report`: the Prefect artifacts people read; `rollback`: serving back one champion (the CLI's)
"""
