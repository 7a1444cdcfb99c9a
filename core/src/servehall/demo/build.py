"""Building the demo model directory safely: file lock, temp dir, atomic rename.

Several processes (test workers, two ``servehall serve --demo``) may ask for the same
directory at once. Builders serialise on ``<parent>/.<name>.lock`` (``fcntl.flock``); the
model is written into a temporary sibling directory and moved into place with
``os.rename``, so a reader never sees a half-written model. A finished directory carries
``servehall-demo.json`` (builder version, seed, chat-template hash); a later call with the
same parameters returns it untouched.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from servehall.demo import corpus
from servehall.demo.model import CONTEXT_LENGTH, build_weights
from servehall.demo.tokenizer import DEMO_CHAT_TEMPLATE, train_tokenizer, write_tokenizer_files

BUILDER_VERSION = 1
MANIFEST = "servehall-demo.json"


def default_demo_dir() -> Path:
    """``$SERVEHALL_CACHE_DIR/demo-model``, else ``~/.cache/servehall/demo-model``."""
    base = os.environ.get("SERVEHALL_CACHE_DIR") or "~/.cache/servehall"
    return Path(base).expanduser() / "demo-model"


def _manifest(seed: int, chat_template: str) -> dict[str, object]:
    versions = {}
    for dist in ("tokenizers", "torch", "transformers", "safetensors"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "builder_version": BUILDER_VERSION,
        "seed": seed,
        "chat_template_sha256": hashlib.sha256(chat_template.encode()).hexdigest(),
        "context_length": CONTEXT_LENGTH,
        "versions": versions,
    }


def _matches(out: Path, want: dict[str, object]) -> bool:
    """True when ``out`` is a finished demo build with the same builder/seed/template."""
    try:
        have = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    keys = ("builder_version", "seed", "chat_template_sha256")
    return all(have.get(k) == want[k] for k in keys)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (a no-op where ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def build_demo_model(
    out: Path | str | None = None,
    *,
    force: bool = False,
    seed: int = 0,
    chat_template: str | None = None,
) -> Path:
    """Build (or reuse) the demo model in ``out`` and return its absolute path.

    Args:
        out: target directory; None means :func:`default_demo_dir`.
        force: rebuild even when a matching build exists.
        seed: seeds the corpus, the weight initialisation and the training run.
        chat_template: a Jinja chat template to store instead of the strict default
            :data:`~servehall.demo.tokenizer.DEMO_CHAT_TEMPLATE`.

    Returns the directory: ``config.json``, ``generation_config.json``,
    ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``,
    ``special_tokens_map.json`` and ``servehall-demo.json``. Takes a few seconds.

    Raises:
        FileExistsError: ``out`` exists, is not empty, and is not a demo-model build
            (it is never overwritten).
        ImportError: torch/transformers are missing (install ``servehall[torch]``).
    """
    target = Path(out if out is not None else default_demo_dir()).expanduser().resolve()
    template = chat_template if chat_template is not None else DEMO_CHAT_TEMPLATE
    want = _manifest(seed, template)
    if not force and _matches(target, want):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{target.name}.lock"):
        if not force and _matches(target, want):
            return target  # another process built it while we waited
        if target.exists() and any(target.iterdir()) and not (target / MANIFEST).exists():
            raise FileExistsError(f"{target} exists and is not a servehall demo model")
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
        try:
            tok = train_tokenizer(corpus.tokenizer_corpus(seed))
            write_tokenizer_files(tok, tmp, chat_template=template, model_max_length=CONTEXT_LENGTH)
            build_weights(tok, tmp, seed=seed)
            (tmp / MANIFEST).write_text(json.dumps(want, indent=2) + "\n")
            _swap_into_place(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _swap_into_place(tmp: Path, target: Path) -> None:
    """Move ``tmp`` to ``target``; an existing (demo) ``target`` is moved aside first."""
    if target.exists():
        old = target.parent / f".{target.name}.old-{os.getpid()}-{time.monotonic_ns()}"
        os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, target)
