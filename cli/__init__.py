"""`ksquad`, the command line: the runs commands against the embedded stack's API or a cluster, and the verbs
that start the embedded stack itself (`ksquad dev`, `ksquad hello`, from `dev`)."""
