"""The serving location: immutable versions with manifests, one CURRENT pointer, the history; loading the champion.

- `layout`: the folder layout, the pointer, versions and history (atomic JSON documents)
- `staging`: a new version's copy, hashed once and verified, inside the store where it can
- `load`: the champion as a model, checked against its manifest
"""
