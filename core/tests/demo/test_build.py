"""Tests of servehall.demo: a real build of the demo model, loaded with transformers."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from servehall.demo import DEMO_CHAT_TEMPLATE, build_demo_model, default_demo_dir
from servehall.demo.build import MANIFEST
from servehall.demo.corpus import tokenizer_corpus
from servehall.demo.tokenizer import train_tokenizer, write_tokenizer_files

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    MANIFEST,
)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def demo_dir() -> Path:
    """The test session's demo model (the root conftest.py's cache dir: one build shared
    with every other test; the tests here only read it or check that it is reused)."""
    return build_demo_model(default_demo_dir())


@pytest.fixture(scope="module")
def hf(demo_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_dir), AutoModelForCausalLM.from_pretrained(demo_dir)


def _greedy(hf, ids: list[int], n: int) -> list[int]:  # type: ignore[no-untyped-def]
    import torch

    _, model = hf
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return [int(t) for t in out[0][len(ids) :]]


def test_demo_layout_and_size(demo_dir: Path) -> None:
    for name in FILES:
        assert (demo_dir / name).is_file(), name
    cfg = json.loads((demo_dir / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert cfg["max_position_embeddings"] == 2048
    assert (demo_dir / "model.safetensors").stat().st_size < 20 * 1024 * 1024


def test_concurrent_builds_are_deterministic_and_atomic(demo_dir: Path, tmp_path: Path) -> None:
    """Two processes build the same directory at once: one complete model results, and it
    is bit-identical to an independent build (tokenizer.json and weights); the build is
    announced once, by the process that builds."""
    target = tmp_path / "m"
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO); "
        "from servehall.demo import build_demo_model; print(build_demo_model(sys.argv[1]))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(target)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in results]
    assert [out.strip() for out, _ in results] == [str(target), str(target)]
    announced = "".join(err for _, err in results).count("building the demo model in")
    assert announced == 1
    for name in FILES:
        if name != MANIFEST:
            assert _sha(target / name) == _sha(demo_dir / name), name
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".m.build-")]
    assert leftovers == []


def test_reuse_without_rebuild(demo_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    before = (demo_dir / "model.safetensors").stat().st_mtime_ns
    with caplog.at_level("INFO", logger="servehall.demo"):
        assert build_demo_model(demo_dir) == demo_dir
    assert (demo_dir / "model.safetensors").stat().st_mtime_ns == before
    assert "building" not in caplog.text


def test_refuses_to_overwrite_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        build_demo_model(tmp_path, force=True)
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_default_dir_honours_cache_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SERVEHALL_CACHE_DIR", str(tmp_path))
    assert default_demo_dir() == tmp_path / "demo-model"
    monkeypatch.delenv("SERVEHALL_CACHE_DIR")
    assert default_demo_dir() == Path("~/.cache/servehall/demo-model").expanduser()


def test_tokenizer_roundtrip_and_special_tokens(hf) -> None:  # type: ignore[no-untyped-def]
    tok, _ = hf
    text = "Hello, wörld! ABCDEFGH 123 — unusual ☃ text"
    ids = tok(text).input_ids
    assert ids[0] == tok.convert_tokens_to_ids("<|begin_of_text|>")
    assert tok.decode(ids, skip_special_tokens=True) == text
    # special-token text inside user content is plain text when not split as special
    ids = tok("<|end|>", add_special_tokens=False, split_special_tokens=True).input_ids
    assert tok.convert_tokens_to_ids("<|end|>") not in ids


C05_PROMPTS = ("ABCDEFGH ABCDEFGH ABC", "Once upon a time", "1 2 3 4 5", "The cat")
"""API case C05's prompt first, then others that lead the demo model into its drills."""


def test_vocab_has_token_spanning_def(hf) -> None:  # type: ignore[no-untyped-def]
    """API case C05 needs a generated token whose text contains "DE" past its first char."""
    tok, _ = hf
    pieces = [tok.decode([i]) for i in tok("ABCDEFGH", add_special_tokens=False).input_ids]
    assert any("DEF" in p for p in pieces), pieces
    # the trained weights differ between CPUs (float rounding of their kernels), so the
    # prompt that leads the model into a drill does too: one of the case's candidates must
    gens = []
    for text in C05_PROMPTS:
        gen = [tok.decode([i]) for i in _greedy(hf, tok(text).input_ids, 30)]
        gens.append(gen)
        if any("DE" in p and not p.startswith("DE") for p in gen):
            return
    raise AssertionError(gens)


