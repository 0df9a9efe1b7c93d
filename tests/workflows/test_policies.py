"""The pure policies of the Run workflow: backoff, Retry-After, the rate-limit decision, transitions."""

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.policies import (
    ALLOWED,
    InvalidTransition,
    RateLimitAction,
    RateLimitDecision,
    RateLimitThresholds,
    decide_rate_limit,
    equal_jitter_backoff,
    parse_retry_after,
    set_condition,
    transition,
)
from workflows.status import ConditionType, PauseReason, Phase, RunStatus

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
CAP = 3600.0

# --- backoff ----------------------------------------------------------------------------------------------


def test_equal_jitter_backoff_examples() -> None:
    assert equal_jitter_backoff(1, 10, 300, 0.0) == 5.0
    assert equal_jitter_backoff(1, 10, 300, 1.0) == 10.0
    assert equal_jitter_backoff(3, 10, 300, 0.5) == 30.0  # d = 40: 20 + 0.5 * 20
    assert equal_jitter_backoff(20, 10, 300, 0.0) == 150.0  # capped: d = 300


@given(st.integers(1, 200), st.floats(0.1, 1000), st.floats(0.1, 100_000), st.floats(0, 1))
def test_equal_jitter_backoff_stays_within_half_and_whole_of_the_capped_delay(
    n: int, base: float, cap: float, rand: float
) -> None:
    d = min(cap, base * 2 ** min(n - 1, 64))
    assert d / 2 - 1e-9 <= equal_jitter_backoff(n, base, cap, rand) <= d + 1e-9


@given(st.integers(1, 60), st.floats(0, 1))
def test_equal_jitter_backoff_floor_never_decreases(n: int, rand: float) -> None:
    assert equal_jitter_backoff(n + 1, 10, 300, 0.0) >= equal_jitter_backoff(n, 10, 300, 0.0)


def test_backoff_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="starts at 1"):
        equal_jitter_backoff(0, 10, 300, 0.5)
    with pytest.raises(ValueError, match="rand"):
        equal_jitter_backoff(1, 10, 300, 1.5)


# --- Retry-After ------------------------------------------------------------------------------------------


def parse(value: str | None, **kw: object) -> float | None:
    kw.setdefault("observed_at", NOW)
    kw.setdefault("cap_seconds", CAP)
    return parse_retry_after(value, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        ("0", 0.0),
        (" 7 ", 7.0),
        ("1.5", 1.5),
        ("-5", 0.0),
        ("abc", None),
        ("", None),
        (None, None),
        ("1e3", None),
        ("259200", CAP),
    ],
)
def test_delta_seconds(value: str | None, expected: float | None) -> None:
    assert parse(value) == expected


def test_http_date_is_measured_from_the_response_date() -> None:
    server_now = NOW - timedelta(seconds=30)  # the server's clock is 30 s behind ours
    when = format_datetime(server_now + timedelta(seconds=90), usegmt=True)
    assert parse(when, response_date=format_datetime(server_now, usegmt=True)) == 90.0


def test_http_date_without_a_date_header_uses_the_event_time() -> None:
    assert parse(format_datetime(NOW + timedelta(seconds=45), usegmt=True)) == 45.0
    assert parse(format_datetime(NOW + timedelta(seconds=45), usegmt=True), response_date="garbage") == 45.0


def test_http_date_in_the_past_means_now_and_obsolete_formats_parse() -> None:
    assert parse(format_datetime(NOW - timedelta(hours=1), usegmt=True)) == 0.0
    assert parse("Mon, 30 Nov 2026 12:02:00 GMT") == 120.0


def test_retry_after_ms_wins_when_valid() -> None:
    assert parse("120", retry_after_ms="1500") == 1.5
    assert parse("120", retry_after_ms="soon") == 120.0
    assert parse(None, retry_after_ms="-20") == 0.0


@given(st.text(max_size=40), st.one_of(st.none(), st.text(max_size=20)))
def test_any_header_text_gives_none_or_a_bounded_delay(value: str, ms: str | None) -> None:
    seconds = parse(value, retry_after_ms=ms)
    assert seconds is None or 0.0 <= seconds <= CAP


@given(st.integers(0, 10**9))
def test_delta_seconds_are_read_exactly_then_capped(value: int) -> None:
    assert parse(str(value)) == min(float(value), CAP)


@given(st.integers(-86400, 86400 * 10))
def test_http_dates_are_read_to_the_second_then_capped(offset: int) -> None:
    assert parse(format_datetime(NOW + timedelta(seconds=offset), usegmt=True)) == min(max(0.0, offset), CAP)


