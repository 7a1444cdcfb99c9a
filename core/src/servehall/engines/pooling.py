"""How an embedding model turns its last hidden states into one vector per input.

sentence-transformers describes it in the model directory: ``modules.json`` lists the
modules (``Transformer``, ``Pooling``, optionally ``Dense`` projections and
``Normalize``), the pooling module's ``config.json`` (e.g. ``1_Pooling/config.json``)
says which pooling (``"pooling_mode": "mean"`` as sentence-transformers 6 saves it, or
the booleans ``pooling_mode_mean_tokens``, ``pooling_mode_cls_token``, ... of earlier
versions), each ``Dense`` module's ``config.json`` its ``out_features``, and
``sentence_bert_config.json`` the longest input the model was trained for
(``max_seq_length``, tokens). :func:`read_pooling` reads them; :func:`pool` applies
them to a padded batch (torch tensors), :func:`embedding_facts` is what an engine
reports of them. Matryoshka support is what ``config.json`` declares, as vLLM reads it:
``matryoshka_dimensions`` (the dimensions it was trained for) or ``is_matryoshka: true``
(any dimension).

A directory without ``modules.json`` is pooled by mean over the attention mask and
L2-normalised (what sentence-transformers builds for a plain transformers model, plus
the normalisation retrieval expects).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from servehall.engines.kit import read_json_object
from servehall.errors import ConfigError

PoolingMode = Literal["mean", "cls", "max", "mean_sqrt_len", "lasttoken"]

_MODES: dict[str, PoolingMode] = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "lasttoken",
}
"""The pooling config's boolean keys (sentence-transformers before 6) and their modes."""
_NAMED: dict[str, PoolingMode] = {
    "cls": "cls",
    "mean": "mean",
    "max": "max",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "lasttoken": "lasttoken",
}
"""The pooling config's ``pooling_mode`` names (sentence-transformers 6) and their modes."""


@dataclass(frozen=True, slots=True)
class PoolingConfig:
    """One embedding model's pooling.

    Attributes:
        mode: which hidden states make the vector (``mean`` over the unmasked tokens,
            the ``cls`` (first) token, element-wise ``max``, ``mean_sqrt_len`` (sum /
            sqrt(length)), ``lasttoken`` (the last unmasked token)).
        normalize: L2-normalise the pooled vector (a ``Normalize`` module).
        max_seq_length: the longest input in tokens the model was trained for:
            ``sentence_bert_config.json``'s ``max_seq_length``, else (sentence-transformers
            6 saves none) the tokenizer's ``model_max_length``, as its ``Transformer``
            module reads it (None: the model config's ``max_position_embeddings`` rules).
        matryoshka: the model declares Matryoshka representations (a prefix of the
            vector, renormalised, is a valid embedding).
        matryoshka_dimensions: the dimensions it was trained for (empty: any, when
            ``matryoshka``).
        dense_out_features: ``out_features`` of each ``Dense`` module (a linear
            projection of the pooled vector, from its ``config.json``), in order; empty:
            none, the vector has the transformer's ``hidden_size`` floats. With Dense
            modules the model's embeddings are the last one's size.
    """

    mode: PoolingMode = "mean"
    normalize: bool = True
    max_seq_length: int | None = None
    matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()
    dense_out_features: tuple[int, ...] = ()


_UNSET_MAX_LENGTH = 1 << 40
"""A ``model_max_length`` this large means "not set" (transformers writes ``int(1e30)``)."""


