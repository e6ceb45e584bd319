"""kind's node image, assembled without a registry or Docker, cached by its inputs.

kind's node image contract (kind's ``images/base``): systemd as init behind kind's own
``/usr/local/bin/entrypoint`` (the image's ENTRYPOINT, with ``/sbin/init`` its command), containerd
as ``containerd.service`` with kind's ``config.toml`` and ``cri-base.json``, the kubelet as
``kubelet.service`` with kubeadm's drop-ins, kubeadm, kubelet and kubectl on PATH, the CNI plugins in
``/opt/cni/bin``, ``/kind/version`` naming the Kubernetes version, and the images kubeadm asks for
already in containerd's ``k8s.io`` namespace (kind never pulls them).

What goes in, each a real part:

* Debian bookworm with systemd, dbus, iptables, iproute2, kmod, runc and Debian's CNI plugins,
  installed by Debian's debootstrap (itself from the archive through :mod:`fetch.debcache`;
  the machine's apt sources are never read or changed);
* kind's base-image files (entrypoint, units, containerd config, scripts) from kind's module as the
  Go module proxy serves it, at kind's pinned version (:data:`fetch.versions.KIND_VERSION`);
* Debian's containerd 2.1 (:mod:`fetch.containerd_dist`);
* the project's Kubernetes build (:mod:`fetch.kube.binaries`: the multi-call program as kubelet
  and kubectl, kubeadm built apart with the same version stamp);
* the images kubeadm names (``kubeadm config images list``): kube-apiserver, -controller-manager,
  -scheduler and kube-proxy (one layer: the multi-call program and legacy iptables, four names),
  etcd from Debian, the project's CoreDNS build and pause (``kind/pause.c``, compiled static here),
  imported into the image's ``/var/lib/containerd`` by the same containerd at build time;
* the pod network (``kind/node/mokka-podnet``): kind's kindnetd is not served by the Go module
  proxy, so clusters run with ``networking.disableDefaultCNI`` and this unit configures Debian's
  bridge CNI on each node's podCIDR and routes the other nodes' podCIDRs;
* the host's kernel settings kept (``kind/node/mokka-sysctls``): the settings a kubelet writes at
  start (``kernel.panic``, ``vm.overcommit_memory``, ...) are not namespaced, so each node shadows
  them with plain files in its own mount namespace before its kubelet starts.

``python -m kind.nodeimage`` builds it (once; later runs find it in the cache).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from containers import images as oci
from fetch import containerd_dist, debcache, kubelet_api, versions
from fetch.kube import binaries, gobuild
from fetch.kube import versions as kube_versions

__all__ = ["NODE_IMAGE", "ImageError", "archive_path", "build", "cached", "etcd_image_tag", "inputs"]

HERE = Path(__file__).resolve().parent
NODE_IMAGE = f"localhost/mokka/kind-node:{kube_versions.KUBERNETES}"
SUITE = "bookworm"
# kind's base image's package list, less what kind uses for storage tests and rootless mode
PACKAGES = (
    "systemd", "dbus", "conntrack", "iptables", "iproute2", "ethtool", "util-linux", "mount", "kmod",
    "libseccomp2", "pigz", "bash", "ca-certificates", "jq", "procps", "socat", "runc", "containernetworking-plugins",
)  # fmt: skip
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap", "ptp")
KIND_MODULE = "sigs.k8s.io/kind"
BASE_FILES = "images/base/files"
CONTAINERD_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
UNITS = ("containerd.service", "kubelet.service", "undo-mount-hacks.service", "mokka-podnet.service")
OWN_UNITS = ("mokka-podnet.service", "mokka-sysctls.service")  # kind/node/, this project's
KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy")

# containerd's plugins the build-time import does without (no pods: nothing under /run or /var/run)
PRELOAD_DISABLED = (
    "io.containerd.grpc.v1.cri",
    "io.containerd.cri.v1.images",
    "io.containerd.cri.v1.runtime",
    "io.containerd.nri.v1.nri",
    "io.containerd.podsandbox.controller.v1.podsandbox",
)

Progress = Callable[[str], None]


class ImageError(RuntimeError):
    """The node image cannot be built: a missing part, a failed step (one line)."""


def _run(argv: list[str], what: str, **kw: object) -> str:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    except OSError as exc:
        raise ImageError(f"{what}: {exc}") from None
    if res.returncode != 0:
        lines = [ln for ln in (res.stderr + res.stdout).splitlines() if ln.strip()]
        raise ImageError(f"{what} failed: {lines[-1] if lines else f'exit {res.returncode}'}")
    return str(res.stdout)


def _parts(cache: Path, *, fetch: bool = False) -> dict[str, Path]:
    """The prepared inputs; with ``fetch``, Debian's containerd and debootstrap are fetched when
    missing (never the builds: a missing one names the command that makes it)."""
    kube = binaries.cached(cache)
    kubeadm = gobuild.cached(binaries.KUBEADM, cache)
    if kube is None or kubeadm is None:
        raise ImageError("the Kubernetes build (kubeadm included) is missing: run `.ci/setup --tests`")
    if fetch:
        try:
            containerd = containerd_dist.fetch(kube_versions.CONTAINERD, cache)
            debootstrap = debcache.fetch(SUITE, ["debootstrap"], cache)["debootstrap"]
        except debcache.FetchError as exc:
            raise ImageError(str(exc)) from None
    else:
        suite = versions.CONTAINERD_SUITES[kube_versions.CONTAINERD]
        found = debcache.cached(suite, "containerd", cache)
        boot = debcache.cached(SUITE, "debootstrap", cache)
        containerd = cache / "extract" / (found.stem if found else "-") / "usr/bin"
        if boot is None or not (containerd / "containerd").is_file():
            raise ImageError("Debian's containerd or debootstrap is not fetched: run `.ci/setup --tests`")
        debootstrap = boot
    return {
        "kubernetes": kube.kubernetes / "kubernetes",
        "kubeadm": kubeadm / "kubeadm",
        "coredns": kube.coredns / "coredns",
        "etcd": kube.etcd,
        "containerd": containerd,
        "debootstrap": debootstrap,
    }


def etcd_image_tag(cache: Path | None = None) -> str:
    """The tag of the image's etcd: Debian's upstream version (``3.5.16-0``). kubeadm chooses etcd's
    flags by this tag (3.6's ``--feature-gates`` or 3.5's ``--experimental-*``), so a cluster config
    names it as ``etcd.local.imageTag`` (:func:`kind.provider.cluster_config`)."""
    etcd = _parts(cache or debcache.default_cache())["etcd"]
    return etcd.parents[2].name.split("_")[1].split("-")[0] + "-0"


def inputs(cache: Path | None = None) -> dict[str, str]:
    """What decides the image: every part's version or build key, this module's and the node files' text."""
    cache = cache or debcache.default_cache()
    parts = _parts(cache)
    own = [HERE / "nodeimage.py", HERE / "pause.c", *sorted((HERE / "node").iterdir())]
    return {
        "suite": SUITE,
        "packages": " ".join(PACKAGES),
        "debootstrap": parts["debootstrap"].name,
        "kind": f"{KIND_MODULE}@{versions.KIND_VERSION}",
        "containerd": parts["containerd"].parent.parent.name,
        "kubernetes": parts["kubernetes"].parent.name,
        "kubeadm": parts["kubeadm"].parent.name,
        "coredns": parts["coredns"].parent.name,
        "etcd": parts["etcd"].parents[2].name,
        "sources": hashlib.sha256(b"".join(p.read_bytes() for p in own)).hexdigest(),
    }


