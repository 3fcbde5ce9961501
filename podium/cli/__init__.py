"""The `podium` command: what a person or a scheduler starts. Nothing else in podium imports it.

- `main`: the parser and the entry point (`podium`, `python -m podium`, `python -m podium.cli`)
- `registry`: every command, each registering its own parser and handler (a new command: its module, one line here)
- `options`: the options of `run` and `promote` (and those `status` and `ui` read), and the configuration they set
- `errors`: the errors printed without a traceback, and the one table of their exit codes
- `signals`: the command's SIGINT and SIGTERM at start-up and after its run (the run's own: podium.flows.stop)
- `runs`: the parsers of `podium run` and `podium promote`
- `run`: `podium run` and `podium promote`: the start-up beside the servers, the flow run, its exit codes
- `recorded`: `podium promote` of a run on the run's own recorded settings, under the command's
- `status`: `podium status`: a run's checkpoints, what it promoted and why, its model's champion
- `ui`: `podium ui`: links to a run in the Prefect and MLflow UIs
- `rollback`: `podium rollback`: the previous champion again, as the Prefect flow `rollback`
- `history`: `podium history`: the champions of a serving location
- `decide`: `podium approve` and `podium reject`: answer a run awaiting approval
- `make_data`: `podium make-data`: the synthetic demo dataset
- `worker`: `podium worker`: a Prefect process worker for podium's deployments
- `server`: `podium server start|stop`: the local Prefect server of the embedded defaults
- `output`: what the commands print (a summary for people, or one JSON object)
- `serve`: `podium serve`: a serving location's champion over HTTP on Ray Serve, following its promotions
- `provenance`: `podium lineage`, and what `podium status` says about data and origins
- `k8s`: `podium k8s render` (Kubernetes manifests of podium's jobs) and `podium k8s watch` (a RayJob's end)
"""

from podium.cli.main import main

__all__ = ["main"]
