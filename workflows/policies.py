"""Pure policies of the Run workflow: backoff, Retry-After, the rate-limit decision, phase transitions.

Each is a small deterministic function (randomness is passed in, drawn from `workflow.random()`), so the
workflow stays replay-safe and each rule is tested on its own, with properties checked by hypothesis.
"""

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum

from workflows.status import Condition, ConditionType, PauseReason, Phase, RunStatus

# --- backoff ----------------------------------------------------------------------------------------------


def equal_jitter_backoff(n: int, base: float, cap: float, rand: float) -> float:
    """The n-th backoff (n >= 1): d = min(cap, base * 2^(n-1)); sleep d/2 + rand * d/2, rand in [0, 1).

    Equal jitter keeps at least half the delay (no thundering retries at ~0 s) while spreading the rest.
    """
    if n < 1:
        raise ValueError(f"backoff number starts at 1, got {n}")
    if not 0.0 <= rand <= 1.0:
        raise ValueError(f"rand must be in [0, 1], got {rand}")
    exponent = min(n - 1, 64)  # 2^64 * base is past any cap; avoids float overflow
    d = min(cap, base * math.pow(2, exponent))
    return d / 2 + rand * d / 2


# --- Retry-After ------------------------------------------------------------------------------------------

_DELTA_SECONDS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*$")
_SIGNED_NUMBER = re.compile(r"^\s*-\s*\d+(?:\.\d+)?\s*$")


def _http_date(value: str) -> datetime | None:
    try:
        parsed = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if parsed is None:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def parse_retry_after(
    retry_after: str | None,
    *,
    retry_after_ms: str | None = None,
    response_date: str | None = None,
    provider_resets: dict[str, str] | None = None,
    observed_at: datetime,
    cap_seconds: float,
) -> float | None:
    """Seconds to wait, from a 429's headers; None when they say nothing usable.

    - `retry-after-ms` (milliseconds, as some providers send) wins when valid: it is the most precise;
    - `Retry-After` as delta-seconds;
    - `Retry-After` as an HTTP-date, measured from the response's `Date` (the server's clock, immune to our
      clock skew) or, without a usable Date, from `observed_at`;
    - without a usable Retry-After, the provider's own reset headers: OpenAI's `x-ratelimit-reset-requests` /
      `-tokens` (durations: `6m0s`, `12ms`, `1h2m3.5s`) and Anthropic's `anthropic-ratelimit-*-reset` (RFC 3339
      times, measured like an HTTP-date); the latest of them, since the run may have hit either limit;
    - a negative value or a date in the past means "now" (0); garbage and absence mean None (use backoff);
    - the result is capped at `cap_seconds`: a provider saying "three days" does not park a run for three days.
    """
    seconds: float | None = None
    if retry_after_ms is not None:
        if (m := _DELTA_SECONDS.match(retry_after_ms)) is not None:
            seconds = float(m.group(1)) / 1000.0
        elif _SIGNED_NUMBER.match(retry_after_ms):
            seconds = 0.0
    if seconds is None and retry_after is not None:
        if (m := _DELTA_SECONDS.match(retry_after)) is not None:
            seconds = float(m.group(1))
        elif _SIGNED_NUMBER.match(retry_after):
            seconds = 0.0
        elif (when := _http_date(retry_after)) is not None:
            reference = (_http_date(response_date) if response_date else None) or observed_at
            seconds = max(0.0, (when - reference).total_seconds())
    if seconds is None and provider_resets:
        reference = (_http_date(response_date) if response_date else None) or observed_at
        resets = [_reset_seconds(value, reference) for value in provider_resets.values()]
        seconds = max((r for r in resets if r is not None), default=None)
    if seconds is None or math.isnan(seconds):
        return None
    return min(seconds, cap_seconds)


_DURATION = re.compile(r"^\s*((?:\d+(?:\.\d+)?(?:h|ms|m|s|us|µs|ns))+)\s*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _reset_seconds(value: str, reference: datetime) -> float | None:
    """A reset header's seconds from now: a Go-style duration ("6m0s", "12ms") or an RFC 3339 time."""
    if (m := _DURATION.match(value)) is not None:
        return sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(m.group(1)))
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None  # a time without a zone says nothing certain
    return max(0.0, (when - reference).total_seconds())


# --- the rate-limit decision ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RateLimitThresholds:
    cap_seconds: float = 3600.0  # the longest single pause, whatever Retry-After says
    backoff_base_seconds: float = 10.0  # without Retry-After: equal-jitter backoff per credential
    backoff_cap_seconds: float = 600.0
    reroute_after_limits: int = 3  # this many limits in a row on one run: re-route when another agent can
    reroute_after_seconds: float = 300.0  # a single limit this long: re-route when another agent can


class RateLimitAction(StrEnum):
    FALLBACK = "fallback"  # switch to the agent's fallbackModel, no pause
    PAUSE = "pause"  # Paused(RateLimited) until resume_at, a single durable timer
    REROUTE = "reroute"  # release the claim and re-dispatch to the next eligible agent


@dataclass(frozen=True)
class RateLimitDecision:
    action: RateLimitAction
    delay_seconds: float = 0.0
    agent: str | None = None
    reason: str = ""


