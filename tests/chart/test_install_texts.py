"""Every text that tells a user how to install ksquad gives the steps the seed Run needs: each Run namespace it
lists is created and labelled for the restricted Pod Security level (the chart checks), and the model's key is
created, labelled as a credential and annotated with the hosts it may go to (without that, the bridge refuses the
seed Run: InvalidReferences). Read from the texts themselves, so a doc edit that drops a step fails here. The
README's commands are run on the test cluster (tests/chart/conftest.py's release, tests/chart/test_install.py's
seed test); NOTES.txt's seed steps are the README's word for word, and docs/operating.md's install is the README's
with the codec token and the API's URL the test bed sets too."""

import re

import pytest

from tests.support.install_texts import ROOT, TEXTS, block_steps, commands, helm_values, readme_cluster_steps


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


def test_notes_gives_the_readmes_seed_steps_word_for_word() -> None:
    """The README's steps after the install are run on the test cluster (tests/chart/test_install.py); NOTES.txt's
    are the same commands."""

    def seed_steps(steps: list[str]) -> list[str]:
        return [s for s in steps if "model-key" in s or s.startswith("kubectl apply -f examples/")]

    readme = seed_steps(readme_cluster_steps())
    assert len(readme) == 4, readme
    assert seed_steps(commands(TEXTS["NOTES.txt"].read_text())) == readme


def test_operating_mds_install_is_the_readmes_with_the_codec_token_and_the_api_url() -> None:
    """The README's install is what tests/chart/ runs (its release fixture); docs/operating.md's adds the codec
    token's Secret and the API's URL and UI origins, which the test bed sets too (tests/chart/conftest.py)."""

    def steps(given: list[str]) -> tuple[list[str], dict[str, str]]:
        at = next(i for i, s in enumerate(given) if s.startswith("helm install"))
        before = [re.sub(r"--from-literal=url=\S+", "--from-literal=url=<database>", s) for s in given[:at]]
        return [re.sub(r"\s+", " ", s) for s in before], helm_values(given[at])

    readme, readme_values = steps(readme_cluster_steps())
    operating, operating_values = steps(block_steps("docs/operating.md", "## Install with Helm"))
    token = 'kubectl -n ksquad create secret generic ksquad-codec-token --from-literal=token="$(head -c24 /dev/urandom | base64)"'
    assert operating == [*readme, token]
    extra = {"api.codecTokenSecret.name", "api.url", "api.uiOrigins"}
    assert set(operating_values) == set(readme_values) | extra
    assert {k: operating_values[k] for k in readme_values} == readme_values
    bed = (ROOT / "tests" / "chart" / "conftest.py").read_text()
    assert all(f'"{key}=' in bed or f'f"{key}=' in bed for key in extra), "the test bed sets them for its own"
