"""Where bytes live: local paths and S3 (pyarrow, fsspec, s3fs). No Prefect, no MLflow, no torch.

- `locations`: paths and URIs, the pyarrow and fsspec filesystems for them
- `s3`: the S3 adapter (settings, client, retries, error codes; the only module that knows s3fs's internals)
- `transfer`: one object in concurrent parts (multipart upload, ranged GETs) under pyarrow's streams
- `documents`: JSON documents, written atomically and read in one GET
- `fingerprint`: which data is this: a Parquet dataset's digest from its footers
- `preflight`: is a location usable, checked before anything runs
- `lease`: a lock on a location (flock locally, a lease object on S3)
"""