def archive_path(cache: Path | None = None) -> Path:
    """Where the node image's OCI archive is (or will be): named by a hash of :func:`inputs`."""
    cache = cache or debcache.default_cache()
    key = hashlib.sha256(json.dumps(inputs(cache), sort_keys=True).encode()).hexdigest()[:12]
    return cache / "kind" / f"node-{kube_versions.KUBERNETES}-{key}.tar"


def cached(cache: Path | None = None) -> Path | None:
    """The node image's archive when it is built already (no network, no build)."""
    path = archive_path(cache)
    return path if path.is_file() else None


def build(cache: Path | None = None, progress: Progress | None = None) -> Path:
    """Build the node image once and return its OCI archive (later calls: at once)."""
    cache = cache or debcache.default_cache()
    say = progress or (lambda _line: None)
    parts = _parts(cache, fetch=True)
    if found := cached(cache):
        return found
    if os.geteuid() != 0:
        raise ImageError("building kind's node image needs root (debootstrap, a private containerd)")
    out = archive_path(cache)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mokka-kind-node-", dir=out.parent) as tmp:
        work = Path(tmp)
        rootfs = work / "rootfs"
        step = _timer(say)
        _debootstrap(rootfs, parts["debootstrap"], cache, work)
        step(f"Debian {SUITE} with systemd (debootstrap)")
        _kind_files(rootfs, cache)
        _systemd(rootfs)
        _programs(rootfs, parts)
        step("kind's base files, containerd, Kubernetes, the pod network")
        archives = _images(rootfs, parts, work / "images", cache)
        _preload(rootfs, archives, parts, work)
        step(f"images preloaded: {', '.join(sorted(n for names in archives.values() for n in names))}")
        tmp_out = out.with_name(out.name + f".tmp{os.getpid()}")
        oci.oci_archive(
            rootfs,
            tmp_out,
            NODE_IMAGE,
            entrypoint=["/usr/local/bin/entrypoint"],
            cmd=["/sbin/init"],
            env=[PATH_ENV, "container=docker"],
        )
        tmp_out.rename(out)
        step(f"{out.name}: {out.stat().st_size / 2**20:.0f} MiB")
        for stale in out.parent.glob(f"node-{kube_versions.KUBERNETES}-*.tar"):
            if stale != out:
                stale.unlink()
    return out


