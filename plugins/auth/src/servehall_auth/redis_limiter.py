"""Token buckets in Redis (or Valkey), shared by every replica: ``[auth] limits_url``.

Implements :class:`~servehall_auth.limiter.LimiterStore` with three Lua scripts run by
redis-py's asyncio client (``EVALSHA``, reloaded on ``NOSCRIPT``), so each call is one
round trip and atomic on the server: ``acquire`` debits every bucket of a request or
none, ``credit`` refunds (settle/release), ``levels`` only reads. A bucket is a hash
``{level, at}`` under ``<prefix><bucket key>`` (``at`` in ms of the Redis server's
clock, ``TIME``, so replicas with skewed clocks agree); it expires once it would be full
again, so Redis holds only the buckets of recently active principals.

Every key carries the hash tag ``{rl}``, so a Redis Cluster keeps all buckets in one
slot (a multi-key script needs that); a single Redis, Sentinel or Valkey works as is.

Errors: any Redis problem (refused connection, timeout, a server that is loading or
read-only) raises :class:`LimiterUnavailableError`; the rate limiter turns it into the
configured fail-closed 503 or fail-open admission (see
:mod:`servehall_auth.ratelimit`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from servehall import ConfigError
from servehall_auth.limiter import Acquired, Bucket

if TYPE_CHECKING:
    from redis.asyncio import Redis

DEFAULT_PREFIX = "servehall:{rl}:"
"""Prefix of every bucket key (the ``{rl}`` hash tag keeps them in one cluster slot)."""

# Shared Lua: current level of bucket i (KEYS[i]) with capacity cap at now_ms.
_LEVEL = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function level(key, cap, now)
  local v = redis.call('HMGET', key, 'level', 'at')
  if not v[1] then return cap end
  local l = tonumber(v[1]) + (now - tonumber(v[2])) * cap / 60000.0
  if l > cap then l = cap end
  return l
end
local function store(key, cap, l, now)
  if l >= cap then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'level', tostring(l), 'at', tostring(now))
    -- gone once full again: (cap - level) / (cap / 60 s), plus a second of slack
    redis.call('PEXPIRE', key, math.ceil((cap - l) * 60000.0 / cap) + 1000)
  end
end
"""

# KEYS: buckets; ARGV: cap1, amount1, cap2, amount2, ...
# returns {ok (1/0), wait_ms (-1 = never fits), level1, level2, ...} (levels as strings)
_ACQUIRE = (
    _LEVEL
    + """
local now = now_ms()
local levels = {}
local wait = 0
for i, key in ipairs(KEYS) do
  local cap = tonumber(ARGV[2 * i - 1])
  local amount = tonumber(ARGV[2 * i])
  local l = level(key, cap, now)
  levels[i] = l
  local short = amount - l
  if short > 0 then
    if amount > cap then
      wait = -1
    elseif wait >= 0 then
      local w = short * 60000.0 / cap
      if w > wait then wait = w end
    end
  end
end
local out = {}
if wait ~= 0 then
  out[1] = 0
  out[2] = tostring(wait)
  for i = 1, #KEYS do out[i + 2] = tostring(levels[i]) end
  return out
end
out[1] = 1
out[2] = '0'
for i, key in ipairs(KEYS) do
  local cap = tonumber(ARGV[2 * i - 1])
  local l = levels[i] - tonumber(ARGV[2 * i])
  store(key, cap, l, now)
  out[i + 2] = tostring(l)
end
return out
"""
)

# KEYS: buckets; ARGV: cap1, amount1, ...: add amount (capped at cap; negative debits)
_CREDIT = (
    _LEVEL
    + """
local now = now_ms()
for i, key in ipairs(KEYS) do
  local cap = tonumber(ARGV[2 * i - 1])
  local l = level(key, cap, now) + tonumber(ARGV[2 * i])
  if l > cap then l = cap end
  store(key, cap, l, now)
end
return 1
"""
)

# KEYS: buckets; ARGV: cap1, cap2, ...: levels as strings, nothing changed
_LEVELS = (
    _LEVEL
    + """
local now = now_ms()
local out = {}
for i, key in ipairs(KEYS) do out[i] = tostring(level(key, tonumber(ARGV[i]), now)) end
return out
"""
)


class LimiterUnavailableError(Exception):
    """The shared limiter store could not be reached or answered with an error.

    ``str(exc)`` is one line: the error's type and first line (never the URL's password).
    """