# --- the rate-limit decision ------------------------------------------------------------------------------


def decide(**kw: object) -> RateLimitDecision:
    args: dict[str, object] = dict(
        on_fallback=False,
        fallback_available=False,
        retry_after_seconds=None,
        consecutive_limits=1,
        credential_strikes=1,
        next_agent=None,
        rand=0.5,
    )
    args.update(kw)
    return decide_rate_limit(**args)  # type: ignore[arg-type]


def test_fallback_first_without_pausing() -> None:
    decision = decide(fallback_available=True, retry_after_seconds=120.0, next_agent="dev-2")
    assert decision.action == RateLimitAction.FALLBACK


def test_pause_for_retry_after_once_the_fallback_is_used_or_absent() -> None:
    for kw in ({"on_fallback": True, "fallback_available": True}, {}):
        decision = decide(retry_after_seconds=120.0, **kw)
        assert (decision.action, decision.delay_seconds) == (RateLimitAction.PAUSE, 120.0)


def test_without_retry_after_the_pause_is_backoff_per_credential() -> None:
    t = RateLimitThresholds()
    for strikes in (1, 2, 5):
        decision = decide(credential_strikes=strikes, rand=0.25)
        expected = equal_jitter_backoff(strikes, t.backoff_base_seconds, t.backoff_cap_seconds, 0.25)
        assert decision.delay_seconds == expected


def test_repeated_or_long_limits_reroute_when_another_agent_can_take_it() -> None:
    repeated = decide(consecutive_limits=3, retry_after_seconds=10.0, next_agent="dev-2")
    assert (repeated.action, repeated.agent) == (RateLimitAction.REROUTE, "dev-2")
    long = decide(retry_after_seconds=3 * 86400.0, next_agent="dev-2")
    assert (long.action, long.delay_seconds) == (RateLimitAction.REROUTE, CAP), "the credential stays limited"
    nowhere = decide(consecutive_limits=9, retry_after_seconds=3 * 86400.0, next_agent=None)
    assert (nowhere.action, nowhere.delay_seconds) == (RateLimitAction.PAUSE, CAP)


@given(
    st.booleans(),
    st.booleans(),
    st.one_of(st.none(), st.floats(0, 10**7)),
    st.integers(1, 50),
    st.integers(1, 50),
    st.one_of(st.none(), st.just("dev-2")),
    st.floats(0, 1),
)
def test_decisions_are_bounded_and_ordered(
    on_fallback: bool,
    fallback: bool,
    retry_after: float | None,
    limits: int,
    strikes: int,
    nxt: str | None,
    rand: float,
) -> None:
    d = decide(
        on_fallback=on_fallback,
        fallback_available=fallback,
        retry_after_seconds=retry_after,
        consecutive_limits=limits,
        credential_strikes=strikes,
        next_agent=nxt,
        rand=rand,
    )
    if fallback and not on_fallback:
        assert d.action == RateLimitAction.FALLBACK
    elif d.action == RateLimitAction.REROUTE:
        assert nxt is not None
    else:
        assert d.action == RateLimitAction.PAUSE
        assert 0.0 <= d.delay_seconds <= CAP


# --- phases and conditions --------------------------------------------------------------------------------


def test_transitions_bump_the_revision_and_keep_pause_fields_only_while_paused() -> None:
    s = transition(RunStatus(), Phase.CLAIMING, NOW, reason="Claiming")
    assert s.revision == 1
    resume = NOW + timedelta(seconds=120)
    s = transition(s, Phase.PAUSED, NOW, pause_reason=PauseReason.RATE_LIMITED, resume_at=resume)
    assert (s.pause_reason, s.resume_at, s.revision) == (PauseReason.RATE_LIMITED, resume, 2)
    assert s.condition(ConditionType.PAUSED).status == "True"  # type: ignore[union-attr]
    s = transition(s, Phase.CLAIMING, NOW + timedelta(seconds=120))
    assert (s.pause_reason, s.resume_at) == (None, None)
    assert s.condition(ConditionType.PAUSED).status == "False"  # type: ignore[union-attr]


def test_illegal_edges_are_refused() -> None:
    with pytest.raises(InvalidTransition):
        transition(RunStatus(phase=Phase.SUCCEEDED), Phase.RUNNING, NOW)
    with pytest.raises(InvalidTransition):
        transition(RunStatus(phase=Phase.PENDING), Phase.SUCCEEDED, NOW)
    with pytest.raises(InvalidTransition, match="pause reason"):
        transition(RunStatus(), Phase.PAUSED, NOW)


