"""Building the demo model directory safely: file lock, temp dir, atomic rename.

Several processes (test workers, two ``servehall serve --demo``) may ask for the same
directory at once. :func:`servehall.engines.cache.build_atomically` serialises builders on
``<parent>/.<name>.lock`` (``fcntl.flock``); the model is written into a temporary sibling
directory and moved into place with ``os.rename``, so a reader never sees a half-written
model. A finished directory carries ``servehall-demo.json`` (builder version, seed,
chat-template hash); a later call with the same parameters returns it untouched.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from servehall.demo import corpus
from servehall.demo.model import CONTEXT_LENGTH, SIZES, build_weights
from servehall.demo.tokenizer import DEMO_CHAT_TEMPLATE, train_tokenizer, write_tokenizer_files
from servehall.engines.cache import build_atomically, installed_versions, servehall_cache_dir

log = logging.getLogger("servehall.demo")

BUILDER_VERSION = 3
MANIFEST = "servehall-demo.json"


def default_demo_dir(size: str = "demo") -> Path:
    """``$SERVEHALL_CACHE_DIR/demo-model``, else ``~/.cache/servehall/demo-model``
    (``demo-model-small`` for ``size="small"``)."""
    return servehall_cache_dir("demo-model" if size == "demo" else f"demo-model-{size}")


def _manifest(seed: int, chat_template: str, size: str) -> dict[str, object]:
    versions = installed_versions(("tokenizers", "torch", "transformers", "safetensors"))
    return {
        "builder_version": BUILDER_VERSION,
        "size": size,
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
    same_size = have.get("size", "demo") == want["size"]  # builds before sizes were demo
    return same_size and all(have.get(k) == want[k] for k in keys)


def build_demo_model(
    out: Path | str | None = None,
    *,
    force: bool = False,
    seed: int = 0,
    chat_template: str | None = None,
    size: str = "demo",
) -> Path:
    """Build (or reuse) the demo model in ``out`` and return its absolute path.

    Args:
        out: target directory; None means :func:`default_demo_dir` of ``size``.
        force: rebuild even when a matching build exists.
        seed: seeds the corpus, the weight initialisation and the training run.
        chat_template: a Jinja chat template to store instead of the strict default
            :data:`~servehall.demo.tokenizer.DEMO_CHAT_TEMPLATE`.
        size: a key of :data:`~servehall.demo.model.SIZES`: ``demo`` (~1.3 M parameters,
            seconds) or ``small`` (~24.6 M parameters, about a minute); same tokenizer,
            corpus and training recipe.

    Returns the directory: ``config.json``, ``generation_config.json``,
    ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``,
    ``special_tokens_map.json`` and ``servehall-demo.json``. Takes a few seconds.

    Raises:
        FileExistsError: ``out`` exists, is not empty, and is not a demo-model build
            (it is never overwritten).
        ImportError: torch/transformers are missing (install ``servehall[torch]``).
        ValueError: ``size`` is not a known size.
    """
    if size not in SIZES:
        raise ValueError(f"unknown demo model size {size!r}; known: {', '.join(SIZES)}")
    target = Path(out if out is not None else default_demo_dir(size)).expanduser().resolve()
    template = chat_template if chat_template is not None else DEMO_CHAT_TEMPLATE
    want = _manifest(seed, template, size)

    def build(tmp: Path) -> None:
        if target.exists() and any(target.iterdir()) and not (target / MANIFEST).exists():
            raise FileExistsError(f"{target} exists and is not a servehall demo model")
        log.info(
            "building the %s model in %s (once; %s)",
            size,
            target,
            "seconds" if size == "demo" else "about a minute",
        )
        tok = train_tokenizer(corpus.tokenizer_corpus(seed))
        write_tokenizer_files(tok, tmp, chat_template=template, model_max_length=CONTEXT_LENGTH)
        build_weights(tok, tmp, seed=seed, size=SIZES[size])
        (tmp / MANIFEST).write_text(json.dumps(want, indent=2) + "\n")

    return build_atomically(target, build, is_ready=lambda d: _matches(d, want), force=force)
