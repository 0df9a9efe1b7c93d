"""The deterministic core of ksquad: workflows, their types and pure policies.

Everything here runs inside Temporal's workflow sandbox, so it imports only temporalio, pydantic and the
standard library (enforced by import-linter).
"""
