"""How the verbs lay out what they print for people: aligned columns, and how long ago something was."""

from datetime import UTC, datetime


def age(timestamp: str | None) -> str:
    if not timestamp:
        return "-"
    seconds = int(
        (datetime.now(UTC) - datetime.fromisoformat(timestamp.replace("Z", "+00:00"))).total_seconds()
    )
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]
    )
