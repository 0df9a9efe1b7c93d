"""`helm uninstall`, last of tests/chart/ (the package's tests share one release, and its conftest orders this module
after the others): everything the chart made is gone, but the CRDs."""

from tests.chart.conftest import HOME, NS, RELEASE, Release, wait_for


async def test_helm_uninstall_removes_everything_it_made_but_the_crds(release: Release) -> None:
    # As the docs say: first the Runs.
    release.kubectl("delete", "runs", "--all", "-n", NS, "--wait=true", "--timeout=90s")
    release.helm("uninstall", RELEASE, "-n", HOME, "--wait")
    selector = f"app.kubernetes.io/instance={RELEASE}"
    namespaced = "deployments,replicasets,pods,services,serviceaccounts,roles,rolebindings,configmaps,poddisruptionbudgets,networkpolicies,leases"

    def left() -> list[str]:
        return [
            f"{o['kind']} {o['metadata']['name']}"
            for o in release.get(namespaced, "-A", "-l", selector)["items"]
        ]

    try:  # pods end after their grace period, once their Deployments are gone
        await wait_for("the release's objects to be gone", lambda: not left(), timeout=90)
    except AssertionError:
        raise AssertionError(f"left after helm uninstall: {left()}") from None
    cluster_wide = "mutatingadmissionpolicies,mutatingadmissionpolicybindings,validatingadmissionpolicies,validatingadmissionpolicybindings,clusterroles,clusterrolebindings"
    assert not release.get(cluster_wide, "-l", selector)["items"]
    assert not release.get("leases", "-n", HOME)["items"], "the bridge's Lease went too"
    crds = release.get("crd")["items"]
    assert {"runs.ksquad.io", "agents.ksquad.io"} <= {c["metadata"]["name"] for c in crds}, "the CRDs stay"
