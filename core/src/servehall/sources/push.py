"""``servehall models push DIR URL``: a local model directory into a store, manifest last.

Every file is uploaded as ``URL/<path>``, then ``servehall-manifest.json`` (sizes and
SHA-256 digests): a pull that starts while a push runs finds the previous manifest, or
none, never one that names files not yet uploaded.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from servehall.config.models import ModelStoreSettings
from servehall.sources.manifest import MANIFEST_NAME, Manifest, build_manifest
from servehall.sources.store import Store, open_store

log = logging.getLogger("servehall.sources")


def push(
    model_dir: Path, url: str, settings: ModelStoreSettings, store: Store | None = None
) -> Manifest:
    """Upload ``model_dir`` to ``url`` with its manifest (see the module docstring).

    Raises:
        SourceError: ``model_dir`` is not a directory or is empty, a read-only store
            (``https://``), refused credentials.
        StoreUnavailableError: the store did not answer.
    """
    manifest = build_manifest(model_dir)
    store = store or open_store(url, settings)
    for f in manifest.files:
        store.upload(model_dir / f.path, f.path)
        log.info("pushed %s (%d bytes)", f.path, f.size)
    with tempfile.TemporaryDirectory(prefix="servehall-push-") as tmp:
        path = Path(tmp) / MANIFEST_NAME
        path.write_bytes(manifest.raw)
        store.upload(path, MANIFEST_NAME)
    return manifest
