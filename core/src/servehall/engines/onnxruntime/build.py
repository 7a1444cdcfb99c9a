"""Hugging Face directory → ONNX Runtime GenAI model directory, built once and cached.

:func:`resolve_onnx_dir` returns a directory that ``onnxruntime_genai.Model`` loads:

* an **ONNX GenAI directory** (has ``genai_config.json``) is used as it is;
* a **Hugging Face directory** (``config.json`` + weights) is converted with ONNX Runtime
  GenAI's model builder (``python -m onnxruntime_genai.models.builder -i SRC -o OUT -p
  PRECISION -e PROVIDER``, plus ``max_batch_size`` and, for continuous batching on CUDA,
  ``use_paged_attention``) into ``<cache_dir>/<name>-<key>/``. ``key`` is a SHA-256 over
  the source files, the build options and the versions of the converting packages, so a
  changed model, option or builder converts again and nothing else does.

The builder runs in a child process (torch and the builder never load into the serving
process) with a progress display; :func:`servehall.build_atomically` serialises
concurrent starts on a lock and renames a finished build into place; a finished directory
carries ``servehall-onnx.json``. The builder needs ``onnx`` and ``onnx-ir`` besides
torch and transformers (extra ``servehall[onnxruntime]``).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from servehall.engines.cache import build_atomically, installed_versions, servehall_cache_dir
from servehall.engines.conversion import run_converter, source_digest
from servehall.engines.onnxruntime.options import OrtOptions
from servehall.errors import ConfigError, EngineError

BUILDER_VERSION = 1
"""Bumped when this module changes what it asks the builder for."""
MARKER = "servehall-onnx.json"
GENAI_CONFIG = "genai_config.json"
BUILD_VERSIONS = ("onnxruntime-genai", "onnxruntime", "onnx", "onnx-ir", "transformers", "torch")
"""Distributions whose versions are part of the cache key."""


def default_cache_dir() -> Path:
    """``$SERVEHALL_CACHE_DIR/onnxruntime``, else ``~/.cache/servehall/onnxruntime``."""
    return servehall_cache_dir("onnxruntime")


def is_onnx_genai_dir(path: Path) -> bool:
    """True when ``path`` holds an ONNX Runtime GenAI model (``genai_config.json``)."""
    return (path / GENAI_CONFIG).is_file()


def builder_args(src: Path, out: Path, opts: OrtOptions) -> list[str]:
    """The model builder's command line for ``src`` → ``out`` under resolved ``opts``."""
    extra = [f"max_batch_size={opts.max_batch_size}"]
    if opts.paged_attention:
        extra.append("use_paged_attention=true")
    return [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(src),
        "-o",
        str(out),
        "-p",
        str(opts.precision),
        "-e",
        str(opts.provider),
        "-c",
        str(out / ".hf-cache"),
        "--extra_options",
        *extra,
    ]


def build_key(src: Path, opts: OrtOptions) -> str:
    """The cache key of ``src`` built with ``opts`` (see the module docstring)."""
    salt = [
        BUILDER_VERSION,
        opts.precision,
        opts.provider,
        opts.max_batch_size,
        bool(opts.paged_attention),
        installed_versions(BUILD_VERSIONS),
    ]
    return source_digest(src, salt)


def resolve_onnx_dir(src: Path, opts: OrtOptions, *, quiet: bool = False) -> Path:
    """The ONNX GenAI directory for model directory ``src`` (building once if needed).

    Args:
        src: an ONNX GenAI directory or a Hugging Face model directory.
        opts: resolved options (:meth:`OrtOptions.resolved`): precision, provider, batch.
        quiet: no progress display.

    Raises:
        ConfigError: ``src`` is neither kind of directory.
        EngineError: the builder failed (the message ends with its log tail) or produced
            no ``genai_config.json``.
    """
    src = Path(src).expanduser().resolve()
    if is_onnx_genai_dir(src):
        return src
    if not (src / "config.json").is_file():
        raise ConfigError(
            f"{src} is neither an ONNX Runtime GenAI directory ({GENAI_CONFIG}) "
            "nor a Hugging Face model directory (config.json)"
        )
    root = (opts.cache_dir or default_cache_dir()).expanduser().resolve()
    key = build_key(src, opts)

    def build(tmp: Path) -> None:
        run_converter(
            builder_args(src, tmp, opts),
            tmp / ".build.log",
            label=f"[bold]onnxruntime[/]: building {src.name} ({opts.precision}, {opts.provider})",
            what=f"building an ONNX Runtime GenAI model from {src}",
            quiet=quiet,
        )
        shutil.rmtree(tmp / ".hf-cache", ignore_errors=True)
        if not is_onnx_genai_dir(tmp):
            raise EngineError(f"the ONNX Runtime GenAI builder produced no {GENAI_CONFIG}")
        marker = {
            "source": str(src),
            "key": key,
            "precision": opts.precision,
            "provider": opts.provider,
            "max_batch_size": opts.max_batch_size,
            "paged_attention": bool(opts.paged_attention),
            "versions": installed_versions(BUILD_VERSIONS),
            "builder_version": BUILDER_VERSION,
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")

    target = root / f"{src.name}-{key[:20]}"
    return build_atomically(target, build, is_ready=lambda d: (d / MARKER).is_file())
