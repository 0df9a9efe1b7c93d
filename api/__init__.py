"""What ksquad serves over HTTP to people and the Temporal UI, shared by the embedded stack's API (`dev.api`)
and the cluster's (`api.cluster`, the `ksquad-api` Deployment): the payload codec endpoint (`codec`) and each
run's event stream (`streams`)."""
