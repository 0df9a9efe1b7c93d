"""The coordination store's tables: claims on work items (with fences), their history, and everything a run
writes on its own behalf (events, artifacts, entries of its work item), each write carrying the fence it was made
under.

One schema for PostgreSQL (production) and SQLite (the embedded default); Alembic migrations in
`migrations/` create it. Times are UTC, passed in by the store (one clock for both databases).
"""

import sqlalchemy as sa

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
    }
)

Timestamp = sa.DateTime(timezone=True)
# A work item's key (store.work_item_key): "<namespace>/<workItemRef>", a namespace of up to 63 characters.
WorkItemKey = sa.String(63 + 1 + 1024)
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements INTEGER PRIMARY KEY only

# At most one holder per work item: a claim bumps the fence, and only (holder_uid, fence) may write.
claims = sa.Table(
    "claims",
    metadata,
    sa.Column("work_item_ref", WorkItemKey, primary_key=True),
    sa.Column("holder_uid", sa.String(128), nullable=True),  # the Run's uid: a recreated Run is a new holder
    sa.Column("holder_run", sa.String(512), nullable=True),  # "<namespace>/<name>", for people
    sa.Column("previous_holder_uid", sa.String(128), nullable=True),
    sa.Column("fence", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("lease_expires_at", Timestamp, nullable=True),
    sa.Column("triggered_by", sa.String(512), nullable=True),
    sa.Column("updated_at", Timestamp, nullable=False),
)

claim_history = sa.Table(
    "claim_history",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("work_item_ref", WorkItemKey, nullable=False, index=True),
    sa.Column("action", sa.String(32), nullable=False),  # claimed | took-over | renewed | fenced | released
    sa.Column("holder_uid", sa.String(128), nullable=False),
    sa.Column("holder_run", sa.String(512), nullable=False),
    sa.Column("fence", sa.BigInteger, nullable=False),
    sa.Column("previous_holder_uid", sa.String(128), nullable=True),
    sa.Column("triggered_by", sa.String(512), nullable=True),
    sa.Column("at", Timestamp, nullable=False),
)

# Runs without a work item fence their writes by attempt: the newest attempt seen is the only valid fence.
run_fences = sa.Table(
    "run_fences",
    metadata,
    sa.Column("run_uid", sa.String(128), primary_key=True),
    sa.Column("run", sa.String(512), nullable=False),
    sa.Column("fence", sa.BigInteger, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
)

# The latest limit on each credential ("<namespace>/<secret>"), written by the run that got a 429 before it tells
# the credential's throttle workflow: a run subscribing meanwhile reads it here at once, instead of from the
# throttle's memo, which changes only with the throttle's next workflow task (seconds, under load).
credential_limits = sa.Table(
    "credential_limits",
    metadata,
    sa.Column("credential", sa.String(320), primary_key=True),  # a namespace (63) / a Secret's name (253)
    sa.Column("until", Timestamp, nullable=False),
    sa.Column("strikes", sa.Integer, nullable=False),  # limits in a row, as the throttle counts them
    sa.Column("updated_at", Timestamp, nullable=False),
)

# The runs to tell when a credential is limited: a run subscribes here (a row) instead of signalling the
# credential's throttle workflow, and the announcer (workflows.entities.CredentialAnnouncerWorkflow) reads them
# when a limit comes. Two store writes a run, where a signal-with-start each way cost Temporal a workflow task
# of the throttle and the worker an RPC.
credential_subscribers = sa.Table(
    "credential_subscribers",
    metadata,
    sa.Column("credential", sa.String(320), primary_key=True),
    sa.Column("workflow_id", sa.String(512), primary_key=True),  # the run's workflow id
    sa.Column("subscribed_at", Timestamp, nullable=False),
)

# The last sequence number given to each run's events: incrementing it locks the row, so writers of one run
# take turns and numbers are dense and ordered.
run_sequences = sa.Table(
    "run_sequences",
    metadata,
    sa.Column("run_uid", sa.String(128), primary_key=True),
    sa.Column("last_seq", sa.BigInteger, nullable=False),
)

run_events = sa.Table(
    "run_events",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("run_uid", sa.String(128), nullable=False),
    sa.Column("run", sa.String(512), nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),  # 1, 2, ... per run: the streaming cursor
    sa.Column("work_item_ref", WorkItemKey, nullable=True),
    sa.Column("fence", sa.BigInteger, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("kind", sa.String(64), nullable=False),  # progress | status | artifact | ...
    sa.Column("message", sa.Text, nullable=False, server_default=""),
    sa.Column("data", sa.JSON, nullable=True),
    sa.Column("triggered_by", sa.String(512), nullable=True),
    sa.Column("at", Timestamp, nullable=False),
    # phase events: the status revision they record (one event per revision; migration 0003)
    sa.Column("revision", sa.BigInteger, nullable=True),
    sa.UniqueConstraint("run_uid", "seq"),
    sa.Index("ix_run_events_run_uid_revision", "run_uid", "revision"),
)

# Work items (the coordination record): an id unique in its namespace; its entries (comments, state changes,
# artifacts) in order, numbered by the item's last_seq, each saying who wrote it and, for an agent, under which fence.
work_items = sa.Table(
    "work_items",
    metadata,
    sa.Column("namespace", sa.String(63), primary_key=True),
    sa.Column("item_id", sa.String(1024), primary_key=True),
    sa.Column("title", sa.String(512), nullable=False),
    sa.Column("body", sa.Text, nullable=False, server_default=""),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("labels", sa.JSON, nullable=False),
    sa.Column("created_by", sa.String(512), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.Column("last_seq", sa.BigInteger, nullable=False, server_default="0"),
)

work_item_events = sa.Table(
    "work_item_events",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("work_item_ref", WorkItemKey, nullable=False),  # store.work_item_key
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),  # created | comment | state | artifact | ended
    sa.Column("body", sa.Text, nullable=False, server_default=""),
    sa.Column("data", sa.JSON, nullable=True),
    sa.Column("author", sa.String(512), nullable=True),  # the person; for an agent, the Run's triggering user
    sa.Column("run", sa.String(512), nullable=True),
    sa.Column("run_uid", sa.String(128), nullable=True),
    sa.Column("attempt", sa.Integer, nullable=True),
    sa.Column("fence", sa.BigInteger, nullable=True),
    sa.Column("at", Timestamp, nullable=False),
    sa.UniqueConstraint("work_item_ref", "seq"),
)

artifacts = sa.Table(
    "artifacts",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("run_uid", sa.String(128), nullable=False),
    sa.Column("run", sa.String(512), nullable=False),
    sa.Column("work_item_ref", WorkItemKey, nullable=True),
    sa.Column("fence", sa.BigInteger, nullable=False),
    sa.Column("name", sa.String(512), nullable=False),
    sa.Column("uri", sa.Text, nullable=True),
    sa.Column("media_type", sa.String(256), nullable=True),
    sa.Column("size", sa.BigInteger, nullable=True),
    sa.Column("content", sa.LargeBinary, nullable=True),  # small artifacts inline; large ones by uri
    sa.Column("triggered_by", sa.String(512), nullable=True),
    sa.Column("at", Timestamp, nullable=False),
    sa.UniqueConstraint("run_uid", "name"),
)

# What each model call of a run cost, as its agent reported it (the A2A metadata `ksquad.io/usage`): one row per
# call of an attempt (a report seen twice, after a worker restart, is one row), charged to the credential the call's
# model uses in the Run's contract and to the person who started the Run.
model_usage = sa.Table(
    "model_usage",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column("run", sa.String(512), nullable=False),
    sa.Column("run_uid", sa.String(128), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("call_id", sa.String(64), nullable=False),
    sa.Column("model", sa.String(256), nullable=False),
    sa.Column("credential", sa.String(512), nullable=False),  # "<namespace>/<secret>", or "" for none
    sa.Column("triggered_by", sa.String(512), nullable=False),
    sa.Column("input_tokens", sa.BigInteger, nullable=False),
    sa.Column("output_tokens", sa.BigInteger, nullable=False),
    sa.Column("latency_ms", sa.BigInteger, nullable=False),
    sa.Column("at", Timestamp, nullable=False),
    sa.UniqueConstraint("run_uid", "attempt", "call_id"),
    sa.Index(None, "at"),
)

# The runs waiting in the ramp after a credential's limit (store.ramps): each with its tenant's virtual finish,
# the order in which they call again; released once its turn came.
resume_ramps = sa.Table(
    "resume_ramps",
    metadata,
    sa.Column("ramp", sa.String(64), primary_key=True),  # a digest of the credential and the limit's end
    sa.Column("run_id", sa.String(512), primary_key=True),
    sa.Column("tenant", sa.String(256), nullable=False),
    sa.Column("finish", sa.Float, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("released", sa.Boolean, nullable=False),
    sa.Column("opens", Timestamp, nullable=False),
    sa.Index(None, "ramp", "finish"),
    sa.Index(None, "opens"),
)

# The embedded default's objects (`ksquad run -f`): what kubectl would keep in etcd, for a machine without a
# cluster. A Run's status is written here by the embedded bridge, guarded by uid and revision like the
# status subresource; its phase changes go to run_events, so one stream carries phases and progress.
objects = sa.Table(
    "objects",
    metadata,
    sa.Column("kind", sa.String(64), primary_key=True),
    sa.Column("namespace", sa.String(253), primary_key=True),
    sa.Column("name", sa.String(253), primary_key=True),
    sa.Column("uid", sa.String(128), nullable=False),
    sa.Column("generation", sa.BigInteger, nullable=False),
    sa.Column("spec", sa.JSON, nullable=False),
    sa.Column("status", sa.JSON, nullable=True),
    sa.Column("revision", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
)

# An attempt's progress, step by step (a model turn, a tool call begun, its result), as its agent recorded it
# under the attempt's fence (store.checkpoints): a retry's agent reads the Run's steps and goes on after the last
# one instead of asking the model again. `payload` is what ksquad-api was given, sealed with the codec's key when
# one is configured (api.attempts); `size` is its length in clear, which the Run's bound counts.
agent_checkpoints = sa.Table(
    "agent_checkpoints",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("run_uid", sa.String(128), nullable=False),
    sa.Column("run", sa.String(512), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("fence", sa.BigInteger, nullable=False),
    sa.Column("step", sa.Integer, nullable=False),  # the agent's step in the conversation (1, 2, ...)
    sa.Column("kind", sa.String(32), nullable=False),  # turn | tool-started | tool
    sa.Column("payload", sa.LargeBinary, nullable=False),
    sa.Column("size", sa.Integer, nullable=False),
    sa.Column("at", Timestamp, nullable=False),
    sa.Index(None, "run_uid", "id"),
)

# A Team's or a Project's memory (store.memory): facts, decisions and links its agents and people keep across Runs,
# each attributed to the person who wrote it or, for an agent, to its Run's attempt and the person who started it.
squad_memory = sa.Table(
    "squad_memory",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column("scope", sa.String(16), nullable=False),  # teams | projects
    sa.Column("name", sa.String(253), nullable=False),  # the Team's or Project's name
    sa.Column("kind", sa.String(16), nullable=False),  # fact | decision | link
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("author", sa.String(512), nullable=True),  # the person; for an agent, the Run's triggering user
    sa.Column("run", sa.String(512), nullable=True),
    sa.Column("run_uid", sa.String(128), nullable=True),
    sa.Column("attempt", sa.Integer, nullable=True),
    sa.Column("fence", sa.BigInteger, nullable=True),
    sa.Column("edited_by", sa.String(512), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.Index(None, "namespace", "scope", "name", "id"),
)
