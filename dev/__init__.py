"""`ksquad dev`, the embedded default: Temporal's dev server, the worker with local sandboxes and SQLite, a
stand-in for the API server and the bridge, and the HTTP API the `ksquad` CLI talks to (no cluster needed).
Builds on the production worker's registry (`worker.registry`); never imports the CLI."""
