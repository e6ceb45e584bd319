"""``kind`` with ``KIND_EXPERIMENTAL_PROVIDER=podman`` on a private podman, in private network and
mount namespaces, so that nothing kind or podman does reaches the host.

What this machine's kind of host needs (Debian 12, cgroup v1 hybrid, root without
CAP_SYS_RESOURCE, open files capped at 20000, no ``/lib/modules``, no Docker):

* podman's runtime is bookworm's runc (Debian's crun 1.8 refuses hybrid cgroups), named in a
  private ``CONTAINERS_CONF`` with cgroupfs, file locks, no events, and default ulimits
  ``nofile=20000:20000`` and ``nproc=32768:32768`` (podman's own defaults ask for more than root
  may set);
* Debian's podman 4.3 uses CNI, whose containers resolve each other's names (kind's nodes join
  ``<cluster>-control-plane:6443``) only through the dnsname plugin, which runs dnsmasq: bookworm's
  plugin and dnsmasq (and the libnftables it links, which this machine lacks) come from Debian's
  archive (:func:`dns_tools`) and are given to podman as a plugin directory, PATH and library path;
* podman's state (storage root, run root, volumes, CNI network configs, temporary files) lives
  under the environment's directory; its overlay mounts, the ``kind`` network's bridge, the CNI
  plugins' iptables chains, IP forwarding and the node containers' network namespaces live in the
  namespaces of a holder process (``unshare --net --mount``, :mod:`localcluster.namespace`), which
  also shows kind an empty ``/lib/modules`` (kind always bind-mounts it), a fresh ``/run`` and
  private ``/var/lib/cni`` and ``/var/lib/containers``; everything is run through ``nsenter`` into
  them, kubectl and kind included (the API server is published on the namespace's loopback);
* :meth:`KindEnvironment.close` removes the containers, volumes and network still there, ends the
  namespaces, removes the cgroups podman made and the directory.

:func:`host_state` and :meth:`KindEnvironment.leftovers` are how a caller proves that nothing
was left: the host network namespace's links, addresses, routes, iptables chains and forwarding
sysctls unchanged, no process, mount or cgroup of the environment.

One file, though long: the set-up, every command run in the environment and the clean-up with its
proof share one holder process, one directory and one podman configuration, which nothing else uses.

By hand (root, from the checkout, after ``.ci/setup --tests``)::

    python -m kind.provider up /tmp/mk        # 1 control plane + 3 workers, Ready (about 40 s)
    python -m kind.provider run /tmp/mk -- kubectl get nodes -o wide
    python -m kind.provider down /tmp/mk      # kind delete cluster, then the proof
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from containers import cleanup
from fetch import containerd_dist, debcache
from kind.relay import Relay, RelayError

__all__ = [
    "KindEnvironment",
    "ProviderError",
    "cluster_config",
    "create",
    "dns_tools",
    "dns_tools_cached",
    "host_state",
]

ULIMITS = ("nofile=20000:20000", "nproc=32768:32768")
CNI_PLUGIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins, podman 4.3's CNI backend
PODMAN_CGROUP_PARENT = "libpod_parent"  # where podman's cgroupfs manager puts containers and conmon
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/forwarding",
    "net/ipv6/conf/all/forwarding",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "net/netfilter/nf_conntrack_max",  # kube-proxy's conntrack sizing (kind turns it off)
    # what a kubelet writes at start; not namespaced: the nodes shadow them (kind/node/mokka-sysctls)
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
CALL_TIMEOUT = 120.0
SUITE = "bookworm"
# package: (what it is kept for, relative to its unpacked root)
DNS_PACKAGES = {
    "golang-github-containernetworking-plugin-dnsname": "usr/lib/cni",
    "dnsmasq-base": "usr/sbin",
    "libnftables1": "usr/lib/x86_64-linux-gnu",
}


class ProviderError(RuntimeError):
    """The private podman/kind environment could not be set up, driven or cleaned up (one line)."""


def _quiet(argv: Sequence[str]) -> str:
    res = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    return res.stdout if res.returncode == 0 else ""


def dns_tools(cache: Path | None = None) -> dict[str, Path]:
    """The directories of the dnsname CNI plugin, dnsmasq and libnftables (package: directory),
    fetched from Debian once and unpacked into the cache."""
    found: dict[str, Path] = {}
    try:
        debs = debcache.fetch(SUITE, list(DNS_PACKAGES), cache)
        for package, keep in DNS_PACKAGES.items():
            found[package] = debcache.unpacked(debs[package], Path(keep), cache, keep=[Path(keep)])
    except debcache.FetchError as exc:
        raise ProviderError(f"podman's DNS for kind's nodes: {exc}") from None
    return found


def dns_tools_cached(cache: Path | None = None) -> bool:
    """Whether :func:`dns_tools` would need no network."""
    extract = (cache or debcache.default_cache()) / "extract"
    return all(any(extract.glob(f"{p}_*/{keep}")) for p, keep in DNS_PACKAGES.items())


def _netns_members(inode: int) -> list[int]:
    """Processes whose network namespace is ``inode``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(entry / "ns/net").st_ino == inode:
                    found.append(int(entry.name))
    return found


