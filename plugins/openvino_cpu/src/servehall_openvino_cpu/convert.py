"""Hugging Face directory → OpenVINO IR, converted once and cached.

:func:`resolve_ir_dir` returns a directory that ``openvino_genai`` can load:

* an **OpenVINO IR directory** (has ``openvino_model.xml``) is used as it is;
* a **Hugging Face directory** (``config.json`` + weights) is converted with optimum-intel's
  exporter (``optimum.exporters.openvino.main_export``, task ``text-generation-with-past``,
  stateful model; for an embedding model (``[[models]] task = "embed"``) task
  ``feature-extraction``: the encoder alone, ``input_ids`` / ``attention_mask`` (/
  ``token_type_ids``) in, ``last_hidden_state`` out, no pooling) plus ``openvino_tokenizers``
  for the tokenizer/detokenizer IR, into ``<cache_dir>/<name>-<key>/``. ``key`` is a
  SHA-256 over every source file (relative path, size, content), the weight format (with
  its compression parameters), the export task (when not the default) and the versions of
  the converting packages, so a changed model or an upgraded exporter converts again, and
  nothing else does.

Integer weight formats (``int8*``, ``int4*``) are exported in fp32 and then compressed
with NNCF's data-free weight compression (``nncf.compress_weights``: the same algorithm
``optimum-cli export openvino --weight-format int4`` applies), in the same child process;
the compressed IR replaces the fp32 one before the directory is renamed into place.
(``main_export(ov_config=OVConfig(quantization_config=...))`` alone does not compress in
optimum-intel 2.x: the CLI runs a separate quantization step after the export.)

The export runs in a child Python process (``python -m servehall_openvino_cpu.convert``):
torch and the exporter never load into the serving process, and their memory is returned
when it exits. :func:`servehall.build_atomically` makes concurrent starts serialise on
``<cache_dir>/.<name>-<key>.lock`` (``fcntl``) and writes the result to a temporary sibling
that is renamed into place; a finished directory carries ``servehall-convert.json``.
While converting, a rich progress display (spinner, elapsed time) runs on stderr; on
failure the exporter's log tail is in the error.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from servehall import (
    ConfigError,
    EngineError,
    build_atomically,
    installed_versions,
    run_converter,
    servehall_cache_dir,
    source_digest,
)
from servehall_openvino_cpu.options import WEIGHT_FORMATS, weight_compression

log = logging.getLogger("servehall.openvino_cpu")

CONVERTER_VERSION = 1
MARKER = "servehall-convert.json"
IR_MODEL = "openvino_model.xml"
CONVERT_VERSIONS = (
    "openvino",
    "openvino-genai",
    "openvino-tokenizers",
    "optimum-intel",
    "optimum",
    "transformers",
    "torch",
)
EXPORTER_INSTALL = "pip install --no-deps 'optimum-intel==2.2.*'"
GENERATE_TASK = "text-generation-with-past"
"""optimum's export task for a language model (stateful, KV cache inside)."""
EMBED_TASK = "feature-extraction"
"""optimum's export task for an embedding model: the encoder's ``last_hidden_state``."""
EXPORT_TASKS = (GENERATE_TASK, EMBED_TASK)
"""How to install the exporter (its declared torchvision requirement is not needed)."""


def exporter_installed() -> bool:
    """True when optimum-intel (the Hugging Face → IR exporter) is installed.

    Read from distribution metadata, without importing it (optimum imports torch).
    """
    try:
        metadata.version("optimum-intel")
    except metadata.PackageNotFoundError:
        return False
    return True


def default_cache_dir() -> Path:
    """``$SERVEHALL_CACHE_DIR/openvino``, else ``~/.cache/servehall/openvino``."""
    return servehall_cache_dir("openvino")


def is_ir_dir(path: Path) -> bool:
    """True when ``path`` holds an OpenVINO IR language model."""
    return (path / IR_MODEL).is_file()


def _versions() -> dict[str, str | None]:
    return installed_versions(CONVERT_VERSIONS)


