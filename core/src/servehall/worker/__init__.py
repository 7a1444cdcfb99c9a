"""Engine worker processes: one supervised child process per model (``isolation =
"process"``), reached through :class:`ProcessEngine`, an ordinary ``Engine``.

* :mod:`servehall.worker.client` — :class:`ProcessEngine`, the engine client over IPC;
* :mod:`servehall.worker.supervisor` — starting, stopping and restarting the worker
  (:mod:`servehall.worker.generation`: one worker process and its sockets;
  :mod:`servehall.worker.watch`: the verdict on a running worker);
* :mod:`servehall.worker.bootstrap` — the child process's start (``WorkerSpec``,
  ``worker_main``); :mod:`servehall.worker.loop` — its serve/step loop (engine built by
  the backend factory); :mod:`servehall.worker.faults` — the test fault hook;
* :mod:`servehall.worker.messages` — the msgspec messages (in :mod:`servehall.worker.wire`'s
  length-prefixed frames on Unix sockets);
* :mod:`servehall.worker.exits` — exit reasons (signal names, OOM kills, stderr tails);
* :mod:`servehall.worker.gate` — requests wait for a restarting engine in the queue.
"""

from servehall.worker.client import ProcessEngine

__all__ = ["ProcessEngine"]