def decide_rate_limit(
    *,
    on_fallback: bool,
    fallback_available: bool,
    retry_after_seconds: float | None,
    consecutive_limits: int,
    credential_strikes: int,
    next_agent: str | None,
    rand: float,
    thresholds: RateLimitThresholds = RateLimitThresholds(),
) -> RateLimitDecision:
    """What to do about a 429, in the order of DESIGN.md: fallback, then pause, then re-route.

    `consecutive_limits` counts this run's limits in a row, this one included; `credential_strikes` counts
    the credential's, this one included (it drives the backoff when the provider gave no Retry-After).
    `fallback_available` means a fallback model exists and its credential is not throttled; `next_agent`
    is the next eligible agent whose credential is not throttled, if any.
    """
    if fallback_available and not on_fallback:
        return RateLimitDecision(RateLimitAction.FALLBACK, reason="switched to the fallback model")
    if retry_after_seconds is not None:
        delay = min(retry_after_seconds, thresholds.cap_seconds)
        why = f"Retry-After {retry_after_seconds:g}s"
    else:
        delay = equal_jitter_backoff(
            max(1, credential_strikes), thresholds.backoff_base_seconds, thresholds.backoff_cap_seconds, rand
        )
        why = f"no Retry-After; backoff {delay:.1f}s after {max(1, credential_strikes)} limit(s) on the credential"
    long_limit = (retry_after_seconds or 0.0) >= thresholds.reroute_after_seconds
    repeated = consecutive_limits >= thresholds.reroute_after_limits
    if next_agent is not None and (long_limit or repeated):
        because = "a long limit" if long_limit else f"{consecutive_limits} limits in a row"
        # The run moves on, but the credential stays limited for `delay`: every other run on it must wait too.
        return RateLimitDecision(
            RateLimitAction.REROUTE, delay, next_agent, f"re-routed to {next_agent} after {because}"
        )
    return RateLimitDecision(RateLimitAction.PAUSE, delay, reason=why)


# --- phases and conditions --------------------------------------------------------------------------------

_ACTIVE = {Phase.PAUSED, Phase.CANCELLING, Phase.FAILED}
ALLOWED: dict[Phase, set[Phase]] = {
    Phase.PENDING: {Phase.PENDING, Phase.QUEUED, Phase.CLAIMING} | _ACTIVE,
    Phase.QUEUED: {Phase.QUEUED, Phase.CLAIMING} | _ACTIVE,
    Phase.CLAIMING: {Phase.CLAIMING, Phase.RUNNING, Phase.PENDING} | _ACTIVE,
    Phase.RUNNING: {Phase.RUNNING, Phase.SUCCEEDED, Phase.PENDING, Phase.CLAIMING} | _ACTIVE,
    Phase.PAUSED: {Phase.PAUSED, Phase.PENDING, Phase.QUEUED, Phase.CLAIMING, Phase.RUNNING} | _ACTIVE,
    Phase.CANCELLING: {Phase.CANCELLING, Phase.CANCELLED},
    Phase.SUCCEEDED: set(),
    Phase.FAILED: set(),
    Phase.CANCELLED: set(),
}


class InvalidTransition(RuntimeError):
    pass


def set_condition(
    status: RunStatus,
    kind: ConditionType,
    ok: bool | None,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> None:
    """Set a condition in place. Its lastTransitionTime moves only when its status changes."""
    value = "Unknown" if ok is None else ("True" if ok else "False")
    existing = status.condition(kind)
    if existing is not None and existing.status == value:
        existing.reason, existing.message, existing.observed_generation = reason, message, generation
        return
    condition = Condition(
        type=kind,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=now,
        observed_generation=generation,
    )
    status.conditions = [c for c in status.conditions if c.type != kind] + [condition]


def transition(
    status: RunStatus,
    phase: Phase,
    now: datetime,
    *,
    reason: str | None = None,
    message: str | None = None,
    pause_reason: PauseReason | None = None,
    resume_at: datetime | None = None,
    generation: int | None = None,
) -> RunStatus:
    """The next status: the phase moves along an edge of DESIGN.md's lifecycle, the revision goes up.

    Paused keeps a pause reason (and a resume time when one is known); leaving Paused clears them. A terminal
    phase is absorbing and sets, as a Job does, Complete=True (Succeeded) or Failed=True (Failed, Cancelled).
    """
    if phase not in ALLOWED[status.phase]:
        raise InvalidTransition(f"{status.phase} -> {phase} is not an edge of the Run lifecycle")
    if phase == Phase.PAUSED and pause_reason is None:
        raise InvalidTransition("Paused needs a pause reason")
    nxt = status.model_copy(deep=True)
    nxt.phase = phase
    nxt.reason = reason
    nxt.message = message
    nxt.pause_reason = pause_reason if phase == Phase.PAUSED else None
    nxt.resume_at = resume_at
    nxt.last_transition_time = now
    nxt.revision = status.revision + 1
    if generation is not None:
        nxt.observed_generation = generation
    if phase == Phase.PAUSED:
        set_condition(nxt, ConditionType.PAUSED, True, str(pause_reason), message or "", now, generation)
    elif status.phase == Phase.PAUSED:
        set_condition(nxt, ConditionType.PAUSED, False, "Resumed", "", now, generation)
    if phase == Phase.SUCCEEDED:
        set_condition(
            nxt, ConditionType.COMPLETE, True, reason or phase.value, message or "", now, generation
        )
    elif phase.terminal:
        set_condition(nxt, ConditionType.FAILED, True, reason or phase.value, message or "", now, generation)
    return nxt
