"""The custom search attributes every ksquad workflow may set.

SQL visibility allows few custom attributes (10 Keyword, 3 Int, 3 Datetime), so the list is short and
carries no prompts, inputs or secrets: only what an operator filters runs by.
"""

from typing import Any

from temporalio.common import SearchAttributeKey

PHASE = SearchAttributeKey.for_keyword("KsquadPhase")
NAMESPACE = SearchAttributeKey.for_keyword("KsquadNamespace")
AGENT = SearchAttributeKey.for_keyword("KsquadAgent")
TRIGGERED_BY = SearchAttributeKey.for_keyword("KsquadTriggeredBy")
RESUME_AT = SearchAttributeKey.for_datetime("KsquadResumeAt")
ATTEMPT = SearchAttributeKey.for_int("KsquadAttempt")

# Registered on the dev server at start (`ksquad dev`, the test bed) and by operators on a real cluster.
ALL: tuple[SearchAttributeKey[Any], ...] = (PHASE, NAMESPACE, AGENT, TRIGGERED_BY, RESUME_AT, ATTEMPT)