def _timer(say: Progress) -> Callable[[str], None]:
    t = [time.monotonic()]

    def step(what: str) -> None:
        now = time.monotonic()
        say(f"{what} ({now - t[0]:.0f}s)")
        t[0] = now

    return step


def _debootstrap(rootfs: Path, deb: Path, cache: Path, work: Path) -> None:
    """Debian ``SUITE`` (minbase plus :data:`PACKAGES`) into ``rootfs``, in a private mount namespace
    (the /proc and /sys debootstrap mounts in the target go with it)."""
    tool = debcache.extract(deb, work / "debootstrap")
    debs = cache / "kind" / "debootstrap-debs"  # the .debs, kept for the next build
    debs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DEBOOTSTRAP_DIR": str(tool / "usr/share/debootstrap"), "LC_ALL": "C"}
    argv = [
        "unshare", "--mount", "--propagation", "private", "--",
        str(tool / "usr/sbin/debootstrap"), "--variant=minbase", f"--include={','.join(PACKAGES)}",
        f"--keyring={debcache.KEYRING}", f"--cache-dir={debs}", SUITE, str(rootfs), debcache.MIRROR,
    ]  # fmt: skip
    try:
        _run(argv, f"debootstrap {SUITE}", env=env)
    except ImageError as exc:
        log = rootfs / "debootstrap" / "debootstrap.log"
        detail = log.read_text().strip().splitlines()[-1:] if log.is_file() else []
        raise ImageError(f"{exc}{' (' + detail[0] + ')' if detail else ''}") from None
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for f in (rootfs / leftover).glob("*"):
            if f.is_file():
                f.unlink()


