-- The DDL pico's first release (schema version 1, commit 4b6dd02) ran on postgresql:
-- metadata.create_all of its tables, then pico_schema and its one row.
-- Generated once from that release's schema.py; never edit it.

CREATE TABLE pico_commits (
	session_id VARCHAR(200) NOT NULL,
	last BIGINT NOT NULL,
	first BIGINT NOT NULL,
	scope VARCHAR(200) NOT NULL,
	PRIMARY KEY (session_id, last)
);

CREATE TABLE pico_context_edits (
	session_id VARCHAR(200) NOT NULL,
	conversation_id BIGINT NOT NULL,
	seq BIGINT NOT NULL,
	op VARCHAR(16) NOT NULL,
	base BOOLEAN NOT NULL,
	ids TEXT NOT NULL,
	removed INTEGER NOT NULL,
	revision INTEGER NOT NULL,
	PRIMARY KEY (session_id, conversation_id, seq)
);

CREATE INDEX pico_context_edits_base ON pico_context_edits (session_id, conversation_id, base, seq);

CREATE TABLE pico_context_elements (
	session_id VARCHAR(200) NOT NULL,
	conversation_id BIGINT NOT NULL,
	position BIGINT NOT NULL,
	entry_id BIGINT NOT NULL,
	PRIMARY KEY (session_id, conversation_id, position)
);

CREATE TABLE pico_conversations (
	session_id VARCHAR(200) NOT NULL,
	id BIGINT NOT NULL,
	created_seq BIGINT NOT NULL,
	source_conversation_id BIGINT,
	source_as_of BIGINT,
	inherit_state BOOLEAN NOT NULL,
	owner_task_id BIGINT,
	prefix_revision INTEGER NOT NULL,
	deleted_seq BIGINT,
	PRIMARY KEY (session_id, id)
);

CREATE INDEX pico_conversations_owner ON pico_conversations (session_id, owner_task_id, id);

CREATE INDEX pico_conversations_source ON pico_conversations (session_id, source_conversation_id, id);

CREATE TABLE pico_entries (
	session_id VARCHAR(200) NOT NULL,
	id BIGINT NOT NULL,
	conversation_id BIGINT NOT NULL,
	kind VARCHAR(200) NOT NULL,
	key TEXT,
	content TEXT NOT NULL,
	metadata TEXT,
	by_task_id BIGINT,
	commit_end BIGINT NOT NULL,
	PRIMARY KEY (session_id, id)
);

CREATE INDEX pico_entries_conversation ON pico_entries (session_id, conversation_id, id);

CREATE INDEX pico_entries_key ON pico_entries (session_id, conversation_id, key, id);

CREATE INDEX pico_entries_kind ON pico_entries (session_id, conversation_id, kind, id);

CREATE TABLE pico_events (
	id BIGSERIAL NOT NULL,
	session_id VARCHAR(200) NOT NULL,
	originator_id VARCHAR(32) NOT NULL,
	originator_version INTEGER NOT NULL,
	topic TEXT NOT NULL,
	state BYTEA NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT pico_events_stream UNIQUE (originator_id, originator_version)
);

CREATE INDEX pico_events_session ON pico_events (session_id, id);

CREATE TABLE pico_sessions (
	session_id VARCHAR(200) NOT NULL,
	head BIGINT NOT NULL,
	main_head BIGINT NOT NULL,
	root_id BIGINT,
	owner VARCHAR(64),
	PRIMARY KEY (session_id)
);

CREATE TABLE pico_snapshots (
	originator_id VARCHAR(32) NOT NULL,
	originator_version INTEGER NOT NULL,
	topic TEXT NOT NULL,
	state BYTEA NOT NULL,
	PRIMARY KEY (originator_id, originator_version)
);

CREATE TABLE pico_schema (
	version SERIAL NOT NULL,
	description TEXT NOT NULL,
	PRIMARY KEY (version)
);

INSERT INTO pico_schema (version, description) VALUES (1, 'events, snapshots and the §7.6 query tables');