def test_greedy_generation_is_words_not_one_token(hf) -> None:  # type: ignore[no-untyped-def]
    tok, _ = hf
    gen = _greedy(hf, tok("The cat").input_ids, 24)
    assert len(set(gen)) >= 5, gen
    words = tok.decode(gen).split()
    assert {"the", "a"} & set(words), words


def test_chat_template_strict(hf) -> None:  # type: ignore[no-untyped-def]
    tok, _ = hf
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|><|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"
    )
    # a tool result renders (the Hermes tools section: docs/api.md#tools); a role the
    # template does not know does not
    assert "<tool_response>\nx\n</tool_response>" in tok.apply_chat_template(
        [{"role": "tool", "content": "x"}], tokenize=False
    )
    for bad in (
        [{"role": "narrator", "content": "x"}],
        [{"role": "user", "content": "x"}, {"role": "system", "content": "late"}],
        [{"role": "user", "content": None}],
    ):
        with pytest.raises(Exception, match=r"role|system|content"):
            tok.apply_chat_template(bad, tokenize=False)


def test_chat_template_variant_is_written(tmp_path: Path) -> None:
    tok = train_tokenizer(tokenizer_corpus(0)[:200])
    variant = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    write_tokenizer_files(tok, tmp_path, chat_template=variant, model_max_length=2048)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == variant != DEMO_CHAT_TEMPLATE


def test_cli_prints_path_and_reuses_build(demo_dir: Path) -> None:
    before = (demo_dir / "model.safetensors").stat().st_mtime_ns
    out = subprocess.run(
        [str(Path(sys.executable).parent / "servehall"), "demo-model", "--out", str(demo_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == str(demo_dir)
    assert (demo_dir / "model.safetensors").stat().st_mtime_ns == before


def test_tool_chats_render_as_the_template_does(hf) -> None:  # type: ignore[no-untyped-def]
    """The corpus renders its tool chats without Jinja; the served template must agree,
    or the model learns a format it is never prompted with."""
    import random

    from servehall.demo.structured import forced_call_chat, tool_chat
    from servehall.demo.tokenizer import render_tool_chat

    tok, _ = hf
    rng = random.Random(3)
    for i in range(30):
        tools, messages = (tool_chat if i % 3 else forced_call_chat)(rng)
        want = tok.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True
        )
        assert render_tool_chat(messages, tools, add_generation_prompt=True) == want


def test_structured_documents_are_valid_json() -> None:
    import random

    from servehall.demo import corpus
    from servehall.demo.structured import forced_call_chat, json_object, tool_chat

    rng = random.Random(0)
    for _ in range(200):
        json.loads(json_object(rng))
        _, messages = tool_chat(rng)
        for m in messages:
            for call in m.get("tool_calls", []):
                assert isinstance(json.loads(call["function"]["arguments"]), dict)
        assert isinstance(json.loads(forced_call_chat(rng)[1][-1]["content"]), list)
    kinds = {kind for kind, _ in corpus.documents(0)}
    assert kinds == {"text", "drill", "chat", "json", "json_chat", "tools", "forced"}


def test_tool_call_tags_are_single_plain_tokens(hf) -> None:  # type: ignore[no-untyped-def]
    tok, _ = hf
    for tag in ("<tool_call>", "</tool_call>"):
        ids = tok(tag, add_special_tokens=False).input_ids
        assert len(ids) == 1 and tok.decode(ids, skip_special_tokens=True) == tag


def test_training_stream_anchors_and_unlearned_tokens(demo_dir: Path) -> None:
    """A forced-call chat's first reply token (the ``[{"`` that ``tool_choice:
    "required"`` forces) is never learned and its anchor is the token after it; a tool
    chat's anchor is its reply's first token (``<tool_call>``)."""
    from tokenizers import Tokenizer

    from servehall.demo.model import training_stream

    tok = Tokenizer.from_file(str(demo_dir / "tokenizer.json"))
    stream = training_stream(tok, 0)
    assistant = tok.token_to_id("<|assistant|>")
    assert stream.unlearned
    anchors = set(stream.anchors)
    for i in stream.unlearned:
        assert stream.ids[i - 2] == assistant  # <|assistant|> \n [{"
        assert tok.decode([stream.ids[i]]).startswith("[")
        assert i + 1 in anchors and i not in anchors
    call = tok.token_to_id("<tool_call>")
    assert any(stream.ids[a] == call and stream.ids[a - 2] == assistant for a in anchors)
