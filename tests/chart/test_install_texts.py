"""Every text that tells a user how to install ksquad gives the steps the seed Run needs: each Run namespace it
lists is created and labelled for the restricted Pod Security level (the chart checks), and the model's key is
created, labelled as a credential and annotated with the hosts it may go to (without that, the bridge refuses the
seed Run: InvalidReferences). Read from the texts themselves, so a doc edit that drops a step fails here."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
TEXTS = {
    "README.md": ROOT / "README.md",
    "docs/operating.md": ROOT / "docs" / "operating.md",
    "NOTES.txt": ROOT / "charts" / "ksquad" / "templates" / "NOTES.txt",
}


def commands(text: str) -> list[str]:
    """The shell commands a text gives (continuation lines joined, comments dropped)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [
        line.split("   #")[0].split("  #")[0].strip()
        for line in joined.splitlines()
        if re.match(r"\s*(kubectl|helm) ", line)
    ]


@pytest.mark.parametrize("name", ["README.md", "NOTES.txt"])  # docs/operating.md hands over to NOTES.txt
def test_the_text_creates_labels_and_annotates_the_model_key(name: str) -> None:
    given = commands(TEXTS[name].read_text())
    creates = [c for c in given if re.search(r"create secret generic model-key\b", c)]
    assert creates, f"{name} gives no command that creates the model's key"
    namespace = re.search(r"-n (\S+)", creates[0])
    assert namespace, creates[0]
    assert any(
        re.search(rf"-n {namespace[1]} label secret model-key ksquad\.io/credential=true", c) for c in given
    ), f"{name}: model-key is never labelled ksquad.io/credential=true"
    assert any(
        re.search(rf"-n {namespace[1]} annotate secret model-key ksquad\.io/allowed-hosts=\S+", c)
        for c in given
    ), f"{name}: model-key is never annotated with ksquad.io/allowed-hosts (the seed Run would be refused)"


@pytest.mark.parametrize("name", ["README.md", "docs/operating.md"])
def test_each_run_namespace_the_install_lists_is_created_and_labelled_restricted(name: str) -> None:
    given = commands(TEXTS[name].read_text())
    installs = [c for c in given if c.startswith("helm install") and "namespaces=" in c]
    assert installs, f"{name} gives no helm install that sets namespaces"
    for install in installs:
        listed = re.search(r"namespaces=\{([^}]*)\}", install)
        assert listed, install
        for namespace in listed[1].split(","):
            assert f"kubectl create namespace {namespace}" in given, f"{name}: {namespace} is never created"
            assert (
                f"kubectl label namespace {namespace} pod-security.kubernetes.io/enforce=restricted" in given
            ), f"{name}: {namespace} is never labelled restricted (the chart refuses the install)"
