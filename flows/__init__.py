"""Prefect flows, and the state a running flow keeps. No torch: what trains and validates runs in Ray
(the flows reach it through `podium.training`'s Ray-side modules: the cluster, the checkpoint stream, the
validation call).

- `pipeline`: the flow `train-validate-promote`
- `promote`: the flow `promote-run` (promotion alone, on a run that has trained)
- `rollback`: the flow `rollback` (`podium rollback`: serving back one champion, shown in the Prefect UI)
- `validate_announced`: the flow `validate-announced-checkpoint`, one run per checkpoint announced by a job of its own
- `stream`, `validation`, `stop`, `summary`: a running flow's state: the checkpoints as they are announced,
  their validations (at most `concurrency` at once), a clean stop on a signal, the run's end
- `naming`: what a podium flow run looks like in Prefect, whoever starts it
"""
