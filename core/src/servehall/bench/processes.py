"""CPU time of a server's processes by role, and the API-process sweep
(``[server] api_processes = N``) the benchmarks run.

A servehall server with ``api_processes = N > 1`` is a process tree: the serve process
(the *primary*: engines' supervisors, admission, records), N HTTP frontends
(``python -m servehall.server.frontend``, its children) and the engine worker
processes (its other descendants). :func:`process_roles_cpu_s` reads each one's CPU
seconds with its role; :func:`cpu_by_role` turns two such reads into one figure per
process (``primary``, ``frontend 1`` … ``frontend N`` in pid order, ``worker``: the
engine workers summed). With ``api_processes = 1`` there is no frontend: the primary is
the API process.

Used by ``bench/bench_api_cpu.py --api-processes`` and by ``servehall bench compare``
(targets ``launch:h2,api=N`` and ``vllm-server:MODEL,api=N``, option
``--api-processes``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from servehall.bench.client import TargetError

FRONTEND_MODULE = "servehall.server.frontend"
"""The module an HTTP frontend process runs (``python -m servehall.server.frontend``)."""

PRIMARY, FRONTEND, WORKER = "primary", "frontend", "worker"

MAX_API_PROCESSES = 64
"""The largest ``[server] api_processes`` the config accepts."""


def parse_api_processes(text: str) -> list[int]:
    """``"1,2,4"`` → ``[1, 2, 4]``: a comma-separated list of API-process counts, in the
    order given, duplicates dropped.

    Raises:
        ValueError: an item is not an integer in 1…64, or the list is empty (one line).
    """
    out: list[int] = []
    for item in text.split(","):
        item = item.strip()
        try:
            n = int(item)
        except ValueError:
            raise ValueError(f"{item!r} is not a number of API processes") from None
        if not 1 <= n <= MAX_API_PROCESSES:
            raise ValueError(f"API processes must be in 1..{MAX_API_PROCESSES} (got {n})")
        if n not in out:
            out.append(n)
    return out


def h2load_shape(concurrency: int, connections: int | None) -> tuple[int, int]:
    """``(connections, streams per connection)`` of an h2load run with ``concurrency``
    streams in flight (h2load's ``-c`` and ``-m``).

    ``connections = None``: as few connections as hold ``concurrency`` at 64 streams
    each (one connection up to 64 — the single-process method of docs/performance.md).
    Several frontends need several connections: the kernel hands each *connection* to
    one frontend, so one connection loads one frontend only. Connections are capped at
    ``concurrency`` (one stream each at least); streams per connection are
    ``concurrency // connections`` (a remainder is not sent).

    Raises:
        ValueError: ``concurrency`` or ``connections`` is below 1.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1 (got {concurrency})")
    if connections is None:
        connections = -(-concurrency // 64)
    if connections < 1:
        raise ValueError(f"connections must be at least 1 (got {connections})")
    connections = min(connections, concurrency)
    return connections, concurrency // connections


def process_role(cmdline: Sequence[str]) -> str:
    """``frontend`` for a process that runs ``-m servehall.server.frontend``, else
    ``worker`` (a descendant of the serve process that is not a frontend)."""
    return FRONTEND if FRONTEND_MODULE in cmdline else WORKER


def process_roles_cpu_s(pid: int) -> dict[int, tuple[str, float]]:
    """``{pid: (role, cpu_s)}`` for process ``pid`` (role ``primary``) and its live
    descendants (``frontend`` or ``worker``, :func:`process_role`); ``cpu_s`` is user +
    system seconds of all the process's threads (psutil, from ``/proc`` on Linux). A
    descendant that exits while being read is left out.

    Raises:
        TargetError: ``pid`` does not exist, or psutil is not installed.
    """
    try:
        import psutil
    except ImportError:
        raise TargetError("CPU accounting needs psutil (pip install 'servehall[bench]')") from None
    try:
        root = psutil.Process(pid)
        t = root.cpu_times()
        out = {pid: (PRIMARY, t.user + t.system)}
        kids = root.children(recursive=True)
    except psutil.Error as exc:
        raise TargetError(f"cannot read the CPU time of process {pid}: {exc}") from None
    for p in kids:
        try:
            cmd = p.cmdline()
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[p.pid] = (process_role(cmd), t.user + t.system)
    return out


def cpu_by_role(
    before: Mapping[int, tuple[str, float]], after: Mapping[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds spent between two :func:`process_roles_cpu_s` reads, per process:
    ``primary``, ``frontend 1`` … ``frontend K`` (frontends alive at the second read, in
    pid order) and ``worker`` (all other descendants summed; 0.0 when there are none).
    A process that started between the reads (a restarted frontend) counts from 0; one
    that exited before the second read is not counted (its time cannot be read)."""
    frontends = sorted(p for p, (role, _) in after.items() if role == FRONTEND)
    index = {p: f"{FRONTEND} {i}" for i, p in enumerate(frontends, 1)}
    out: dict[str, float] = {PRIMARY: 0.0, **dict.fromkeys(index.values(), 0.0), WORKER: 0.0}
    for p, (role, cpu) in after.items():
        spent = cpu - before[p][1] if p in before else cpu
        key = index[p] if role == FRONTEND else role
        out[key] += spent
    return out


def frontend_cpu_s(by_role: Mapping[str, float]) -> float:
    """The frontends' CPU seconds summed (0.0 with none) from :func:`cpu_by_role`."""
    return sum(v for k, v in by_role.items() if k.startswith(FRONTEND))


def api_cpu_s(by_role: Mapping[str, float]) -> float:
    """The API side's CPU seconds from :func:`cpu_by_role`: the primary and every
    frontend (everything but the engine workers)."""
    return by_role.get(PRIMARY, 0.0) + frontend_cpu_s(by_role)


def top_frames(raw: str, k: int = 15) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """Summarise a py-spy ``--format raw`` profile (collapsed stacks: one line per stack,
    ``frame;frame;…;frame COUNT``, outermost first).

    Returns ``(samples, self_top, total_top)``: the number of samples, the ``k`` frames
    most often innermost (*self* samples) and the ``k`` frames most often anywhere on the
    stack (*total* samples, each frame counted once per stack), each as
    ``[(frame, samples)]`` most first. Lines that do not end in a count are skipped.
    """
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = stack.split(";")
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            total[f] = total.get(f, 0) + n

    def top(d: dict[str, int]) -> list[tuple[str, int]]:
        return sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))[:k]

    return samples, top(own), top(total)


def connections_by_role(pid: int, port: int) -> dict[str, int]:
    """Established TCP connections to local ``port`` held by process ``pid`` and each of
    its descendants, labelled as :func:`cpu_by_role` labels them (``primary``,
    ``frontend 1`` … in pid order, ``worker``): which API process the kernel handed each
    client connection to. A process that cannot be read counts 0.

    Raises:
        TargetError: ``pid`` does not exist, or psutil is not installed.
    """
    import psutil

    roles = process_roles_cpu_s(pid)
    frontends = sorted(p for p, (role, _) in roles.items() if role == FRONTEND)
    index = {p: f"{FRONTEND} {i}" for i, p in enumerate(frontends, 1)}
    out: dict[str, int] = {PRIMARY: 0, **dict.fromkeys(index.values(), 0), WORKER: 0}
    for p, (role, _) in roles.items():
        try:
            conns = psutil.Process(p).net_connections(kind="tcp")
        except psutil.Error:
            continue
        n = sum(
            1
            for c in conns
            if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port
        )
        out[index[p] if role == FRONTEND else role] += n
    return out


def frame_library(frame: str) -> str:
    """The library of a py-spy frame ``"name (path/file.py:line)"``: the path's first
    component (``h2``, ``hypercorn``, ``asyncio``), or two for servehall's own code
    (``servehall/server``, ``servehall/api``); ``?`` when the frame names no path."""
    path = frame.rpartition(" (")[2].rstrip(")").rpartition(":")[0]
    if not path:
        return "?"
    parts = path.split("/")
    if parts[0] == "servehall" and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0] if len(parts) > 1 else path


def self_by_library(raw: str) -> list[tuple[str, int]]:
    """Self samples of a py-spy raw profile (:func:`top_frames`) summed by the innermost
    frame's library (:func:`frame_library`), most first."""
    out: dict[str, int] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        lib = frame_library(stack.split(";")[-1])
        out[lib] = out.get(lib, 0) + int(count)
    return sorted(out.items(), key=lambda kv: (-kv[1], kv[0]))


def h2load_args(concurrency: int, connections: int | None, stagger_ms: float = 0.0) -> list[str]:
    """h2load's connection arguments: ``-c C -m M`` (:func:`h2load_shape`) and, with
    ``stagger_ms`` > 0, ``-r 1 --rate-period <stagger_ms>ms``: one new connection every
    ``stagger_ms`` instead of all at once. With one shared listening socket, connections
    that arrive together are all accepted by whichever API process wakes first (its
    accept loop drains the backlog), so a burst of connections loads one frontend;
    staggered ones spread over them as clients arriving over time do.

    Raises:
        ValueError: as :func:`h2load_shape`, or ``stagger_ms`` is negative.
    """
    if stagger_ms < 0:
        raise ValueError(f"stagger must not be negative (got {stagger_ms})")
    c, m = h2load_shape(concurrency, connections)
    args = ["-c", str(c), "-m", str(m)]
    if stagger_ms > 0:
        args += ["-r", "1", "--rate-period", f"{stagger_ms:g}ms"]
    return args
