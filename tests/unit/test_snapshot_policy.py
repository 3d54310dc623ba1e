"""When an aggregate's snapshot is due: every SNAPSHOT_INTERVAL versions, scaled for a
conversation by its context length so snapshot work per event stays flat."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pico.domain.conversation import Conversation
from pico.domain.session import Session
from pico.infrastructure.storage import SNAPSHOT_INTERVAL, _snapshot_due


@pytest.mark.parametrize(
    ("context", "scale"),
    [(0, 1), (1999, 1), (2000, 2), (3999, 2), (4000, 4), (7999, 4), (8000, 8), (16500, 16)],
)
def test_a_conversations_snapshot_scale_grows_with_its_context(context: int, scale: int) -> None:
    conv = Conversation.start(session_id="s", conversation_id=1)
    conv.context = list(range(1, context + 1))
    assert conv.snapshot_scale == scale


def test_a_long_conversation_is_snapshotted_at_multiples_of_its_scaled_interval() -> None:
    conv = Conversation.start(session_id="s", conversation_id=1)
    conv.context = list(range(1, 4001))  # scale 4
    interval = 4 * SNAPSHOT_INTERVAL
    conv.version = interval + 1
    assert _snapshot_due(conv, conv.version, 2)  # crossed 4 x 200 with two new events
    conv.version = SNAPSHOT_INTERVAL + 1
    assert not _snapshot_due(conv, conv.version, 2)  # an unscaled multiple no longer snapshots
    assert not _snapshot_due(conv, conv.version, 0)  # nothing new: never


def test_aggregates_without_a_scale_use_the_plain_interval() -> None:
    session = Session(session_id="s")
    session.version = SNAPSHOT_INTERVAL
    assert _snapshot_due(session, session.version, 1)
    session.version = SNAPSHOT_INTERVAL + 1
    assert not _snapshot_due(session, session.version, 1)


@given(
    version=st.integers(min_value=0, max_value=50_000),
    new=st.integers(min_value=0, max_value=700),
    context=st.integers(min_value=0, max_value=20_000),
)
def test_a_snapshot_is_due_exactly_when_a_multiple_of_the_scaled_interval_was_reached(
    version: int, new: int, context: int
) -> None:
    """Due iff one of the batch's new versions (version - new, version] is a multiple of
    the scaled interval: the quick test on the plain interval (most saves) never refuses
    one that is due."""
    conv = Conversation.start(session_id="s", conversation_id=1)
    conv.context = list(range(1, context + 1))
    conv.version = version
    interval = SNAPSHOT_INTERVAL * conv.snapshot_scale
    reached = any(v % interval == 0 for v in range(max(version - new + 1, 0), version + 1))
    assert _snapshot_due(conv, conv.version, new) == (new > 0 and reached)
