"""How ksquad's processes talk to Temporal: the connection (data converter, credentials, search attributes),
the payload codec, and a Run's workflow started, found and cancelled. The worker, the CRD bridge, the embedded
stack and the CLI use it; the deterministic core (`workflows`) never does."""