def source_key(
    src: Path,
    weight_format: str,
    compression: Mapping[str, Any] | None = None,
    task: str = GENERATE_TASK,
) -> str:
    """SHA-256 hex over the source files (path, size, content), options and versions.

    With ``compression`` (from :func:`~servehall_openvino_cpu.options.weight_compression`)
    the key covers it and NNCF's version instead of the format's name; fp32/fp16 keys
    are those of before. A ``task`` other than :data:`GENERATE_TASK` is part of the key
    (the language-model keys are those of before).
    """
    extra: list[Any] = [] if task == GENERATE_TASK else [task]
    if compression is None:
        return source_digest(src, [CONVERTER_VERSION, weight_format, _versions(), *extra])
    # keyed on the NNCF parameters, not the spelling: int8 and int8_asym share one IR
    return source_digest(src, [CONVERTER_VERSION, dict(compression), _versions(), _nncf(), *extra])


def _nncf() -> dict[str, str | None]:
    return installed_versions(("nncf",))


def resolve_ir_dir(
    src: Path,
    *,
    cache_dir: Path | None = None,
    weight_format: str = "fp32",
    group_size: int | None = None,
    ratio: float | None = None,
    quiet: bool = False,
    task: str = GENERATE_TASK,
) -> Path:
    """The OpenVINO IR directory for model directory ``src`` (converting once if needed).

    ``weight_format``, ``group_size`` and ``ratio`` are the options ``weight_format``,
    ``weight_group_size`` and ``weight_ratio`` (ignored when ``src`` is an IR directory);
    ``task`` is the export task (:data:`GENERATE_TASK` or :data:`EMBED_TASK`).

    Raises:
        ConfigError: ``src`` is neither an IR nor a Hugging Face model directory, or it
            is a Hugging Face directory without a cached IR and optimum-intel is not
            installed (the message says how to install it).
        EngineError: the conversion failed (message ends with the exporter's log tail).
    """
    src = Path(src).expanduser().resolve()
    if is_ir_dir(src):
        return src
    if not (src / "config.json").is_file():
        raise ConfigError(
            f"{src} is neither an OpenVINO IR directory ({IR_MODEL}) "
            "nor a Hugging Face model directory (config.json)"
        )
    try:
        compression = weight_compression(weight_format, group_size, ratio)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    root = (cache_dir or default_cache_dir()).expanduser().resolve()
    if task not in EXPORT_TASKS:
        raise ValueError(f"unknown export task {task!r}; one of {EXPORT_TASKS}")
    key = source_key(src, weight_format, compression, task)

    def convert(tmp: Path) -> None:
        _run_export(src, tmp, weight_format, compression, quiet=quiet, task=task)
        marker = {
            "source": str(src),
            "key": key,
            "task": task,
            "weight_format": weight_format,
            "compression": compression,
            "versions": _versions() | (_nncf() if compression is not None else {}),
            "converter_version": CONVERTER_VERSION,
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")

    target = root / f"{src.name}-{key[:20]}"
    if not (target / MARKER).is_file() and not exporter_installed():
        raise ConfigError(
            f"{src} is a Hugging Face model directory; converting it to OpenVINO IR needs "
            f"optimum-intel, which is not installed: {EXPORTER_INSTALL} "
            "(or point the model's path at an OpenVINO IR directory)"
        )
    return build_atomically(target, convert, is_ready=lambda d: (d / MARKER).is_file())


def _run_export(
    src: Path,
    out: Path,
    weight_format: str,
    compression: Mapping[str, Any] | None,
    *,
    quiet: bool,
    task: str = GENERATE_TASK,
) -> None:
    """Run the exporter in a child process, with a progress display on stderr."""
    cmd = [sys.executable, "-m", "servehall_openvino_cpu.convert", str(src), str(out)]
    cmd += ["--weight-format", weight_format, "--task", task]
    if compression is not None:
        cmd += ["--compression", json.dumps(dict(compression))]
    if not quiet:
        log.info(
            "converting %s to OpenVINO IR, %s weights (once; the result is cached)",
            src.name,
            weight_format,
        )
    run_converter(
        cmd,
        out / "convert.log",
        label=f"[bold]openvino_cpu[/]: converting {src.name} to OpenVINO IR",
        what=f"converting {src} to OpenVINO IR",
        quiet=quiet,
    )
    if not is_ir_dir(out):
        raise EngineError(f"converting {src} produced no {IR_MODEL}")
    if not quiet:
        log.info("converted %s to OpenVINO IR (cached in %s)", src.name, out.parent)


def export(
    src: Path,
    out: Path,
    weight_format: str,
    compression: Mapping[str, Any] | None = None,
    task: str = GENERATE_TASK,
) -> None:
    """Export ``src`` into ``out`` in this process (the child's work; imports torch).

    ``fp16`` stores fp16 weights; with ``compression`` the fp32 export is then
    compressed by :func:`compress_weights`. ``task`` is optimum's export task
    (:data:`GENERATE_TASK`, or :data:`EMBED_TASK` for an encoder's hidden states; with
    ``library_name="transformers"`` a sentence-transformers directory is exported
    without its pooling, which the engine applies).
    """
    from optimum.exporters.openvino import main_export
    from optimum.intel import OVConfig

    # an explicit ov_config also stops optimum's own int8 default for models >= 1 B
    ov_config = OVConfig(dtype="fp16" if weight_format == "fp16" else "fp32")
    main_export(
        str(src),
        str(out),
        task=task,
        local_files_only=True,
        convert_tokenizer=False,
        library_name="transformers",
        ov_config=ov_config,
    )
    if compression is not None:
        compress_weights(out, compression)
    _convert_tokenizer(src, out)


def compress_weights(ir_dir: Path, compression: Mapping[str, Any]) -> None:
    """Compress the weights of ``ir_dir/openvino_model.xml`` in place with NNCF.

    ``compression`` is :func:`~servehall_openvino_cpu.options.weight_compression`'s
    dict. Data-free (no calibration set): weights become u8/u4 constants with per-channel
    (8-bit) or per-group (4-bit) scales and zero points, decompressed on the fly by the
    CPU plugin. The new IR is written beside the old one and renamed over it.

    Raises:
        ImportError: nncf is not installed.
        nncf.InvalidGroupSizeError etc.: NNCF refused the parameters (the child's log).
    """
    import nncf
    import openvino as ov
    from nncf.quantization.advanced_parameters import (
        AdvancedCompressionParameters,
        GroupSizeFallbackMode,
    )

    xml = ir_dir / IR_MODEL
    kwargs: dict[str, Any] = {"mode": nncf.CompressWeightsMode(compression["mode"])}
    if "group_size" in compression:
        kwargs["group_size"] = int(compression["group_size"])
        kwargs["ratio"] = float(compression["ratio"])
        kwargs["advanced_parameters"] = AdvancedCompressionParameters(
            group_size_fallback_mode=GroupSizeFallbackMode(compression["group_size_fallback"])
        )
    model = nncf.compress_weights(ov.Core().read_model(str(xml)), **kwargs)
    tmp = ir_dir / "openvino_model.compressed.xml"
    ov.save_model(model, str(tmp), compress_to_fp16=False)
    del model  # releases the memory-mapped fp32 .bin before it is replaced
    gc.collect()
    tmp.with_suffix(".bin").replace(xml.with_suffix(".bin"))
    tmp.replace(xml)


def _convert_tokenizer(src: Path, out: Path) -> None:
    """Write ``openvino_tokenizer.xml``/``openvino_detokenizer.xml`` (openvino_tokenizers).

    The host tokenizes with the Hugging Face tokenizer, so a tokenizer that
    openvino_tokenizers cannot convert is reported and skipped, not fatal.
    """
    try:
        import openvino as ov
        from openvino_tokenizers import convert_tokenizer
        from transformers import AutoTokenizer

        hf_tok = AutoTokenizer.from_pretrained(src, local_files_only=True)
        tok, detok = convert_tokenizer(hf_tok, with_detokenizer=True)
        ov.save_model(tok, str(out / "openvino_tokenizer.xml"))
        ov.save_model(detok, str(out / "openvino_detokenizer.xml"))
    except Exception as exc:  # the engine works on token ids without them
        print(f"warning: tokenizer not converted: {type(exc).__name__}: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """``python -m servehall_openvino_cpu.convert SRC OUT [--weight-format F]
    [--compression JSON] [--task T]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--weight-format", default="fp32", choices=WEIGHT_FORMATS)
    parser.add_argument("--compression", type=json.loads, default=None)
    parser.add_argument("--task", default=GENERATE_TASK, choices=EXPORT_TASKS)
    args = parser.parse_args(argv)
    export(args.src, args.out, args.weight_format, args.compression, args.task)
    return 0


if __name__ == "__main__":
    sys.exit(main())
