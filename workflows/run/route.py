"""The route: which of the Run's eligible agents it is on, with which model, and the rate-limit policy that moves
it (to the agent's fallback model, then the Project's, to the next agent whose credential is not throttled, or
into a pause)."""

from datetime import timedelta

from temporalio import workflow

from workflows.activity_types import RateLimitDetails
from workflows.contract import FairShare, ModelRef, Resolution, ResolvedAgent
from workflows.envelope import RouteChoice
from workflows.policies import RateLimitAction, RateLimitThresholds, decide_rate_limit, parse_retry_after
from workflows.run.mirror import StatusMirror
from workflows.run.outcomes import RateLimitPause, Reroute
from workflows.run.state import Route, RunInput
from workflows.run.throttles import Throttles
from workflows.status import Phase

RATE_LIMITS = RateLimitThresholds()


class Router:
    def __init__(
        self,
        run: RunInput,
        state: Route,
        resolution: Resolution | None,
        mirror: StatusMirror,
        throttles: Throttles,
    ) -> None:
        self.run = run
        self.state = state
        self.resolution = resolution  # the eligible agents, once references are resolved
        self.mirror = mirror
        self.throttles = throttles

    def agent(self) -> ResolvedAgent:
        assert self.resolution is not None
        return self.resolution.agents[self.state.agent_index]

    def share(self) -> FairShare:
        """Whose run this is where runs wait together (its Team), once references are resolved."""
        return self.resolution.share if self.resolution is not None else FairShare()

    def model(self) -> ModelRef:
        agent = self.agent()
        if self.state.on_project_fallback and agent.project_fallback_model is not None:
            return agent.project_fallback_model
        if self.state.on_fallback and agent.fallback_model is not None:
            return agent.fallback_model
        return agent.model

    def _next_fallback(self) -> tuple[str, ModelRef] | None:
        """The fallback a rate limit moves the run to now: the agent's, then the Project's, skipping one whose
        credential is throttled too; None once the run is on the last (or there is none)."""
        agent, state = self.agent(), self.state
        chain: list[tuple[str, ModelRef | None]] = []
        if not state.on_fallback and not state.on_project_fallback:
            chain.append(("agent", agent.fallback_model))
        if not state.on_project_fallback:
            chain.append(("project", agent.project_fallback_model))
        for which, model in chain:
            if model is not None and not self.throttles.is_throttled(model.throttle_key(self.run.namespace)):
                return which, model
        return None

    def credential_key(self) -> str:
        return self.model().throttle_key(self.run.namespace) if self.resolution is not None else ""

    def credential_keys(self) -> list[str]:
        """Every credential the run may call with (each agent's model and fallback), in order."""
        assert self.resolution is not None
        keys: list[str] = []
        for agent in self.resolution.agents:
            for model in (agent.model, agent.fallback_model, agent.project_fallback_model):
                if model is not None and (key := model.throttle_key(self.run.namespace)) not in keys:
                    keys.append(key)
        return keys

    def choice(self) -> RouteChoice:
        """The agent and model the run is on, as the warrant names them: what an attempt's activities build its
        contract from."""
        agent, state = self.agent(), self.state
        if state.on_project_fallback and agent.project_fallback_model is not None:
            return RouteChoice(agent_index=state.agent_index, model="project")
        if state.on_fallback and agent.fallback_model is not None:
            return RouteChoice(agent_index=state.agent_index, model="fallback")
        return RouteChoice(agent_index=state.agent_index, model="agent")

    def reroute(self, agent_index: int) -> None:
        self.state.agent_index, self.state.on_fallback, self.state.consecutive_limits = agent_index, False, 0
        self.state.on_project_fallback = False

    def answered(self) -> None:
        self.state.consecutive_limits = 0

    async def on_rate_limit(self, details: RateLimitDetails) -> None:
        """Apply the rate-limit policy: returns after switching to the fallback model; raises Reroute or
        RateLimitPause (every other run on the credential told first)."""
        now = workflow.now()
        key = self.credential_key()
        self.state.consecutive_limits += 1
        strikes = self.throttles.strike(key)
        retry_after = parse_retry_after(
            details.retry_after,
            retry_after_ms=details.retry_after_ms,
            response_date=details.response_date,
            provider_resets=details.provider_resets,
            observed_at=details.observed_at or now,
            cap_seconds=RATE_LIMITS.cap_seconds,
        )
        fallback = self._next_fallback()
        decision = decide_rate_limit(
            on_fallback=False,  # _next_fallback says whether there is one to move to
            fallback_available=fallback is not None,
            retry_after_seconds=retry_after,
            consecutive_limits=self.state.consecutive_limits,
            credential_strikes=strikes,
            next_agent=self._next_unthrottled_agent(),
            rand=workflow.random().random(),
            thresholds=RATE_LIMITS,
        )
        model = details.model or "model"
        if decision.action == RateLimitAction.FALLBACK:
            assert fallback is not None
            which, _ = fallback
            if which == "project":
                self.state.on_project_fallback = True
            else:
                self.state.on_fallback = True
            self.mirror.status.model = self.model().name
            reason = "switched to the Project's fallback model" if which == "project" else decision.reason
            message = f"{model} rate limited; {reason}"
            self.mirror.move(Phase.RUNNING, reason="ModelFallback", message=message)
            return
        until = now + timedelta(seconds=decision.delay_seconds)
        await self.throttles.report(key, until)
        if decision.action == RateLimitAction.REROUTE:
            assert decision.agent is not None and self.resolution is not None
            raise Reroute([a.name for a in self.resolution.agents].index(decision.agent), decision.reason)
        raise RateLimitPause(until, f"{model} rate limited ({decision.reason})")

    def _next_unthrottled_agent(self) -> str | None:
        assert self.resolution is not None
        agents = self.resolution.agents
        for offset in range(1, len(agents)):
            candidate = agents[(self.state.agent_index + offset) % len(agents)]
            if not self.throttles.is_throttled(candidate.model.throttle_key(self.run.namespace)):
                return candidate.name
        return None
