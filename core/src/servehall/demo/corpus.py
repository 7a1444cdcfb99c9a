"""A deterministic English-like corpus for the demo model, generated from fixed word lists.

Nothing is read from disk or the network: the text is a pure function of ``seed`` (it uses
:class:`random.Random`, whose ``choice``/``random`` streams are stable across Python
versions), so every machine trains the same tokenizer. The corpus mixes

* short declarative sentences from a small grammar (so a briefly trained model emits real
  words),
* chat exchanges in the demo chat format (so the model learns to answer and end its turn),
* letter/number drills such as ``ABCDEFGH ABCDEFGH ...`` (so the vocabulary has tokens
  that span several letters, e.g. one containing ``DEF``, which API case C05 needs).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from servehall.demo import structured

SUBJECTS = (
    "the cat",
    "the dog",
    "a bird",
    "the farmer",
    "my friend",
    "the teacher",
    "a child",
    "the river",
    "the wind",
    "an old man",
    "the queen",
    "a small robot",
    "the baker",
    "the doctor",
    "a young girl",
    "the sailor",
    "the city",
    "the moon",
    "the sun",
    "a fox",
    "the students",
    "our team",
    "the engineer",
    "the painter",
    "a traveler",
    "the king",
)
VERBS = (
    "sees",
    "likes",
    "finds",
    "builds",
    "reads",
    "opens",
    "carries",
    "watches",
    "paints",
    "follows",
    "helps",
    "visits",
    "remembers",
    "cleans",
    "writes",
    "moves",
    "brings",
    "keeps",
    "makes",
    "loves",
    "knows",
    "wants",
    "needs",
    "takes",
)
OBJECTS = (
    "a red apple",
    "the old house",
    "a green field",
    "the blue sea",
    "a long road",
    "the small garden",
    "a warm bread",
    "the bright star",
    "a quiet room",
    "the tall tree",
    "a heavy box",
    "the little boat",
    "a new book",
    "the white door",
    "a soft bed",
    "the open window",
    "a cold river",
    "the golden ring",
    "a simple song",
    "the big bridge",
    "a good idea",
    "the last train",
    "a fresh cup of tea",
    "the morning light",
)
PLACES = (
    "in the morning",
    "at night",
    "near the lake",
    "by the sea",
    "in the garden",
    "after school",
    "on the hill",
    "in the old town",
    "every day",
    "before dinner",
    "under the bridge",
    "in the forest",
    "at the market",
    "in winter",
    "in summer",
)
TOPICS = (
    "the weather",
    "the sea",
    "a garden",
    "the city",
    "music",
    "books",
    "the moon",
    "trees",
    "bread",
    "the river",
    "a journey",
    "the forest",
    "the night sky",
    "animals",
)
QUESTIONS = (
    "Tell me about {t}.",
    "What do you know about {t}?",
    "Write a sentence about {t}.",
    "Can you say something about {t}?",
    "Describe {t}.",
    "Hello! Talk about {t}.",
)
GREETINGS = ("Hello", "Hi", "Good morning", "Good evening", "Welcome")
DRILLS = (
    "ABCDEFGH",
    "ABCDEFGH",
    "ABCDEFGH",
    "ABCDEF",
    "DEFGH",
    "ABC DEF GH",
    "0123456789",
    "one two three four five",
    "red green blue",
    "north south east west",
    "Monday Tuesday Wednesday Thursday Friday",
)


STRUCTURED_SHARE = {"json": 0.3, "json_chat": 0.3, "tools": 0.5, "forced": 0.35}
"""The chance, drawn after each prose document, that a JSON text, a JSON chat, a tool
chat and a forced-call chat follow it (each drawn on its own)."""


def sentence(rng: random.Random) -> str:
    """One short declarative sentence, capitalised and ending with a period."""
    s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
    r = rng.random()
    if r < 0.5:
        s += f" {rng.choice(PLACES)}"
    elif r < 0.7:
        s += f" and {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
    return s[0].upper() + s[1:] + "."


def paragraph(rng: random.Random, n: int) -> str:
    """``n`` sentences joined by single spaces."""
    return " ".join(sentence(rng) for _ in range(n))


def chat_turn(rng: random.Random) -> tuple[str, str]:
    """A (user, assistant) pair: a question about a topic and a short plain answer."""
    topic = rng.choice(TOPICS)
    question = rng.choice(QUESTIONS).format(t=topic)
    if rng.random() < 0.3:
        question = f"{rng.choice(GREETINGS)}. {question}"
    answer = paragraph(rng, rng.randint(1, 3))
    return question, answer


def drill(rng: random.Random) -> str:
    """A line repeating one drill string 3-8 times (letters, digits, small word lists)."""
    d = rng.choice(DRILLS)
    return " ".join([d] * rng.randint(3, 8))


def documents(seed: int = 0, n_docs: int = 1200) -> Iterator[tuple[str, object]]:
    """Yield ``(kind, payload)`` documents: ``("text", str)``, ``("drill", str)``,
    ``("chat", list[tuple[str, str]])`` (a system-less conversation of 1-2 turns),
    ``("json_chat", list[tuple[str, str]])`` (one turn asking for JSON,
    :func:`servehall.demo.structured.json_chat`),
    ``("json", str)`` (a JSON text, :func:`servehall.demo.structured.json_object`) or
    ``("tools", (tools, messages))`` (:func:`servehall.demo.structured.tool_chat`) or
    ``("forced", (tools, messages))`` (:func:`servehall.demo.structured.forced_call_chat`).

    ``n_docs`` prose documents (text, drill, chat) and, interleaved, structured ones:
    about 0.3 JSON texts, 0.3 JSON chats, 0.5 tool chats and 0.35 forced-call chats per
    prose document.
    Deterministic in ``seed``.
    """
    rng = random.Random(seed)
    for _ in range(n_docs):
        r = rng.random()
        if r < 0.45:
            yield "text", paragraph(rng, rng.randint(2, 5))
        elif r < 0.55:
            yield "drill", drill(rng)
        else:
            yield "chat", [chat_turn(rng) for _ in range(rng.randint(1, 2))]
        if rng.random() < STRUCTURED_SHARE["json"]:
            yield "json", structured.json_object(rng)
        if rng.random() < STRUCTURED_SHARE["json_chat"]:
            yield "json_chat", [structured.json_chat(rng)]
        if rng.random() < STRUCTURED_SHARE["tools"]:
            yield "tools", structured.tool_chat(rng)
        if rng.random() < STRUCTURED_SHARE["forced"]:
            yield "forced", structured.forced_call_chat(rng)


def tokenizer_corpus(seed: int = 0) -> list[str]:
    """Plain text lines for training the BPE tokenizer (chat payloads flattened; tool
    chats as their rendering without the special tokens)."""
    from servehall.demo.tokenizer import SPECIAL_TOKENS, render_tool_chat

    lines: list[str] = []
    for kind, payload in documents(seed):
        if kind in ("chat", "json_chat"):
            assert isinstance(payload, list)
            for q, a in payload:
                lines += [q, a]
        elif kind in ("tools", "forced"):
            assert isinstance(payload, tuple)
            text = render_tool_chat(payload[1], payload[0])
            for t in SPECIAL_TOKENS:
                text = text.replace(t, "\n")
            lines += [line for line in text.split("\n") if line]
        else:
            assert isinstance(payload, str)
            lines.append(payload)
    return lines
