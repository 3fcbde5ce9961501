"""Where bytes live: local paths and object stores (pyarrow, fsspec). No Prefect, no MLflow, no torch.

- `backends`: one backend per store, chosen by the URI's scheme (local, S3, GCS, Azure Blob): the only place
  that tells stores apart
- `locations`: paths and URIs, the pyarrow and fsspec filesystems for them
- `errors`: the error a location that cannot be used raises
- `s3`: the S3 client adapter (settings, client, retries, error codes; the only module that knows s3fs's internals)
- `transfer`: one S3 object in concurrent parts (multipart upload, ranged GETs) under pyarrow's streams
- `documents`: JSON documents, written atomically and read in one GET
- `fingerprint`: which data is this: a Parquet dataset's digest from its footers
- `preflight`: is a location usable, checked before anything runs
- `lease`: a lock on a location (flock locally, a lease object on an object store's conditional writes)
"""
