"""Structured documents for the demo corpus: short JSON objects, and tool-using chats.

A briefly trained model learns what it sees often. Trained on prose alone it never writes
the closing quote of a JSON string, so under constrained decoding an unbounded string runs
to ``max_tokens``, and it never calls a tool by itself. These generators add, from fixed
word lists and a :class:`random.Random` (deterministic in its seed):

* :func:`json_object` — objects of one to three fields whose strings close within one to
  three words and whose integers are small (``{"city": "Paris", "days": 3}``), with the
  spacing the platform's whitespace bound forces (``": "`` and ``", "``), sometimes
  compact (vLLM's), sometimes in a one-element array;
* :func:`json_chat` — a user asking for JSON, answered with such an object;
* :func:`tool_chat` — an OpenAI-shaped conversation with ``tools`` (1-3 of the eleven
  :data:`TOOLS`, in random order): the user asks for what a tool does ("What is the
  weather in Paris?"; one in four names another short place, :func:`place`), the
  assistant answers with a Hermes tool call (the demo chat
  template's and the ``hermes`` parser's format), a ``tool`` message holds the result,
  and a short assistant answer uses it; one in six asks something no tool does and is
  answered in prose;
* :func:`forced_call_chat` — the same question answered as ``tool_choice: "required"``
  shapes the reply (:mod:`servehall.tools.forced`): a JSON array of
  ``{"name", "parameters"}`` calls.

Rendered with :func:`servehall.demo.tokenizer.render_tool_chat`, exactly as the demo chat
template renders the same messages and tools.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CITIES = (
    "Paris",
    "London",
    "Tokyo",
    "Berlin",
    "Rome",
    "Madrid",
    "Oslo",
    "Cairo",
    "Lima",
    "Sydney",
    "Boston",
    "Delhi",
    "Lisbon",
    "Vienna",
    "Prague",
    "Dublin",
    "Seoul",
    "Nairobi",
    "Quito",
    "Toronto",
    "New York",
    "Cape Town",
    "Buenos Aires",
    "San Francisco",
)
NAMES = ("Ana", "Bob", "Mia", "Tom", "Lea", "Sam", "Noah", "Emma", "Ivan", "Yuki", "Omar", "Zoe")
COLORS = ("red", "green", "blue", "white", "black", "yellow", "orange", "gray")
THINGS = (
    "apple",
    "book",
    "river",
    "bread",
    "house",
    "garden",
    "train",
    "song",
    "tea",
    "boat",
    "bridge",
    "star",
)
LANGUAGES = ("French", "Spanish", "German", "Italian", "Japanese", "Greek")
CURRENCIES = ("euros", "pounds", "yen", "pesos", "francs")
SKIES = ("sunny", "cloudy", "rainy", "windy", "snowy", "clear")
STRING_KEYS = (
    "city",
    "name",
    "title",
    "color",
    "country",
    "word",
    "item",
    "place",
    "food",
    "animal",
    "topic",
    "label",
    "kind",
    "status",
    "answer",
    "text",
    "summary",
    "description",
    "reason",
    "destination",
    "query",
    "location",
    "message",
    "value",
)
INT_KEYS = (
    "days",
    "age",
    "count",
    "n",
    "year",
    "number",
    "price",
    "score",
    "id",
    "size",
    "total",
    "temperature",
    "nights",
    "people",
    "rating",
    "amount",
)
JSON_REQUESTS = (
    "Answer in JSON.",
    "Reply with a JSON object.",
    "Give me a JSON object.",
    "Return JSON.",
    "Answer in JSON: a {a} and a {b}.",
    "Plan a trip as JSON.",
    "Extract the {a} and the {b}.",
    "Respond only with JSON.",
)
OTHER_QUESTIONS = (
    "Tell me about music.",
    "Hello! How are you?",
    "Write a sentence about the sea.",
    "Describe a garden.",
    "Thanks!",
)


def short_string(rng: random.Random, key: str = "") -> str:
    """A value that fits ``key``: one to three words (a city, a name, a color and a
    thing ...)."""
    if key in ("city", "destination", "location", "place"):
        return rng.choice(CITIES)
    if key in ("name",):
        return rng.choice(NAMES)
    if key in ("color",):
        return rng.choice(COLORS)
    r = rng.random()
    if r < 0.3:
        return rng.choice(THINGS)
    if r < 0.55:
        return f"{rng.choice(COLORS)} {rng.choice(THINGS)}"
    if r < 0.75:
        return rng.choice(CITIES)
    if r < 0.9:
        return rng.choice(NAMES)
    return f"the {rng.choice(THINGS)} of {rng.choice(CITIES)}"


def small_int(rng: random.Random) -> int:
    """Mostly 1-30, sometimes up to 100 or a year."""
    r = rng.random()
    if r < 0.7:
        return rng.randint(1, 30)
    if r < 0.9:
        return rng.randint(0, 100)
    return rng.randint(1900, 2030)


def json_fields(rng: random.Random) -> dict[str, Any]:
    """One to three fields: string keys get :func:`short_string`, integer keys
    :func:`small_int`, in random order."""
    n = rng.choice((1, 2, 2, 2, 3))
    keys = rng.sample(STRING_KEYS, rng.randint(0, n))
    keys += rng.sample(INT_KEYS, n - len(keys))
    rng.shuffle(keys)
    return {k: (small_int(rng) if k in INT_KEYS else short_string(rng, k)) for k in keys}


def dump(value: Any, rng: random.Random) -> str:
    """``value`` as JSON text: mostly ``": "``/``", "`` (the whitespace bound), one in
    five compact (vLLM's)."""
    if rng.random() < 0.2:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(value, ensure_ascii=False)


def json_object(rng: random.Random) -> str:
    """A JSON text: an object of :func:`json_fields`, one in eight wrapped in an array;
    one in four is instead a list of one tool call as ``tool_choice: "required"``
    constrains it (``[{"name": "get_weather", "parameters": {"city": "Paris"}}]``; one
    call, so the model learns to close the list after it)."""
    if rng.random() < 0.25:
        tool = TOOLS[0] if rng.random() < 0.4 else rng.choice(TOOLS[1:])
        return dump([{"name": tool.name, "parameters": tool.make(rng)[0]}], rng)
    value: Any = json_fields(rng)
    if rng.random() < 0.125:
        value = [value]
    return dump(value, rng)


def json_chat(rng: random.Random) -> tuple[str, str]:
    """One (user, assistant) turn: a request for JSON and an object."""
    fields = json_fields(rng)
    keys = [*fields, "city", "name"]
    ask = rng.choice(JSON_REQUESTS).format(a=keys[0], b=keys[1])
    return ask, dump(fields, rng)


@dataclass(frozen=True, slots=True)
class _Tool:
    """A corpus tool: its spec, how a user asks for it, its result and the answer."""

    name: str
    description: str
    params: dict[str, str]  # name -> "string" | "integer"
    asks: tuple[str, ...]
    make: Callable[[random.Random], tuple[dict[str, Any], str, str]]
    """rng -> (arguments, tool result, final answer); ``asks`` formats with the args."""


def place(rng: random.Random) -> str:
    """Where a user asks about: a city, one in four times another short place name
    (``the garden of Oslo``, ``white river``), so the model learns to copy whatever the
    user named into the argument and close the string after it."""
    return rng.choice(CITIES) if rng.random() < 0.75 else short_string(rng)


def _weather(rng: random.Random) -> tuple[dict[str, Any], str, str]:
    city, sky, t = place(rng), rng.choice(SKIES), rng.randint(-5, 35)
    result = json.dumps({"city": city, "temperature": t, "sky": sky})
    return {"city": city}, result, f"It is {sky} in {city}, {t} degrees."


def _time(rng: random.Random) -> tuple[dict[str, Any], str, str]:
    city, hh, mm = place(rng), rng.randint(0, 23), rng.randint(0, 59)
    return {"city": city}, f"{hh:02d}:{mm:02d}", f"It is {hh:02d}:{mm:02d} in {city}."


def _add(rng: random.Random) -> tuple[dict[str, Any], str, str]:
    a, b = rng.randint(1, 50), rng.randint(1, 50)
    return {"a": a, "b": b}, str(a + b), f"{a} plus {b} is {a + b}."


def _search(rng: random.Random) -> tuple[dict[str, Any], str, str]:
    q = f"{rng.choice(COLORS)} {rng.choice(THINGS)}"
    hit = f"{rng.choice(NAMES)} and the {q}"
    return {"query": q}, json.dumps([hit]), f"I found one: {hit}."


def _population(rng: random.Random) -> tuple[dict[str, Any], str, str]:
    city, n = place(rng), rng.randint(1, 30)
    return {"city": city}, json.dumps({"millions": n}), f"About {n} million people live in {city}."


def _email(rng: random.Random) -> tuple[dict[str, Any], str, str]:
    to, subject = rng.choice(NAMES), rng.choice(THINGS)
    return {"to": to, "subject": subject}, '{"sent": true}', f"Done: the mail to {to} is sent."


def _news(rng: random.Random) -> tuple[dict[str, Any], str, str]:
    topic = rng.choice(THINGS)
    head = f"{rng.choice(NAMES)} finds a {rng.choice(COLORS)} {topic}"
    return {"topic": topic}, json.dumps([head]), f"The news: {head}."


def _translate(rng: random.Random) -> tuple[dict[str, Any], str, str]:
    text, language = rng.choice(THINGS), rng.choice(LANGUAGES)
    word = text[::-1]
    return {"text": text, "language": language}, word, f"In {language}, {text} is {word}."


def _timer(rng: random.Random) -> tuple[dict[str, Any], str, str]:
    minutes = rng.randint(1, 60)
    return {"minutes": minutes}, '{"set": true}', f"Your timer for {minutes} minutes is set."


def _distance(rng: random.Random) -> tuple[dict[str, Any], str, str]:
    a, b = rng.sample(CITIES, 2)
    km = rng.randint(50, 9000)
    return {"origin": a, "destination": b}, json.dumps({"km": km}), f"It is {km} km."


def _convert(rng: random.Random) -> tuple[dict[str, Any], str, str]:
    amount, currency = rng.randint(1, 500), rng.choice(CURRENCIES)
    got = amount * rng.randint(1, 3)
    return {"amount": amount, "currency": currency}, str(got), f"That is {got} {currency}."


TOOLS: tuple[_Tool, ...] = (
    _Tool(
        "get_weather",
        "Current weather in a city",
        {"city": "string"},
        (
            "What is the weather in {city}?",
            "weather in {city}?",
            "How is the weather in {city} today?",
            "Is it raining in {city}?",
            "What's the weather like in {city}?",
            "Weather for {city}, please.",
            "Check the weather in {city}.",
            "Is it cold in {city}?",
        ),
        _weather,
    ),
    _Tool(
        "get_time",
        "Local time in a city",
        {"city": "string"},
        ("What time is it in {city}?", "time in {city}?", "Tell me the time in {city}."),
        _time,
    ),
    _Tool(
        "add",
        "Add two integers",
        {"a": "integer", "b": "integer"},
        ("What is {a} plus {b}?", "Add {a} and {b}.", "{a} + {b}?"),
        _add,
    ),
    _Tool(
        "search",
        "Search the library",
        {"query": "string"},
        ("Find a book about the {query}.", "Search for {query}.", "Look up {query}."),
        _search,
    ),
    _Tool(
        "get_population",
        "Population of a city",
        {"city": "string"},
        ("How many people live in {city}?", "What is the population of {city}?"),
        _population,
    ),
    _Tool(
        "send_email",
        "Send a short email",
        {"to": "string", "subject": "string"},
        ("Send an email to {to} about the {subject}.", "Email {to}: {subject}."),
        _email,
    ),
    _Tool(
        "get_news",
        "Latest news on a topic",
        {"topic": "string"},
        ("What is the news about the {topic}?", "Any news on {topic}?", "News about {topic}."),
        _news,
    ),
    _Tool(
        "translate",
        "Translate a word",
        {"text": "string", "language": "string"},
        ("Translate {text} into {language}.", "How do you say {text} in {language}?"),
        _translate,
    ),
    _Tool(
        "set_timer",
        "Start a timer",
        {"minutes": "integer"},
        ("Set a timer for {minutes} minutes.", "Timer: {minutes} minutes, please."),
        _timer,
    ),
    _Tool(
        "get_distance",
        "Distance between two cities",
        {"origin": "string", "destination": "string"},
        ("How far is {origin} from {destination}?", "Distance from {origin} to {destination}?"),
        _distance,
    ),
    _Tool(
        "convert_currency",
        "Convert an amount of dollars",
        {"amount": "integer", "currency": "string"},
        ("Convert {amount} dollars to {currency}.", "How much is {amount} dollars in {currency}?"),
        _convert,
    ),
)


def tool_spec(tool: _Tool, rng: random.Random) -> dict[str, Any]:
    """The tool in OpenAI's ``tools[]`` shape, with the schema variations clients send
    (pydantic's ``title``s, ``additionalProperties: false``, a description or none)."""
    titled = rng.random() < 0.4
    props: dict[str, Any] = {}
    for p, t in tool.params.items():
        props[p] = {"title": p.title(), "type": t} if titled else {"type": t}
    params: dict[str, Any] = {"type": "object", "properties": props, "required": list(props)}
    if titled:
        params["title"] = f"{tool.name}_args"
    if rng.random() < 0.5:
        params["additionalProperties"] = False
    fn: dict[str, Any] = {"name": tool.name}
    if rng.random() < 0.7:
        fn["description"] = tool.description
    fn["parameters"] = params
    return {"type": "function", "function": fn}


def _offer(rng: random.Random) -> tuple[_Tool, list[dict[str, Any]]]:
    """The tool a chat asks for and the ``tools[]`` offered with it (it and 0-2 others,
    in random order)."""
    # the weather tool, every framework's first example, is asked for in 40% of chats
    first = TOOLS[0] if rng.random() < 0.4 else rng.choice(TOOLS[1:])
    offered = [first, *rng.sample([t for t in TOOLS if t is not first], rng.randint(0, 2))]
    rng.shuffle(offered)
    return first, [tool_spec(t, rng) for t in offered]


def tool_chat(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(tools, messages)``: see the module docstring. Messages are OpenAI-shaped
    (assistant calls as ``tool_calls`` with ``arguments`` as JSON text)."""
    tool, tools = _offer(rng)
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.2:
        messages.append({"role": "system", "content": "You are a helpful assistant."})
    if rng.random() < 1 / 6:
        messages.append({"role": "user", "content": rng.choice(OTHER_QUESTIONS)})
        messages.append({"role": "assistant", "content": "Hello! I can help with that."})
        return tools, messages
    args, result, answer = tool.make(rng)
    ask = rng.choice(tool.asks).format(**args)
    call = {"name": tool.name, "arguments": json.dumps(args, ensure_ascii=False)}
    messages += [
        {"role": "user", "content": ask},
        {"role": "assistant", "content": "", "tool_calls": [{"function": call}]},
        {"role": "tool", "content": result},
        {"role": "assistant", "content": answer},
    ]
    return tools, messages


def forced_call_chat(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(tools, messages)``: a user asks for what an offered tool does and the assistant
    answers with the text ``tool_choice: "required"`` constrains — a JSON array of one
    call (``[{"name": "get_weather", "parameters": {"city": "Paris"}}]``), spaced as
    :func:`dump` spaces it. One call only: the question asks for one thing, and the
    ``]`` after it is what a small model most needs to learn here."""
    tool, tools = _offer(rng)
    args = tool.make(rng)[0]
    ask = rng.choice(tool.asks).format(**args)
    calls = [{"name": tool.name, "parameters": args}]
    return tools, [
        {"role": "user", "content": ask},
        {"role": "assistant", "content": dump(calls, rng)},
    ]