def host_state() -> dict[str, object]:
    """What the host looks like to a cluster: its network namespace's links, addresses, routes,
    iptables chains (legacy and nft, v4 and v6) and forwarding sysctls, and the kernel's global
    settings a node's kubelet and kube-proxy write (``/proc/sys`` of this process's namespaces)."""
    chains: dict[str, list[str]] = {}
    for tool in ("iptables-legacy-save", "ip6tables-legacy-save", "iptables-nft-save", "ip6tables-nft-save"):
        if shutil.which(tool):
            # chain names and rules, without the packet counters
            chains[tool] = sorted(
                line.split(" [", 1)[0] for line in _quiet([tool]).splitlines() if line[:1] in (":", "-", "*")
            )
    sysctls = {}
    for key in SYSCTLS:
        with contextlib.suppress(OSError):
            sysctls[key] = Path("/proc/sys", key).read_text().strip()
    return {
        "links": sorted(line.split(":")[1].strip().split("@")[0] for line in _quiet(["ip", "-o", "link"]).splitlines()),
        "addresses": sorted(" ".join(line.split()[1:4]) for line in _quiet(["ip", "-o", "addr"]).splitlines()),
        "routes": sorted(_quiet(["ip", "route", "show", "table", "all"]).splitlines()),
        "iptables": chains,
        "sysctls": sysctls,
    }


