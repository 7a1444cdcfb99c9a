"""Model sources: models given by URL (``[[models]] path = "s3://…"`` / ``"https://…"``).

``errors`` (what a pull can fail on), ``manifest`` (``servehall-manifest.json``: every
file's size and SHA-256), ``store`` (the ``Store`` contract and :func:`open_store`),
``s3`` (S3-compatible stores through boto3), ``https`` (a plain HTTP(S) mirror),
``cache`` (the node-local cache: locks, leases, least-recently-used eviction), ``pull``
(one model from its store into the cache, verified) and ``push`` (a local directory
and its manifest into a store). docs/models.md, "Model sources".
"""
