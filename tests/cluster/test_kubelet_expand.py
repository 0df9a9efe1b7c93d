"""The loopback kubelet expands `$(VAR)` in commands and env as Kubernetes defines it."""

from tests.cluster.kubelet import expand


def test_known_variables_expand_unknown_stay_and_double_dollar_escapes() -> None:
    env = {"HOST": "127.1.0.2", "PORT": "8080"}
    assert expand("--bind=$(HOST):$(PORT)", env) == "--bind=127.1.0.2:8080"
    assert expand("$(MISSING)", env) == "$(MISSING)"
    assert expand("$$(HOST)", env) == "$(HOST)"
    assert expand("cost: $5", env) == "cost: $5"