class KindEnvironment:
    """A private podman (state under ``base``) in private namespaces, and kind, kubectl run there."""

    def __init__(self, base: Path, kind: Path, kubectl: Path, cache: Path | None = None) -> None:
        self.base = base.absolute()
        self.kind_binary = kind
        self.kubectl_binary = kubectl
        self.cache = cache
        self.holder: subprocess.Popen[bytes] | None = None
        self.holder_pid = 0
        self.netns = 0  # inode of the private network namespace
        self.dns: dict[str, Path] = {}
        self.container_ids: set[str] = set()
        self.relays: list[Relay] = []
        self.owned = False  # whether start() made self.base (close() touches nothing otherwise)
        self.had_podman_cgroup = any(cleanup.cgroup_dirs(PODMAN_CGROUP_PARENT))

    # ---- set-up --------------------------------------------------------------------------

    def start(self) -> None:
        """Write podman's private configuration and start the namespace holder."""
        if self.base.exists() and any(self.base.iterdir()):
            raise ProviderError(f"{self.base} exists and is not empty")
        self.owned = True
        for tool in ("podman", "unshare", "nsenter", "ip"):
            if shutil.which(tool) is None:
                raise ProviderError(f"{tool} is not on PATH")
        try:
            runc = containerd_dist.runc(self.cache)
        except debcache.FetchError as exc:
            raise ProviderError(f"bookworm's runc: {exc}") from None
        self.dns = dns_tools(self.cache)
        cni_dirs = [CNI_PLUGIN_DIR, str(self.dns["golang-github-containernetworking-plugin-dnsname"])]
        b = self.base
        for sub in ("run/netns", "cni", "containers", "modules", "tmp", "net", "home", "storage", "runroot"):
            (b / sub).mkdir(parents=True, exist_ok=True)
        (b / "containers.conf").write_text(
            "[containers]\n"
            f"default_ulimits = {json.dumps(list(ULIMITS))}\n"
            'log_driver = "k8s-file"\n'
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\nevents_logger = "none"\nlock_type = "file"\nruntime = "runc"\n'
            f'tmp_dir = "{b}/tmp"\nstatic_dir = "{b}/storage/libpod"\nvolume_path = "{b}/storage/volumes"\n'
            f'image_copy_tmp_dir = "{b}/tmp"\n'
            "[engine.runtimes]\n"
            f'runc = ["{runc}"]\n'
            "[network]\n"
            f'network_backend = "cni"\nnetwork_config_dir = "{b}/net"\ncni_plugin_dirs = {json.dumps(cni_dirs)}\n'
        )
        (b / "storage.conf").write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{b}/storage"\nrunroot = "{b}/runroot"\n'
        )
        view = {
            "binds": [
                [str(b / "run"), "/run"],
                [str(b / "cni"), "/var/lib/cni"],
                [str(b / "containers"), "/var/lib/containers"],
                [str(b / "modules"), "/lib/modules"],
            ]
        }
        (b / "namespace.json").write_text(json.dumps(view))
        ready = b / "holder" / "ready"
        ready.parent.mkdir()
        log = (b / "holder" / "log").open("wb")
        self.holder = subprocess.Popen(  # its own session: it outlives a `up` command line
            ["unshare", "--net", "--mount", "--propagation", "private", "--",
             sys.executable, "-m", "localcluster.namespace", str(b / "namespace.json"), str(ready)],
            stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parent.parent, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not ready.exists():
            if self.holder.poll() is not None or time.monotonic() > deadline:
                why = (b / "holder" / "log").read_text().strip().splitlines()[-1:] or ["no answer in 30s"]
                raise ProviderError(f"the namespace holder did not start: {why[0]}")
            time.sleep(0.05)
        self.holder_pid = int(json.loads(ready.read_text())["pid"])
        self.netns = os.stat(f"/proc/{self.holder_pid}/ns/net").st_ino
        self.run(["ip", "link", "set", "lo", "up"])

    # ---- running things in there -----------------------------------------------------------

    def env(self) -> dict[str, str]:
        b = self.base
        return {
            "PATH": f"{self.dns['dnsmasq-base']}:" + os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "LD_LIBRARY_PATH": str(self.dns["libnftables1"]),
            "HOME": str(b / "home"),
            "CONTAINERS_CONF": str(b / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(b / "storage.conf"),
            "KIND_EXPERIMENTAL_PROVIDER": "podman",
            "KUBECONFIG": str(b / "kubeconfig"),
            "TMPDIR": str(b / "tmp"),
        }

    def run(
        self,
        argv: Sequence[str | Path],
        *,
        timeout: float = CALL_TIMEOUT,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` in the holder's network and mount namespaces with the private podman's environment."""
        if not self.holder_pid:
            raise ProviderError("the environment is not started")
        cmd = ["nsenter", f"--target={self.holder_pid}", "--mount", "--net", "--", *map(str, argv)]
        try:
            res = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, check=False, env={**self.env(), **(env or {})}
            )
        except subprocess.TimeoutExpired:
            raise ProviderError(f"{' '.join(map(str, argv[:3]))}: no answer within {timeout:g}s") from None
        if check and res.returncode != 0:
            lines = [ln for ln in (res.stderr + res.stdout).splitlines() if ln.strip()]
            raise ProviderError(f"{' '.join(map(str, argv[:3]))}: exit {res.returncode}: {lines[-1] if lines else ''}")
        return res

    def podman(self, *args: str, timeout: float = CALL_TIMEOUT, check: bool = True) -> str:
        return self.run(["podman", *args], timeout=timeout, check=check).stdout

    def kind(self, *args: str, timeout: float = 600.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run([self.kind_binary, *args], timeout=timeout, check=check)

    def kubectl(self, *args: str, timeout: float = CALL_TIMEOUT, check: bool = True) -> str:
        return self.run([self.kubectl_binary, *args], timeout=timeout, check=check).stdout

    def load_image(self, archive: Path, name: str) -> None:
        """``podman load`` an OCI archive into the private storage under ``name``."""
        out = self.podman("load", "--input", str(archive), timeout=600)
        if name not in self.podman("images", "--format", "{{.Repository}}:{{.Tag}}").split():
            loaded = out.strip().rsplit(" ", 1)[-1]
            self.podman("tag", loaded, name)

    def host_kubeconfig(self, out: Path) -> Path:
        """kind's kubeconfig, written to ``out`` with its current cluster's API server reached through a
        :class:`~kind.relay.Relay` on the host's loopback: helm, kubectl and the kubernetes client
        on the host use it as they would a kind cluster's on a user's machine. :meth:`close` ends the relay."""
        import yaml

        try:
            config = yaml.safe_load((self.base / "kubeconfig").read_text())
            context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
            cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
        except (OSError, yaml.YAMLError, KeyError, TypeError, StopIteration) as exc:
            raise ProviderError(f"{self.base / 'kubeconfig'}: no current cluster ({exc!r})") from None
        server = urlsplit(cluster["cluster"]["server"])
        if server.port is None or server.hostname is None:
            raise ProviderError(f"{self.base / 'kubeconfig'}: the server {server.geturl()} names no port")
        relay = Relay(Path(f"/proc/{self.holder_pid}/ns/net"), server.port, server.hostname)
        try:
            port = relay.start()
        except RelayError as exc:
            raise ProviderError(str(exc)) from None
        self.relays.append(relay)
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
        out.write_text(yaml.safe_dump(config, sort_keys=False))
        out.chmod(0o600)
        return out

    def record_containers(self) -> set[str]:
        """The full ids of the podman containers there now (kept for :meth:`leftovers`)."""
        ids = set(self.podman("ps", "--all", "--no-trunc", "--format", "{{.ID}}").split())
        self.container_ids |= ids
        return ids

    # ---- tear-down and proof ---------------------------------------------------------------

    def close(self) -> list[str]:
        """Remove whatever podman still has, end the namespaces, remove podman's cgroups and the
        directory; the problems met (empty when all went)."""
        problems: list[str] = []
        for relay in self.relays:
            relay.close()
        self.relays.clear()
        if not self.owned:
            return problems
        if self.holder_pid:
            with contextlib.suppress(ProviderError):
                self.record_containers()
            for args in (
                ("rm", "--all", "--force", "--volumes", "--time", "0"),
                ("volume", "prune", "--force"),
                ("network", "rm", "--force", "kind"),
            ):
                with contextlib.suppress(ProviderError):
                    self.podman(*args, check=False)
        self._stop_holder()
        # conmon, dnsmasq and the containers' processes, should any have outlived podman rm
        members = _netns_members(self.netns) if self.netns else []
        for pid in members:
            cleanup.kill(pid)
        cleanup.wait_gone(members, 10)
        marks = [str(self.base)]
        if left := cleanup.wait_gone(cleanup.processes(marks, within=True), 10):
            for pid in left:
                cleanup.kill(pid)
            cleanup.wait_gone(left, 10)
        for d in self._podman_cgroups():
            cleanup.rmdir_cgroup(d, problems)
        if not self.had_podman_cgroup:  # podman made it for us; another podman may use it now
            for d in cleanup.cgroup_dirs(PODMAN_CGROUP_PARENT):
                with contextlib.suppress(OSError):
                    d.rmdir()
        for mount in cleanup.mounts_under(self.base):
            try:
                cleanup.unmount(mount)
            except Exception as exc:
                problems.append(str(exc))
        if self.base.exists():
            cleanup.remove_tree(self.base, problems)
        self.holder_pid = 0
        return problems

    def _stop_holder(self) -> None:
        """End the namespace holder (started here, or by an earlier process: :meth:`load`)."""
        if self.holder is not None:
            self.holder.send_signal(signal.SIGTERM)
            try:
                self.holder.wait(15)
            except subprocess.TimeoutExpired:
                self.holder.kill()
                self.holder.wait()
        elif self.holder_pid:
            cleanup.kill(self.holder_pid, signal.SIGTERM)
            if cleanup.wait_gone([self.holder_pid], 15):
                cleanup.kill(self.holder_pid)
                cleanup.wait_gone([self.holder_pid], 5)

    def save(self, **extra: object) -> None:
        """Write what :meth:`load` needs (and ``extra``) to ``base/state.json``."""
        state = {
            "holder_pid": self.holder_pid,
            "netns": self.netns,
            "container_ids": sorted(self.container_ids),
            "had_podman_cgroup": self.had_podman_cgroup,
            "kind": str(self.kind_binary),
            "kubectl": str(self.kubectl_binary),
            **extra,
        }
        (self.base / "state.json").write_text(json.dumps(state, indent=1))

    @classmethod
    def load(cls, base: Path, cache: Path | None = None) -> tuple[KindEnvironment, dict[str, Any]]:
        """The environment an earlier process started under ``base`` (``up``), and its saved state."""
        try:
            state = json.loads((base / "state.json").read_text())
        except (OSError, ValueError) as exc:
            raise ProviderError(f"{base}: no environment started there ({exc})") from None
        env = cls(base, Path(state["kind"]), Path(state["kubectl"]), cache)
        env.holder_pid, env.netns = int(state["holder_pid"]), int(state["netns"])
        env.container_ids = set(state["container_ids"])
        env.had_podman_cgroup = bool(state["had_podman_cgroup"])
        env.dns = dns_tools(cache)
        env.owned = True
        if not Path(f"/proc/{env.holder_pid}").exists():
            raise ProviderError(f"{base}: its namespace holder ({env.holder_pid}) is gone: `down` cleans up")
        return env, state

    def _podman_cgroups(self) -> list[Path]:
        """Cgroup directories (any hierarchy) named after one of this environment's containers."""
        if not self.container_ids:
            return []
        return [d for d in cleanup.cgroup_dirs(PODMAN_CGROUP_PARENT) if any(i in d.name for i in self.container_ids)]

    def leftovers(self) -> list[str]:
        """What this environment left on the host: processes, mounts, cgroups, its directory."""
        found = [
            f"process {pid}: {' '.join(argv)[:200]}"
            for pid, argv in cleanup.processes([str(self.base)], within=True).items()
            if not cleanup.zombie(pid)
        ]
        if self.holder_pid and not cleanup.zombie(self.holder_pid):
            found.append(f"process {self.holder_pid}: the namespace holder")
        if self.netns:
            found += [f"process {pid}: in the private network namespace" for pid in _netns_members(self.netns)]
        found += [f"mount {m}" for m in cleanup.mounts_under(self.base)]
        with open("/proc/self/mountinfo") as fh:
            found += [f"mount {line.split()[4]}" for line in fh if str(self.base) in line and line.split()[4]
                      not in {str(m) for m in cleanup.mounts_under(self.base)}]  # fmt: skip
        found += [f"cgroup {d}" for d in self._podman_cgroups()]
        if self.base.exists():
            found.append(f"directory {self.base}")
        return found


def cluster_config(source: Path, image: str, etcd_tag: str) -> str:
    """``source`` (a kind cluster config: kind/cluster-containerd-2.yaml) with every node on ``image``,
    kind's default CNI off (kindnetd is not built here: the node image brings its own pod network)
    and kubeadm told the tag of the image's etcd (it picks etcd's flags by it)."""
    import yaml

    try:
        config = yaml.safe_load(source.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ProviderError(f"{source}: {exc}") from None
    if not isinstance(config, dict) or not isinstance(config.get("nodes"), list):
        raise ProviderError(f"{source}: not a kind cluster config with nodes")
    for node in config["nodes"]:
        node["image"] = image
    config.setdefault("networking", {})["disableDefaultCNI"] = True
    patch = f"kind: ClusterConfiguration\netcd:\n  local:\n    imageTag: {etcd_tag}\n"
    config["kubeadmConfigPatches"] = [*config.get("kubeadmConfigPatches", []), patch]
    return str(yaml.safe_dump(config, sort_keys=False))


USAGE = """\
python -m kind.provider up DIR [--name NAME] [--config FILE]   kind create cluster (nodes Ready), kept
python -m kind.provider run DIR -- COMMAND...                  COMMAND in its namespaces (kubectl, kind, podman on PATH)
python -m kind.provider down DIR                               kind delete cluster, clean up, prove nothing is left"""


def create(base: Path, name: str, config: Path) -> tuple[KindEnvironment, float]:
    """kind cluster ``name`` of kind config ``config`` (its nodes on the node image built here) in a
    new environment under ``base``, every node Ready; the environment, and the seconds from
    ``kind create cluster`` to every node Ready. On a failure the environment is closed."""
    from fetch import prepare, versions
    from fetch.kube import binaries
    from kind import nodeimage

    kube = binaries.cached()
    image = nodeimage.cached()
    if kube is None or image is None:
        raise ProviderError(f"the Kubernetes build or kind's node image is missing: {prepare.HOW}")
    base.mkdir(parents=True, exist_ok=True)
    env = KindEnvironment(base, prepare.go_binary(versions.KIND), kube.kubernetes / "kubectl")
    try:
        env.start()
        env.load_image(image, nodeimage.NODE_IMAGE)
        (base / "cluster.yaml").write_text(cluster_config(config, nodeimage.NODE_IMAGE, nodeimage.etcd_image_tag()))
        t0 = time.monotonic()
        env.kind("create", "cluster", "--name", name, "--config", str(base / "cluster.yaml"))
        env.record_containers()
        env.kubectl("wait", "--for=condition=Ready", "node", "--all", "--timeout=300s", timeout=320)
        return env, time.monotonic() - t0
    except BaseException:
        env.close()
        raise


def _up(base: Path, name: str, config: Path) -> int:
    before = host_state()
    t0 = time.monotonic()
    env, _ = create(base, name, config)
    env.save(name=name, host=before)
    print(env.kubectl("get", "nodes").rstrip())
    print(f"cluster {name} up in {time.monotonic() - t0:.0f}s; `python -m kind.provider run {base} -- kubectl ...`")
    return 0


def _run(base: Path, command: list[str]) -> int:
    env, _state = KindEnvironment.load(base)
    path = f"{env.kind_binary.parent}:{env.kubectl_binary.parent}:{env.env()['PATH']}"
    res = env.run(command, check=False, timeout=3600, env={"PATH": path})
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    return res.returncode


def _down(base: Path) -> int:
    if not base.is_dir():
        raise ProviderError(f"{base}: no environment there")
    state: dict[str, Any]
    try:
        env, state = KindEnvironment.load(base)
    except ProviderError:  # its holder is gone (a reboot, a kill): clean up what is left
        state = json.loads((base / "state.json").read_text()) if (base / "state.json").is_file() else {}
        env = KindEnvironment(base, Path(state.get("kind", "kind")), Path(state.get("kubectl", "kubectl")))
        env.owned, env.netns = base.is_dir(), int(state.get("netns", 0))
        env.container_ids = set(state.get("container_ids", []))
    else:
        env.kind("delete", "cluster", "--name", str(state["name"]), timeout=300)
    problems = env.close() + env.leftovers()
    before = state.get("host")
    if isinstance(before, dict):
        after = host_state()
        problems += [f"host network changed: {k}" for k in before if before[k] != after[k]]
    if problems:
        raise ProviderError("; ".join(problems))
    print(f"{base}: deleted; no process, mount, cgroup or directory left, the host's network unchanged")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] not in ("up", "run", "down") or (args[0] == "run" and "--" not in args):
        print(USAGE, file=sys.stderr)
        return 2
    base = Path(args[1]).absolute()
    try:
        if args[0] == "up":
            opts = dict(zip(args[2::2], args[3::2], strict=False))
            unknown = set(opts) - {"--name", "--config"}
            if unknown or len(args[2:]) % 2:
                print(USAGE, file=sys.stderr)
                return 2
            repo = Path(__file__).resolve().parent
            return _up(
                base, opts.get("--name", "mokka"), Path(opts.get("--config", repo / "cluster-containerd-2.yaml"))
            )
        if args[0] == "run":
            return _run(base, args[args.index("--") + 1 :])
        return _down(base)
    except Exception as exc:  # every failure is one line here, never a traceback
        print(f"kind.provider: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
