"""The test bed: the real servers and clusters the tests and the benchmarks run ksquad against (the test
cluster's control plane, node, namespaces and images; PostgreSQL; Temporal's test server; ASGI servers; the
reference agent and the scripted model; ksquad deployed as the chart does it, and `ksquad dev`'s stack).

Not product code and not in the wheel: it imports ksquad's packages, never `tests` or `bench`."""
