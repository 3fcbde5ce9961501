"""The serving location: immutable versions with manifests, one CURRENT pointer, the history.

- `layout`: the folder layout, the pointer, versions and history
- `history`: the promotion history read as a lineage of champions (pure)
- `location`: the location's identity: which registered model it promotes, under which alias
- `staging`: a new version's copy, hashed once and verified, inside the store where it can
- `staged`: versions being staged, and whether the process staging them is still there to finish them
- `live`: the live checks' pointers (SHADOW puts a candidate in shadow, WATCH says a new champion is watched after
  its switch) and the replicas' tallies of each
- `tabular`: the served classifier (a torch graph and what feeds it), as MLflow's pyfunc loads it
- `files_only`: the MLflow loader of a version served as files: it loads nothing and says why
"""
