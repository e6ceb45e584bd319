"""k8snode.uninstall, the chart's pre-delete step, on its decisions: it ends only the DaemonSet Helm
installed for the release being uninstalled (never one applied from ``helm template`` output),
deletes it in the foreground and waits for it to go; a timeout or a refusal is one line. The hook
itself runs under real helm on kind (tests/test_kind_cluster.py: ``helm uninstall`` takes every
worker's labels off) and on the local cluster (tests/test_cluster_fgo_guide.py)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import V1DaemonSet, V1ObjectMeta
from kubernetes.client.exceptions import ApiException

from k8snode import uninstall

HELM = {uninstall.RELEASE_NAME: "mokka", uninstall.RELEASE_NAMESPACE: "mokka"}


class Apps:
    """The two AppsV1Api calls the step makes, on one DaemonSet that ends after ``reads`` reads."""

    def __init__(self, annotations: dict[str, str] | None, reads: int = 2) -> None:
        self.annotations, self.reads, self.deleted = annotations, reads, None

    def read_namespaced_daemon_set(self, name: str, namespace: str) -> V1DaemonSet:
        if self.annotations is None or self.reads == 0:
            raise ApiException(status=404, reason="Not Found")
        if self.deleted is not None:
            self.reads -= 1
        return V1DaemonSet(metadata=V1ObjectMeta(name=name, namespace=namespace, annotations=self.annotations))

    def delete_namespaced_daemon_set(self, name: str, namespace: str, body: Any) -> None:
        self.deleted = body.propagation_policy


def test_a_helm_installed_daemonset_is_deleted_in_the_foreground_and_waited_for() -> None:
    apps = Apps(HELM)
    assert uninstall.end_daemonset(apps, "mokka", "mokka", "mokka", timeout=5, poll=0) == "gone"
    assert apps.deleted == "Foreground"


@pytest.mark.parametrize(
    "annotations",
    [{}, {**HELM, uninstall.RELEASE_NAME: "other"}, {**HELM, uninstall.RELEASE_NAMESPACE: "kube-system"}],
    ids=["applied-from-helm-template", "another-release", "another-namespace"],
)
def test_a_daemonset_helm_did_not_install_for_this_release_is_left_alone(annotations: dict[str, str]) -> None:
    apps = Apps(annotations)
    outcome = uninstall.end_daemonset(apps, "mokka", "mokka", "mokka", timeout=5, poll=0)
    assert outcome.startswith("left alone: not installed by helm release mokka/mokka")
    assert apps.deleted is None


def test_none_there_is_not_an_error() -> None:
    assert uninstall.end_daemonset(Apps(None), "mokka", "mokka", "mokka", timeout=5, poll=0) == "not there"


def test_pods_that_do_not_end_are_one_line() -> None:
    with pytest.raises(uninstall.UninstallError, match=r"^daemonset mokka/mokka: its pods did not end within 0\.05s$"):
        uninstall.end_daemonset(Apps(HELM, reads=10**9), "mokka", "mokka", "mokka", timeout=0.05, poll=0.01)


def test_outside_a_cluster_it_says_so_in_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    rc = uninstall.main(["--release", "mokka", "--namespace", "mokka", "--daemonset", "mokka"])
    err = capsys.readouterr().err
    assert rc == 1 and len(err.strip().splitlines()) == 1 and err.startswith("mokka uninstall: "), err