def _kind_files(rootfs: Path, cache: Path) -> None:
    """kind's base-image files from kind's module: scripts 0755, the rest 0644 (as kind's Dockerfile)."""
    try:
        module = kubelet_api.download(KIND_MODULE, versions.KIND_VERSION, cache)
    except kubelet_api.GenerateError as exc:
        raise ImageError(str(exc)) from None
    files = module / BASE_FILES
    for src in sorted(files.rglob("*")):
        rel = src.relative_to(files)
        if rel.parts[0] == "LICENSES" or not src.is_file():
            continue
        dest = rootfs / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        executable = rel.parts[:3] == ("usr", "local", "bin") or rel.parts[:2] == ("kind", "bin")
        dest.chmod(0o755 if executable else 0o644)
    (rootfs / "kind").chmod(0o755)
    (rootfs / "kind/version").write_text(kube_versions.KUBERNETES + "\n")
    # Root here lacks CAP_SYS_RESOURCE: runc cannot lower a container's oom_score_adj (the pods ask
    # for -998) and fails every sandbox; restricted, containerd never asks below its own score.
    config = rootfs / "etc/containerd/config.toml"
    text = config.read_text()
    if "restrict_oom_score_adj = false" not in text:
        raise ImageError(f"kind {versions.KIND_VERSION}'s containerd config no longer sets restrict_oom_score_adj")
    config.write_text(text.replace("restrict_oom_score_adj = false", "restrict_oom_score_adj = true"))


def _systemd(rootfs: Path) -> None:
    """Units as kind's base image has them: no units of the distribution's started, journald not
    reading the kernel's ring, containerd, kubelet, kind's mount fix-up and the pod network enabled."""
    lib = rootfs / "usr/lib/systemd/system"
    (lib / "sysinit.target.wants/systemd-tmpfiles-setup.service").unlink(missing_ok=True)
    for wants, pattern in (
        (lib / "multi-user.target.wants", "*"),
        (lib / "local-fs.target.wants", "*"),
        (lib / "sockets.target.wants", "*udev*"),
        (lib / "sockets.target.wants", "*initctl*"),
        (lib / "basic.target.wants", "*"),
        *((d, "*") for d in (rootfs / "etc/systemd/system").glob("*.wants")),
    ):
        for link in wants.glob(pattern):
            link.unlink()
    with (rootfs / "etc/systemd/journald.conf").open("a") as fh:
        fh.write("ReadKMsg=no\n")
    init = rootfs / "sbin/init"
    init.unlink(missing_ok=True)
    init.symlink_to("/usr/lib/systemd/systemd")
    units = rootfs / "etc/systemd/system"
    for unit in OWN_UNITS:
        shutil.copyfile(HERE / "node" / unit, units / unit)
    wants_dir = units / "multi-user.target.wants"
    wants_dir.mkdir(exist_ok=True)
    for unit in UNITS:
        (wants_dir / unit).symlink_to(f"/etc/systemd/system/{unit}")
    requires = units / "kubelet.service.requires"  # no kubelet on the host's kernel settings
    requires.mkdir(exist_ok=True)
    (requires / "mokka-sysctls.service").symlink_to("/etc/systemd/system/mokka-sysctls.service")
    (units / "systemd-binfmt.service").symlink_to("/dev/null")  # binfmt_misc is the host kernel's
    (rootfs / "etc/kubernetes/manifests").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/machine-id").write_text("")


def _programs(rootfs: Path, parts: dict[str, Path]) -> None:
    """containerd (with kind's base runtime spec), the CNI plugins, kubelet/kubectl/kubeadm, the pod network."""
    local = rootfs / "usr/local/bin"
    for name in CONTAINERD_BINARIES:
        shutil.copy2(parts["containerd"] / name, local / name)
    spec = json.loads(_run([str(parts["containerd"] / "ctr"), "oci", "spec"], "ctr oci spec"))
    spec.setdefault("hooks", {}).setdefault("createContainer", []).append({"path": "/kind/bin/mount-product-files.sh"})
    spec["process"].pop("rlimits", None)
    (rootfs / "etc/containerd/cri-base.json").write_text(json.dumps(spec, indent=2) + "\n")
    cni = rootfs / "opt/cni/bin"
    cni.mkdir(parents=True, exist_ok=True)
    for plugin in CNI_PLUGINS:
        if not (rootfs / "usr/lib/cni" / plugin).is_file():
            raise ImageError(f"Debian's containernetworking-plugins has no {plugin}")
        (cni / plugin).symlink_to(f"/usr/lib/cni/{plugin}")
    usr_bin = rootfs / "usr/bin"
    shutil.copy2(parts["kubernetes"], usr_bin / "kubernetes")
    for name in ("kubelet", "kubectl"):
        (usr_bin / name).symlink_to("kubernetes")
    shutil.copy2(parts["kubeadm"], usr_bin / "kubeadm")
    for script in ("mokka-podnet", "mokka-sysctls"):
        shutil.copy2(HERE / "node" / script, local / script)


