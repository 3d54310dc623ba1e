"""A task record read from the read model (``projections.queries._task``) is the same
``TaskSnapshot`` its constructor makes: equal, printed alike, frozen, its state a fresh
decoded copy, its dependencies a tuple. (It is filled without the dataclass's __init__,
so a field added to one of TaskRow and TaskSnapshot but not the other must fail here.)"""

from __future__ import annotations

import dataclasses

import pytest

from pico.domain.values import TaskSnapshot
from pico.projections.queries import TaskRow, _task

ROW = TaskRow(
    id=7,
    conversation_id=2,
    kind="tool",
    status="running",
    role="inflight",
    state='{"call":{"name":"read","arguments":{"path":"a.py"}},"n":[1,2]}',
    after=[3, 5],  # type: ignore[arg-type]  # a driver's list, as a row may hold it
    foreground=True,
    spawned_by=4,
    owned_conversation_id=None,
    not_before=12.5,
    required_permit="net",
    abort_requested=False,
    updated_seq=41,
)


def _constructed(state: object) -> TaskSnapshot:
    """The snapshot of ``ROW`` through the dataclass's own constructor, by field name."""
    return TaskSnapshot(**{**ROW._asdict(), "state": state, "after": (3, 5)})


def test_a_task_record_is_the_snapshot_its_constructor_makes() -> None:
    state = {"call": {"name": "read", "arguments": {"path": "a.py"}}, "n": [1, 2]}
    read, made = _task(ROW), _constructed(state)
    assert read == made and repr(read) == repr(made)
    assert list(vars(read)) == [f.name for f in dataclasses.fields(TaskSnapshot)]
    assert type(read.after) is tuple and read.live
    with pytest.raises(dataclasses.FrozenInstanceError):
        read.status = "done"  # type: ignore[misc]


def test_each_read_decodes_a_fresh_state_and_a_metadata_read_none() -> None:
    first, second = _task(ROW), _task(ROW)
    assert first.state == second.state and first.state is not second.state
    assert _task(ROW, False) == _constructed(None)
