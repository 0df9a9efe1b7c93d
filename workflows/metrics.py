"""What the workflows measure, through the Temporal SDK's metric meter: exported with the SDK's own metrics on
each worker's `/metrics` (temporal_client.telemetry), and recorded only when the code runs for the first time,
never while a workflow replays, so a figure counts what happened once.

    ksquad_run_phase_changes_total{phase,reason}   every status change of every Run
    ksquad_runs_finished_total{phase,reason}       Runs that ended: Succeeded, Failed (with why), Cancelled
    ksquad_run_phase_seconds{phase}                 how long Runs stayed in a phase before they left it
    ksquad_rate_limit_pauses_total{credential}      Paused(RateLimited), per credential (<namespace>/<secret>)
    ksquad_resume_lateness_seconds{credential}      how late a rate-limited run went on after its resumeAt
    ksquad_gate_waiting{scope} / ksquad_gate_holders{scope}   Queued runs and slot holders of a concurrency gate
    ksquad_throttle_subscribers{credential}         runs subscribed to a credential, counted at its last limit
"""

from datetime import timedelta

from temporalio import workflow

from workflows.status import Phase


def phase_changed(left: Phase, entered: Phase, reason: str | None, stayed: timedelta | None) -> None:
    meter = workflow.metric_meter()
    labels = {"phase": entered.value, "reason": reason or ""}
    meter.create_counter("ksquad_run_phase_changes", "status changes of Runs").add(1, labels)
    if stayed is not None and entered != left:
        meter.create_histogram_timedelta(
            "ksquad_run_phase_seconds", "time Runs stayed in a phase before leaving it"
        ).record(max(stayed, timedelta(0)), {"phase": left.value})
    if entered.terminal:
        meter.create_counter("ksquad_runs_finished", "Runs that ended, by phase and reason").add(1, labels)


def rate_limit_paused(credential: str) -> None:
    workflow.metric_meter().create_counter(
        "ksquad_rate_limit_pauses", "Paused(RateLimited) per credential"
    ).add(1, {"credential": credential})


def resumed_late(credential: str, lateness: timedelta) -> None:
    workflow.metric_meter().create_histogram_timedelta(
        "ksquad_resume_lateness_seconds", "how late rate-limited runs went on after their resumeAt"
    ).record(max(lateness, timedelta(0)), {"credential": credential})


def gate_sizes(scope: str, waiting: int, holders: int) -> None:
    meter = workflow.metric_meter()
    meter.create_gauge("ksquad_gate_waiting", "Queued runs of a concurrency gate").set(
        waiting, {"scope": scope}
    )
    meter.create_gauge("ksquad_gate_holders", "slot holders of a concurrency gate").set(
        holders, {"scope": scope}
    )


def throttle_size(credential: str, subscribers: int) -> None:
    workflow.metric_meter().create_gauge(
        "ksquad_throttle_subscribers", "runs subscribed to a credential, counted at its last limit"
    ).set(subscribers, {"credential": credential})
