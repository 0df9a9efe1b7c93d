"""The base of every ksquad type: pydantic v2, camelCase on the wire (as in the manifests and the CRDs).

Fields are snake_case in Python and camelCase in JSON, in workflow history and in Kubernetes objects; both
spellings are accepted on input, so a manifest applies verbatim and a payload round-trips.
"""

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel


class KsquadModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",  # a misspelt field is an error that names it, never silently ignored
        frozen=False,
        use_attribute_docstrings=True,  # a field's docstring is its description: `kubectl explain` shows it
    )


class InvalidObject(ValueError):
    """A manifest or payload failed validation; `problems` holds one "field.path: message" line per error."""

    def __init__(self, what: str, problems: list[str]) -> None:
        super().__init__(f"invalid {what}: " + "; ".join(problems))
        self.what = what
        self.problems = problems


def field_problems(err: ValidationError, prefix: str = "") -> list[str]:
    """Pydantic's errors as "spec.retryPolicy.maxRetries: Input should be less than or equal to 20 (got 50)"."""
    problems = []
    for e in err.errors(include_url=False):
        path = ".".join(str(part) for part in (*([prefix] if prefix else []), *e["loc"]))
        got = e.get("input")
        shown = (
            ""
            if e["type"] in ("missing", "extra_forbidden") or isinstance(got, dict | list)
            else f" (got {got!r})"
        )
        message = "unknown field" if e["type"] == "extra_forbidden" else e["msg"]
        if e["type"] == "value_error":  # a validator's own sentence, without pydantic's "Value error, "
            message = str((e.get("ctx") or {}).get("error") or message)
        problems.append(f"{path}: {message}{shown}")
    return problems
