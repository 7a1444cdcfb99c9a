"""Tests of servehall.testing.migrations (the plugin-migration conformance kit): on a
real SQLite file, the core alone matches its tables, and a plugin branch written here is
checked against its table definitions — a match gives no difference, a column the
migration forgot is reported."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from servehall import MigrationBranch
from servehall.testing.migrations import schema_diff

REVISION = '''
"""widgets: the test branch's table."""
import sqlalchemy as sa
from alembic import op

revision = "widgets_0001"
down_revision = "0001_base"
branch_labels = ("widgets",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "widgets",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(32), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("widgets")
'''


def _branch(tmp_path: Path, *, extra_column: bool) -> MigrationBranch:
    versions = tmp_path / "widgets_migrations"
    versions.mkdir(exist_ok=True)
    (versions / "widgets_0001.py").write_text(REVISION)

    def metadata() -> sa.MetaData:
        md = sa.MetaData()
        cols = [
            sa.Column("id", sa.Integer(), primary_key=True),
            sa.Column("name", sa.String(32), nullable=False),
        ]
        if extra_column:
            cols.append(sa.Column("color", sa.String(16)))
        sa.Table("widgets", md, *cols)
        return md

    return MigrationBranch("widgets", versions, metadata)


async def test_the_core_alone_matches(tmp_path: Path) -> None:
    assert await schema_diff(f"sqlite+aiosqlite:///{tmp_path / 'core.db'}") == []


async def test_a_matching_branch_has_no_difference(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'ok.db'}"
    assert await schema_diff(url, [_branch(tmp_path, extra_column=False)]) == []


async def test_a_forgotten_column_is_reported(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'bad.db'}"
    diff = await schema_diff(url, [_branch(tmp_path, extra_column=True)])
    assert len(diff) == 1
    op, _schema, table, column = diff[0]
    assert (op, table, column.name) == ("add_column", "widgets", "color")
