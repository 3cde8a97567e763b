"""Each step a class was asked, with its choices and right answer, for the per-question summary (issue 61, item 11).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "class_steps",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("class_id", sa.Integer, sa.ForeignKey("classes.id", ondelete="CASCADE"), nullable=False),
        sa.Column("lesson", sa.Integer, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("choices", sa.JSON, nullable=False),
        sa.Column("answer", sa.Text, nullable=False),
        sa.Column("asked_at", sa.Float, nullable=False),
        sa.Column("asks", sa.Integer, nullable=False, server_default="1"),
        sa.UniqueConstraint("class_id", "lesson", "step", name="one_row_per_step"),
    )


def downgrade() -> None:
    op.drop_table("class_steps")
