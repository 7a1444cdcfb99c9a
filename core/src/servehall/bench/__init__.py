"""``servehall bench``: measure a server, an engine, or several side by side.

Modules, one concept each:

* :mod:`~servehall.bench.workload` — prompts, output lengths and arrival times;
* :mod:`~servehall.bench.metrics` — per-request timings → vLLM-style TTFT/TPOT/ITL/E2E
  percentiles, throughput and goodput;
* :mod:`~servehall.bench.runner` — arrivals and concurrency cap over any sender;
* :mod:`~servehall.bench.client` — the OpenAI-compatible streaming HTTP client (httpx);
* :mod:`~servehall.bench.engine_driver` — the same workload into an ``Engine``, in-process;
* :mod:`~servehall.bench.targets` — one run against one target, with a progress bar;
* :mod:`~servehall.bench.compare` — several targets in one command, ratios, CPU per token;
* :mod:`~servehall.bench.launch` — servers a run starts and stops, CPU seconds per process;
* :mod:`~servehall.bench.report` / :mod:`~servehall.bench.plot` — tables, JSON, PNG;
* :mod:`~servehall.bench.cli` — the Typer commands;
* :mod:`~servehall.bench.options` — the options, checks and failure handling they share.
"""
