"""Process wiring: settings, the Temporal client, the Worker, health and metrics, and the `ksquad` CLI."""