def read_pooling(path: Path) -> PoolingConfig:
    """The pooling of the model directory ``path`` (see the module docstring).

    Raises:
        ConfigError: a file is unreadable JSON, the pooling config enables no mode or
            several, or enables one this server does not implement, or a ``Dense``
            module's ``config.json`` has no positive integer ``out_features``.
    """
    config = read_json_object(path / "config.json")
    dims_raw = config.get("matryoshka_dimensions")
    dims = tuple(int(d) for d in dims_raw) if isinstance(dims_raw, list) else ()
    matryoshka = bool(dims) or config.get("is_matryoshka") is True
    st_config = read_json_object(path / "sentence_bert_config.json")
    max_seq = st_config.get("max_seq_length")
    if max_seq is None and (path / "modules.json").is_file():
        # sentence-transformers 6 saves no max_seq_length: its Transformer module reads
        # the tokenizer's model_max_length (unset in transformers is ~1e30)
        max_seq = read_json_object(path / "tokenizer_config.json").get("model_max_length")
    max_seq_length = (
        int(max_seq) if isinstance(max_seq, int) and 0 < max_seq < _UNSET_MAX_LENGTH else None
    )
    modules = _read_modules(path / "modules.json")
    if modules is None:
        return PoolingConfig("mean", True, max_seq_length, matryoshka, dims)
    types = [str(m.get("type", "")) for m in modules]
    normalize = any(t.endswith(".Normalize") for t in types)
    pooling = next((m for m in modules if str(m.get("type", "")).endswith(".Pooling")), None)
    if pooling is None:
        raise ConfigError(f"{path / 'modules.json'} has no Pooling module")
    pool_cfg = read_json_object(path / str(pooling.get("path", "")) / "config.json")
    mode = _pooling_mode(path, pool_cfg)
    dense = tuple(
        _dense_out_features(path / str(m.get("path", "")))
        for m in modules
        if str(m.get("type", "")).endswith(".Dense")
    )
    return PoolingConfig(mode, normalize, max_seq_length, matryoshka, dims, dense)


def _pooling_mode(path: Path, pool_cfg: dict[str, Any]) -> PoolingMode:
    """The one mode of a pooling config: ``"pooling_mode": "mean"`` (a name, or a list
    of one; sentence-transformers 6 saves it so, and reads it before any boolean key),
    else the one true ``pooling_mode_*_tokens`` boolean (earlier versions)."""
    named = pool_cfg.get("pooling_mode")
    if named is not None:
        names = named if isinstance(named, list) else [named]
        if len(names) == 1 and isinstance(names[0], str) and names[0] in _NAMED:
            return _NAMED[names[0]]
        raise ConfigError(
            f"{path}: pooling_mode {named!r} is not supported; one of {sorted(_NAMED)}"
        )
    enabled = [mode for key, mode in _MODES.items() if pool_cfg.get(key) is True]
    unknown = [
        k
        for k, v in pool_cfg.items()
        if k.startswith("pooling_mode_") and v is True and k not in _MODES
    ]
    if unknown or len(enabled) != 1:
        raise ConfigError(
            f"{path}: pooling {unknown or enabled or 'none'} is not supported; one of "
            f"{sorted(set(_MODES.values()))} must be set"
        )
    return enabled[0]


def _dense_out_features(module_dir: Path) -> int:
    out = read_json_object(module_dir / "config.json").get("out_features")
    if not isinstance(out, int) or isinstance(out, bool) or out <= 0:
        raise ConfigError(
            f"{module_dir / 'config.json'}: a sentence-transformers Dense module needs a "
            f"positive integer 'out_features' (got {out!r})"
        )
    return out


def _read_modules(path: Path) -> list[dict[str, Any]] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, list):
        raise ConfigError(f"{path} is not a list of modules")
    return [m for m in data if isinstance(m, dict)]


def refuse_dense(config: PoolingConfig, model: str, path: Path, engine: str) -> None:
    """Refuse a model whose sentence-transformers modules include ``Dense`` projections
    when ``engine`` (``"the torch embedding engine"``…) pools the transformer's hidden
    states without applying them: its vectors would be neither the model's values nor
    its size.

    Raises:
        ConfigError: naming ``models.<model>.path``.
    """
    if not config.dense_out_features:
        return
    key = f"models.{model}.path"
    msg = (
        f"{path} is a sentence-transformers model with Dense projection modules "
        f"(modules.json; {config.dense_out_features[-1]}-dimensional embeddings); "
        f"{engine} pools the transformer's hidden states and does not apply Dense "
        "modules, so it cannot serve this model's embeddings"
    )
    raise ConfigError(f"{key}: {msg}", [(key, msg)])


