"""Where bytes live: local paths and object stores (pyarrow, fsspec). No Prefect, no MLflow, no torch.

- `backends`: one backend per store, chosen by the URI's scheme (local, S3, GCS, Azure Blob, a filesystem of
  your own): the only place that tells stores apart (S3's client adapter and its transfers in parts among them)
- `locations`: paths and URIs, the pyarrow and fsspec filesystems for them
- `errors`: the error a location that cannot be used raises
- `documents`: JSON documents, written atomically and read in one GET
- `fingerprint`: which data is this: a Parquet dataset's digest from its footers
- `preflight`: is a location usable, checked before anything runs
- `lease`: a lock on a location (flock locally, a lease object on an object store's conditional writes)
"""