def test_condition_transition_time_moves_only_when_its_status_changes() -> None:
    s = RunStatus()
    set_condition(s, ConditionType.REFERENCES_RESOLVED, False, "Missing", "Agent dev-1", NOW, 1)
    later = NOW + timedelta(minutes=5)
    set_condition(s, ConditionType.REFERENCES_RESOLVED, False, "Missing", "Agent dev-2", later, 1)
    c = s.condition(ConditionType.REFERENCES_RESOLVED)
    assert c is not None
    assert (c.last_transition_time, c.message) == (NOW, "Agent dev-2")
    set_condition(s, ConditionType.REFERENCES_RESOLVED, True, "Resolved", "", later, 1)
    assert s.condition(ConditionType.REFERENCES_RESOLVED).last_transition_time == later  # type: ignore[union-attr]


@given(st.data())
def test_any_walk_along_allowed_edges_keeps_the_status_consistent(data: st.DataObject) -> None:
    s = RunStatus()
    # Each step drawn from the edges allowed where the walk is (filtering random walks discarded most of them).
    for i in range(data.draw(st.integers(min_value=0, max_value=30))):
        if not ALLOWED[s.phase]:
            break
        phase = data.draw(st.sampled_from(sorted(ALLOWED[s.phase])))
        pause = PauseReason.MANUAL if phase == Phase.PAUSED else None
        s = transition(s, phase, NOW + timedelta(seconds=i), pause_reason=pause)
        assert s.revision == i + 1
        assert (s.pause_reason is not None) == (s.phase == Phase.PAUSED)
        complete, failed = s.condition(ConditionType.COMPLETE), s.condition(ConditionType.FAILED)
        assert (complete is not None) == (s.phase == Phase.SUCCEEDED), "Complete only on success, as a Job"
        assert (failed is not None) == (s.phase in (Phase.FAILED, Phase.CANCELLED))
        assert len({c.type for c in s.conditions}) == len(s.conditions)
    if s.phase.terminal:
        assert not ALLOWED[s.phase], "terminal phases are absorbing"


@pytest.mark.parametrize(
    ("resets", "expected"),
    [
        ({"x-ratelimit-reset-requests": "6m0s"}, 360.0),
        ({"x-ratelimit-reset-tokens": "12ms"}, 0.012),
        ({"x-ratelimit-reset-requests": "1m3.5s"}, 63.5),
        ({"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "20s"}, 20.0),  # the later one
        ({"anthropic-ratelimit-requests-reset": "2026-11-30T12:01:30Z"}, 90.0),
        ({"anthropic-ratelimit-tokens-reset": "2026-11-30T11:00:00Z"}, 0.0),  # already past: now
        ({"x-ratelimit-reset-requests": "soon"}, None),
        ({"anthropic-ratelimit-requests-reset": "2026-11-30T12:01:30"}, None),  # no zone: not certain
        ({"x-ratelimit-reset-requests": "99999h"}, CAP),
    ],
)
def test_without_retry_after_the_providers_reset_headers_say_when(
    resets: dict[str, str], expected: float | None
) -> None:
    # A 429 without Retry-After fell straight to jittered backoff, though OpenAI and Anthropic say when.
    got = parse_retry_after(None, provider_resets=resets, observed_at=NOW, cap_seconds=CAP)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_retry_after_wins_over_the_reset_headers() -> None:
    resets = {"x-ratelimit-reset-requests": "6m0s"}
    assert parse_retry_after("5", provider_resets=resets, observed_at=NOW, cap_seconds=CAP) == 5.0


@given(st.dictionaries(st.text(max_size=40), st.text(max_size=40), max_size=4))
def test_any_reset_header_text_gives_none_or_a_bounded_delay(resets: dict[str, str]) -> None:
    got = parse_retry_after(None, provider_resets=resets, observed_at=NOW, cap_seconds=CAP)
    assert got is None or 0.0 <= got <= CAP


@given(st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_durations_are_read_exactly(hours: int, minutes: int, seconds: int) -> None:
    duration = f"{hours}h{minutes}m{seconds}s"
    got = parse_retry_after(
        None, provider_resets={"x-ratelimit-reset-requests": duration}, observed_at=NOW, cap_seconds=10**9
    )
    assert got == hours * 3600 + minutes * 60 + seconds