def check_limits_url(url: str) -> str:
    """Validate the form of ``[auth] limits_url``; returns it unchanged.

    Accepted: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS) and
    ``unix:///path/to/redis.sock[?db=N]``; the port is 1-65535 and the database a
    non-negative integer.

    Raises:
        ValueError: with a one-line reason (the URL itself is not repeated: it may hold
            a password).
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"limits_url is not a valid URL ({exc})") from None
    try:
        port = parts.port
    except ValueError:
        raise ValueError("limits_url port must be a number 1-65535") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(
            "limits_url must start with redis://, rediss:// or unix:// "
            f"(got {parts.scheme + '://' if parts.scheme else 'no scheme'})"
        )
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError("limits_url unix:// needs a socket path (unix:///run/redis.sock)")
        return url
    if not parts.hostname:
        raise ValueError("limits_url needs a host (redis://host:6379/0)")
    if port is not None and not 0 < port < 65536:
        raise ValueError("limits_url port must be 1-65535")
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        raise ValueError(f"limits_url database must be a number (got /{db})")
    return url


def safe_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for log lines and errors)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return parts._replace(netloc=netloc).geturl()


def _brief(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def make_client(url: str, timeout_s: float, max_connections: int = 64) -> Redis:
    """A redis-py asyncio client for ``url``: connect, reply and pool-wait timeouts of
    ``timeout_s`` seconds, a blocking pool of at most ``max_connections`` (a burst of
    requests waits for a connection instead of failing), health checks on idle
    connections."""
    from redis.asyncio import BlockingConnectionPool, Redis

    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        health_check_interval=30,
        decode_responses=True,
    )
    return Redis(connection_pool=pool, auto_close_connection_pool=True)


class RedisLimiterStore:
    """The shared :class:`~servehall_auth.limiter.LimiterStore` (see module docstring).

    Args:
        client: a redis-py asyncio client (``decode_responses=True``).
        prefix: prepended to every bucket key.
    """

    def __init__(self, client: Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self.client = client
        self.prefix = prefix
        self._acquire = client.register_script(_ACQUIRE)
        self._credit = client.register_script(_CREDIT)
        self._levels = client.register_script(_LEVELS)

    @classmethod
    async def connect(
        cls, url: str, timeout_s: float = 0.5, prefix: str = DEFAULT_PREFIX
    ) -> RedisLimiterStore:
        """Connect to ``url`` and check the server answers (``PING``).

        Raises:
            ConfigError: one line naming the URL (password masked) and the reason.
        """
        check_limits_url(url)
        client = make_client(url, timeout_s)
        try:
            await client.ping()
        except Exception as exc:
            await client.aclose()
            raise ConfigError(
                f"auth: cannot reach limits_url {safe_url(url)}: {_brief(exc)}"
            ) from None
        return cls(client, prefix)

    async def close(self) -> None:
        """Close the client's connections."""
        await self.client.aclose()

    def _keys(self, buckets: Sequence[Bucket]) -> list[str]:
        return [self.prefix + b.key for b in buckets]

    async def _run(self, script: Any, keys: list[str], args: list[str]) -> Any:
        try:
            return await script(keys=keys, args=args)
        except Exception as exc:  # redis.RedisError, OSError, timeouts
            raise LimiterUnavailableError(_brief(exc)) from exc

    async def acquire(self, charges: Sequence[tuple[Bucket, float]]) -> Acquired:
        """See :meth:`LimiterStore.acquire`. Raises LimiterUnavailableError."""
        args: list[str] = []
        for b, amount in charges:
            args += [repr(float(b.capacity)), repr(float(amount))]
        out = await self._run(self._acquire, self._keys([b for b, _ in charges]), args)
        levels = {b.key: float(v) for (b, _), v in zip(charges, out[2:], strict=True)}
        if int(out[0]) == 1:
            return Acquired(True, levels)
        wait_ms = float(out[1])
        return Acquired(False, levels, math.inf if wait_ms < 0 else wait_ms / 1000.0)

    async def credit(self, charges: Sequence[tuple[Bucket, float]]) -> None:
        """See :meth:`LimiterStore.credit`. Raises LimiterUnavailableError."""
        if not charges:
            return
        args: list[str] = []
        for b, amount in charges:
            args += [repr(float(b.capacity)), repr(float(amount))]
        await self._run(self._credit, self._keys([b for b, _ in charges]), args)

    async def levels(self, buckets: Sequence[Bucket]) -> dict[str, float]:
        """See :meth:`LimiterStore.levels`. Raises LimiterUnavailableError."""
        out = await self._run(
            self._levels, self._keys(buckets), [repr(float(b.capacity)) for b in buckets]
        )
        return {b.key: float(v) for b, v in zip(buckets, out, strict=True)}