def embedding_facts(config: PoolingConfig, dim: int) -> dict[str, Any]:
    """What an embedding engine reports of its model in ``ModelInfo.extra``: ``task``
    (``"embed"``), ``embedding_dim`` (``dim``, floats per vector), ``pooling``,
    ``normalize``, ``matryoshka`` and ``matryoshka_dimensions`` (a list)."""
    return {
        "task": "embed",
        "embedding_dim": dim,
        "pooling": config.mode,
        "normalize": config.normalize,
        "matryoshka": config.matryoshka,
        "matryoshka_dimensions": list(config.matryoshka_dimensions),
    }


def pool(hidden: Any, mask: Any, config: PoolingConfig) -> Any:
    """Pool a padded batch: ``hidden`` ``[batch, seq, dim]`` float, ``mask`` ``[batch,
    seq]`` (1 = token, 0 = padding; right-padded) → ``[batch, dim]`` float32,
    L2-normalised when ``config.normalize``."""
    import torch

    hidden = hidden.float()
    m = mask.unsqueeze(-1).to(hidden.dtype)
    if config.mode == "cls":
        out = hidden[:, 0]
    elif config.mode == "max":
        out = hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).amax(dim=1)
    elif config.mode == "lasttoken":
        last = mask.sum(dim=1).long() - 1
        out = hidden[torch.arange(hidden.shape[0]), last]
    else:
        summed = (hidden * m).sum(dim=1)
        counts = m.sum(dim=1).clamp(min=1e-9)
        out = summed / (counts.sqrt() if config.mode == "mean_sqrt_len" else counts)
    if config.normalize:
        out = torch.nn.functional.normalize(out, p=2, dim=1)
    return out


def pool_numpy(hidden: Any, mask: Any, config: PoolingConfig) -> Any:
    """:func:`pool` on numpy arrays, for engines without torch in the serving process
    (``openvino_cpu``): ``hidden`` ``[batch, seq, dim]``, ``mask`` ``[batch, seq]`` (1 =
    token, 0 = padding; right-padded) → ``[batch, dim]`` float32, L2-normalised (a zero
    vector stays zero) when ``config.normalize``. Computed in float32, as :func:`pool`."""
    import numpy as np

    hidden = np.asarray(hidden, dtype=np.float32)
    mask = np.asarray(mask)
    m = mask[..., None].astype(np.float32)
    if config.mode == "cls":
        out = hidden[:, 0]
    elif config.mode == "max":
        out = np.where(m > 0, hidden, np.finfo(np.float32).min).max(axis=1)
    elif config.mode == "lasttoken":
        last = mask.sum(axis=1).astype(np.int64) - 1
        out = hidden[np.arange(hidden.shape[0]), last]
    else:
        summed = (hidden * m).sum(axis=1)
        counts = np.maximum(m.sum(axis=1), np.float32(1e-9))
        out = summed / (np.sqrt(counts) if config.mode == "mean_sqrt_len" else counts)
    if config.normalize:
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = out / np.maximum(norms, np.float32(1e-12))  # torch's F.normalize eps
    return out.astype(np.float32)


def truncate(vector: list[float], dimensions: int, *, normalize: bool) -> list[float]:
    """The first ``dimensions`` values of ``vector`` (Matryoshka), L2-renormalised when
    ``normalize`` (a zero vector stays zero)."""
    out = vector[:dimensions]
    if normalize:
        norm = sum(x * x for x in out) ** 0.5
        if norm > 0:
            out = [x / norm for x in out]
    return out
