"""The reference sandbox agent: an A2A server that calls an OpenAI-compatible model and MCP tools.

It is a separate image and speaks only A2A, so it imports nothing else of ksquad (enforced by import-linter).
"""
