"""What ksquad-api's callers share, bounded: every stream, poll and review one caller holds is counted per person,
per namespace and in all, so no one tenant can take what the others need.

A `Budget` counts what is held now (open event streams, console requests in flight): taking a slot checks the
three bounds and counts it in one step (nothing awaits between: atomic in the event loop, so parallel opens
cannot pass it together). A `Rate` bounds how often something is done (requests per person, token reviews the API
server refused per client address), as token buckets. A refusal says which bound held and when to try again: the
API answers 429 with `Retry-After`, held back a moment first (`Tarpit`) so that a client asking again at once
asks less often. Each budget's use and refusals are metrics (docs/operating.md, "Budgets").
"""

import asyncio
import contextlib
import math
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

IN_USE = Gauge("ksquad_api_budget_in_use", "slots of a budget held now", ["budget"])
REFUSED = Counter(
    "ksquad_api_budget_refused", "requests a budget refused, by the bound that held", ["budget", "bound"]
)


class OverBudget(Exception):
    """A bound held: the message names it; `retry_after` is when to try again, in whole seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def three_numbers(text: str, setting: str, kinds: tuple[type, type, type], shape: str) -> list[Any]:
    """A budget setting as the environment has it (the chart's api.budgets values): three numbers, each more
    than 0, of `kinds`; ValueError naming the setting and its `shape` otherwise."""
    parts = text.split(",")
    try:
        if len(parts) != len(kinds):
            raise ValueError
        numbers = [kind(part) for kind, part in zip(kinds, parts, strict=True)]
    except ValueError:
        whole = "whole " if set(kinds) == {int} else ""
        raise ValueError(f"{setting} must be three {whole}numbers, {shape} (got {text!r})") from None
    if min(numbers) <= 0:
        raise ValueError(f"{setting}: each must be more than 0 (got {text!r})")
    return numbers


@dataclass(frozen=True)
class Limits:
    per_person: int
    per_namespace: int
    total: int

    @classmethod
    def parse(cls, text: str, setting: str) -> "Limits":
        """`per person,per namespace,total` (the chart's api.budgets values, as the environment has them)."""
        return cls(*three_numbers(text, setting, (int, int, int), "per person,per namespace,total"))


class Budget:
    """Slots held at once: per person, per namespace and in all (see the module)."""

    def __init__(self, name: str, what: str, limits: Limits, retry_after: int = 5) -> None:
        self.name = name
        self.what = what  # how a refusal names a slot: "event streams"
        self.limits = limits
        self.retry_after = retry_after
        self.people: dict[str, int] = {}
        self.namespaces: dict[str, int] = {}
        self.total = 0

    def _refusal(self, person: str, namespace: str) -> OverBudget | None:
        bounds = [
            ("person", self.people.get(person, 0), self.limits.per_person, person),
            ("total", self.total, self.limits.total, "ksquad-api"),
        ]
        if namespace:
            held = self.namespaces.get(namespace, 0)
            bounds.insert(1, ("namespace", held, self.limits.per_namespace, f"namespace {namespace}"))
        for bound, held, most, who in bounds:
            if held >= most:
                REFUSED.labels(self.name, bound).inc()
                return OverBudget(
                    f"{who} has {most} {self.what} open already (the most {'one person' if bound == 'person' else who}"
                    f" may hold): close one, or try again in {self.retry_after} s",
                    self.retry_after,
                )
        return None

    def take(self, person: str, namespace: str) -> None:
        """Hold a slot for `person` in `namespace` (none: "", for what is in no namespace or in one the person may
        not act in), or raise OverBudget. Call `give_back` with the same."""
        refusal = self._refusal(person, namespace)
        if refusal is not None:
            raise refusal
        self.people[person] = self.people.get(person, 0) + 1
        if namespace:
            self.namespaces[namespace] = self.namespaces.get(namespace, 0) + 1
        self.total += 1
        IN_USE.labels(self.name).set(self.total)

    def give_back(self, person: str, namespace: str) -> None:
        for counts, key in ((self.people, person), (self.namespaces, namespace)):
            if not key:
                continue
            counts[key] -= 1
            if not counts[key]:
                del counts[key]
        self.total -= 1
        IN_USE.labels(self.name).set(self.total)

    @contextlib.contextmanager
    def held(self, person: str, namespace: str) -> Iterator[None]:
        self.take(person, namespace)
        try:
            yield
        finally:
            self.give_back(person, namespace)


@dataclass(frozen=True)
class RateLimits:
    per_client: float  # a second, refilled
    burst: int
    total: float  # a second, every client together

    @classmethod
    def parse(cls, text: str, setting: str) -> "RateLimits":
        """`per client a second,burst,total a second`."""
        shape = "per client a second,burst,total a second"
        return cls(*three_numbers(text, setting, (float, int, float), shape))

    def bounds(self) -> dict[str, tuple[float, float]]:
        return {"client": (self.per_client, self.burst), "total": (self.total, max(self.burst, self.total))}


@dataclass(frozen=True)
class RequestLimits:
    """Requests a second: per person, per namespace, in all; each may burst to BURST_SECONDS' worth."""

    per_person: float
    per_namespace: float
    total: float

    BURST_SECONDS = 3

    @classmethod
    def parse(cls, text: str, setting: str) -> "RequestLimits":
        """`per person,per namespace,total`, each a second."""
        shape = "per person,per namespace,total, each a second"
        return cls(*three_numbers(text, setting, (float, float, float), shape))

    def bounds(self) -> dict[str, tuple[float, float]]:
        return {
            bound: (rate, rate * self.BURST_SECONDS)
            for bound, rate in (
                ("person", self.per_person),
                ("namespace", self.per_namespace),
                ("total", self.total),
            )
        }


class Rate:
    """How often something may happen, bounded per key of each bound (a client address, a person, a namespace)
    and in all: token buckets, each full at its burst and refilled at its rate a second. `check` refuses when a
    bucket is empty; `spend` counts one; `take` does both (nothing awaits between: atomic in the event loop).
    Each counts in the bounds it is given a key for (`total=""` for the bound in all), so a request can be counted
    in one bound when its caller is known and in another once its access is. Keys are remembered up to `keys` a bound (the least recently seen forgotten first: a forgotten key starts
    full, so the bound in all is what holds a caller that rotates keys)."""

    def __init__(
        self, name: str, what: str, bounds: dict[str, tuple[float, float]], keys: int = 4096
    ) -> None:
        self.name, self.what, self.bounds, self.keys = name, what, bounds, keys
        self._buckets: dict[str, OrderedDict[str, tuple[float, float]]] = {b: OrderedDict() for b in bounds}

    def _levels(self, keys: dict[str, str], now: float) -> dict[str, float]:
        levels = {}
        for bound, key in keys.items():
            rate, burst = self.bounds[bound]
            level, at = self._buckets[bound].get(key, (burst, now))
            levels[bound] = min(burst, level + (now - at) * rate)
        return levels

    def check(self, **keys: str) -> None:
        """Raise OverBudget when a bucket of these keys (`client=`, `person=`, `namespace=`, `total=`) is empty."""
        for bound, have in self._levels(keys, time.monotonic()).items():
            if have < 1:
                REFUSED.labels(self.name, bound).inc()
                wait = max(1, math.ceil((1 - have) / self.bounds[bound][0]))
                key = keys[bound]
                who = {"client": f"client {key}", "namespace": f"namespace {key}", "person": key}.get(
                    bound, "all callers"
                )
                raise OverBudget(f"too many {self.what} from {who}: try again in {wait} s", wait)

    def spend(self, **keys: str) -> None:
        now = time.monotonic()
        for bound, level in self._levels(keys, now).items():
            buckets, key = self._buckets[bound], keys[bound]
            buckets.pop(key, None)
            buckets[key] = (max(0.0, level - 1), now)
            while len(buckets) > self.keys:
                buckets.popitem(last=False)

    def take(self, **keys: str) -> None:
        self.check(**keys)
        self.spend(**keys)

    def give_back(self, **keys: str) -> None:
        """Undo a `take` whose costly thing turned out not to count (a token reviewed and accepted)."""
        now = time.monotonic()
        for bound, level in self._levels(keys, now).items():
            self._buckets[bound][keys[bound]] = (min(self.bounds[bound][1], level + 1), now)


class Tarpit:
    """Refusals held back up to `seconds` (never past their Retry-After) before they are sent: a client that asks
    again as soon as it is refused (a script in a loop, a page polling) then asks at most once a `seconds` on each
    connection, so what its refusals cost ksquad-api stays small. At most `most` are held at once in all (each holds
    a connection); past that, refusals are sent at once."""

    def __init__(self, seconds: float = 1.0, most: int = 256) -> None:
        self.seconds, self.most = seconds, most
        self.held = 0

    async def hold(self, retry_after: int) -> None:
        if self.held >= self.most or self.seconds <= 0:
            return
        self.held += 1
        IN_USE.labels("tarpit").set(self.held)
        try:
            await asyncio.sleep(min(self.seconds, retry_after))
        finally:
            self.held -= 1
            IN_USE.labels("tarpit").set(self.held)
