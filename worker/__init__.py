"""`ksquad-worker`, the production worker: its settings, the workflows and activities it registers, and its
process (Temporal client, coordination store, sandboxes, health probes). Imports neither `dev` nor `cli`."""
