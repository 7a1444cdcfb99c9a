"""Database access shared by the core and plugins: engine, models, migrations.

Public (re-exported from ``servehall``): :class:`DbBase` (declarative base whose
``metadata`` carries the constraint naming convention; plugin-owned tables subclass it),
:class:`UTCDateTime` (timestamp column type), :func:`create_db_engine` (async engine from
a URL or the settings' ``[database] url``), :class:`DbTimeouts` (the ``[database]``
statement/lock/idle bounds on PostgreSQL sessions: ``DbTimeouts.of(settings)``, passed as
``create_db_engine(url, timeouts=...)``), :func:`describe_database` and
:func:`require_existing_database` (CLI commands name the database they use and never
create one by connecting). Plugin migrations: see ``docs/sql.md``.
"""

from typing import TYPE_CHECKING

from servehall.db.models import DbBase
from servehall.db.types import UTCDateTime
from servehall.engines.lazy import lazy_names

if TYPE_CHECKING:
    from servehall.db.engine import DbTimeouts, create_db_engine, database_url, safe_url
    from servehall.db.locate import describe_database, require_existing_database

# The engine helpers load SQLAlchemy's async engine: imported on first use, so that the
# tables (``servehall.db.models``, used by the record rows) stay a light import.
__getattr__ = lazy_names(
    __name__,
    {
        "DbTimeouts": "servehall.db.engine",
        "create_db_engine": "servehall.db.engine",
        "database_url": "servehall.db.engine",
        "safe_url": "servehall.db.engine",
        "describe_database": "servehall.db.locate",
        "require_existing_database": "servehall.db.locate",
    },
)

__all__ = [
    "DbBase",
    "DbTimeouts",
    "UTCDateTime",
    "create_db_engine",
    "database_url",
    "describe_database",
    "require_existing_database",
    "safe_url",
]