def _wanted_images(kubeadm: Path, rootfs: Path) -> dict[str, str]:
    """``{role: image}`` kubeadm wants at this version, and the pause image containerd's config names."""
    listed = _run([str(kubeadm), "config", "images", "list", f"--kubernetes-version={kube_versions.KUBERNETES}"],
                  "kubeadm config images list").split()  # fmt: skip
    wanted: dict[str, str] = {}
    for image in listed:
        role = image.rsplit("/", 1)[-1].split(":", 1)[0]
        wanted[role] = image
    missing = {*KUBE_COMMANDS, "etcd", "coredns", "pause"} - set(wanted)
    if missing:
        raise ImageError(f"kubeadm config images list named no {', '.join(sorted(missing))}")
    for line in (rootfs / "etc/containerd/config.toml").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "sandbox_image":
            wanted["sandbox"] = value.strip().strip('"')
    return wanted


def _images(rootfs: Path, parts: dict[str, Path], out: Path, cache: Path) -> dict[Path, list[str]]:
    """The OCI archives of the preloaded images, each with every name it goes by."""
    wanted = _wanted_images(parts["kubeadm"], rootfs)
    out.mkdir(parents=True)
    archives: dict[Path, list[str]] = {}

    # kube-apiserver, -controller-manager, -scheduler, kube-proxy: one program, legacy iptables
    # (kind's entrypoint picks legacy in a fresh network namespace; kube-proxy must write the same)
    kube = oci.make_rootfs(out / "kube-rootfs", cache=cache)
    bin_dir = kube / "usr/local/bin"
    bin_dir.mkdir(parents=True)
    shutil.copy2(parts["kubernetes"], bin_dir / "kubernetes")
    for name in KUBE_COMMANDS:
        (bin_dir / name).symlink_to("kubernetes")
    legacy = rootfs / "usr/sbin/xtables-legacy-multi"
    shutil.copy2(legacy, kube / "usr/sbin/xtables-legacy-multi")
    for tool in ("iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"):
        (kube / "usr/sbin" / tool).symlink_to("xtables-legacy-multi")
    modules = Path("usr/lib/x86_64-linux-gnu/xtables")
    shutil.copytree(rootfs / modules, kube / modules, symlinks=True)
    libs = [rootfs / p for p in ("usr/lib/x86_64-linux-gnu/libxtables.so.12", "usr/lib/x86_64-linux-gnu/libip4tc.so.2",
                                 "usr/lib/x86_64-linux-gnu/libip6tc.so.2")]  # fmt: skip
    for lib in libs:
        shutil.copy2(lib, kube / lib.relative_to(rootfs))
    oci.make_rootfs(kube, programs=[legacy, *sorted((rootfs / modules).glob("*.so"))], cache=cache)
    names = [wanted[c] for c in KUBE_COMMANDS]
    archives[oci.oci_archive(kube, out / "kube.tar", names[0], cmd=[])] = names

    # Debian's etcd is 3.5: named by its own version (kubeadm's default tag names 3.6)
    etcd_name = wanted["etcd"].rsplit(":", 1)[0] + ":" + etcd_image_tag(cache)
    etcd = oci.make_rootfs(out / "etcd-rootfs", programs=[parts["etcd"]], cache=cache)
    (etcd / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(parts["etcd"], etcd / "usr/local/bin/etcd")
    archives[oci.oci_archive(etcd, out / "etcd.tar", etcd_name, cmd=["etcd"])] = [etcd_name]

    dns = out / "coredns-rootfs"
    (dns / "etc").mkdir(parents=True)
    shutil.copy2(parts["coredns"], dns / "coredns")
    (dns / "etc/passwd").write_text("root:x:0:0:root:/root:/sbin/nologin\n")
    archives[oci.oci_archive(dns, out / "coredns.tar", wanted["coredns"], entrypoint=["/coredns"], cmd=[])] = [
        wanted["coredns"]
    ]

    pause = out / "pause-rootfs"
    pause.mkdir()
    _run(["cc", "-static", "-Os", "-Wall", "-Wextra", "-Werror", "-o", str(pause / "pause"), str(HERE / "pause.c")],
         "cc pause.c")  # fmt: skip
    pause_names = sorted({wanted["pause"], wanted.get("sandbox", wanted["pause"])})
    archives[oci.oci_archive(pause, out / "pause.tar", pause_names[0], entrypoint=["/pause"], cmd=[], env=[])] = (
        pause_names
    )
    return archives


def _preload(rootfs: Path, archives: dict[Path, list[str]], parts: dict[str, Path], work: Path) -> None:
    """Import ``archives`` into the image's ``/var/lib/containerd`` (namespace ``k8s.io``, unpacked
    for overlayfs, as kind loads images) with Debian's containerd 2.1 run privately: its own
    socket and state, a private mount namespace with a fresh /run, no CRI, no NRI."""
    state = work / "containerd-state"
    sock = work / "containerd.sock"
    config = work / "containerd.toml"
    config.write_text(
        "version = 3\n"
        f'root = "{rootfs}/var/lib/containerd"\nstate = "{state}"\n'
        f"disabled_plugins = {json.dumps(PRELOAD_DISABLED)}\n"
        f'[grpc]\n  address = "{sock}"\n[ttrpc]\n  address = "{sock}.ttrpc"\n'
    )
    ctr = f"{parts['containerd']}/ctr -a {sock} -n k8s.io"
    lines = ["set -e", "mount -t tmpfs tmpfs /run", f"{parts['containerd']}/containerd --config {config} "
             f">{work}/containerd.log 2>&1 &", "pid=$!", "trap 'kill $pid; wait $pid || true' EXIT",
             f"for i in $(seq 100); do [ -S {sock} ] && break; sleep 0.1; done"]  # fmt: skip
    for archive, names in archives.items():
        lines.append(f"{ctr} images import --snapshotter overlayfs --local {archive} >/dev/null")
        lines += [f"{ctr} images tag {names[0]} {name} >/dev/null" for name in names[1:]]
    lines.append(f"{ctr} images ls -q")
    script = work / "preload.sh"
    script.write_text("\n".join(lines) + "\n")
    try:
        listed = _run(["unshare", "--mount", "--propagation", "private", "--", "sh", str(script)], "preloading images")
    except ImageError as exc:
        log = (
            (work / "containerd.log").read_text().strip().splitlines()[-3:]
            if (work / "containerd.log").exists()
            else []
        )
        raise ImageError(f"{exc} ({' | '.join(log)})") from None
    missing = {n for names in archives.values() for n in names} - set(listed.split())
    if missing:
        raise ImageError(f"containerd did not list {', '.join(sorted(missing))} after the import")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kind.nodeimage", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--cache", type=Path, default=None, help="cache directory (default: $MOKKA_CACHE or ~/.cache/mokka)"
    )
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        found = cached(args.cache)
        path = found or build(args.cache, progress=lambda line: print(f"kind node image: {line}", file=sys.stderr))
    except (ImageError, OSError) as exc:
        print(f"kind.nodeimage: error: {exc}", file=sys.stderr)
        return 1
    state = "cached" if found else f"built in {time.monotonic() - t0:.0f}s"
    print(f"{path} ({state})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
