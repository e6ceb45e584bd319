"""The injection decision, a pure function: every rule without containerd."""

from __future__ import annotations

import pytest

from gpumodel import edits, nodelayout, profile
from nri_mokka.decision import Config, Container, decide


@pytest.fixture(scope="module")
def layout() -> nodelayout.NodeLayout:
    devices = profile.load("h100").devices()
    return nodelayout.NodeLayout(
        root="/var/lib/mokka",
        profile="h100",
        driver_version="550.163.01",
        libdir="/var/lib/mokka/driver/usr/lib64",
        state="/var/lib/mokka/driver/usr/lib64/libnvidia-ml.so.550.163.01",
        dev_root="/var/lib/mokka/dev",
        gpu_major=195,
        uvm_major=510,
        gpus=tuple(nodelayout.GpuNode(d.index, d.uuid, d.bus_id, d.index) for d in devices),
        nvidia_smi="/var/lib/mokka/driver/usr/bin/nvidia-smi",
        sysfs_shim=None,
    )


def ctr(**kw: object) -> Container:
    base: dict[str, object] = {"name": "app", "pod_name": "pod", "pod_namespace": "default"}
    base.update(kw)
    return Container(**base)  # type: ignore[arg-type]


def gpu_nodes(d: object) -> list[str]:
    assert d.edits is not None  # type: ignore[attr-defined]
    return [n.path for n in d.edits.device_nodes if n.path[len("/dev/nvidia") :].isdigit()]  # type: ignore[attr-defined]


def test_default_gets_every_gpu(layout: nodelayout.NodeLayout) -> None:
    d = decide(ctr(), layout, Config())
    assert [g.index for g in d.gpus] == list(range(8))
    assert gpu_nodes(d) == [f"/dev/nvidia{i}" for i in range(8)]
    env = d.edits.env_dict() if d.edits else {}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"  # by index, as docker run --gpus names them
    assert "MOKKA_STATE" not in env  # the library carries the state: nothing else to find
    assert all(m.options == edits.READ_ONLY for m in (d.edits.mounts if d.edits else ()))
    assert {m.container_path for m in (d.edits.mounts if d.edits else ())} >= {
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/bin/nvidia-smi",
    }


def test_same_edits_as_the_cdi_path(layout: nodelayout.NodeLayout) -> None:
    d = decide(ctr(pod_annotations={"mokka.io/gpus": "1,3"}), layout, Config())
    assert d.edits == edits.container_edits(layout, [layout.gpus[1], layout.gpus[3]])


def test_opt_out_and_excluded_namespace(layout: nodelayout.NodeLayout) -> None:
    assert decide(ctr(pod_annotations={"mokka.io/inject": "false"}), layout, Config()).edits is None
    assert decide(ctr(pod_namespace="kube-system"), layout, Config()).edits is None
    d = decide(ctr(pod_namespace="monitoring"), layout, Config(exclude_namespaces=frozenset({"monitoring"})))
    assert d.edits is None and "monitoring" in d.reason


def test_opt_in_mode(layout: nodelayout.NodeLayout) -> None:
    assert decide(ctr(), layout, Config(mode="opt-in")).edits is None
    d = decide(ctr(pod_annotations={"mokka.io/inject": "true"}), layout, Config(mode="opt-in"))
    assert len(d.gpus) == 8


def test_subset_by_annotation_index_and_uuid(layout: nodelayout.NodeLayout) -> None:
    d = decide(ctr(pod_annotations={"mokka.io/gpus": f"5, {layout.gpus[2].uuid}"}), layout, Config())
    assert [g.index for g in d.gpus] == [2, 5]
    assert gpu_nodes(d) == ["/dev/nvidia2", "/dev/nvidia5"]


def test_unknown_gpu_fails_closed(layout: nodelayout.NodeLayout) -> None:
    d = decide(ctr(pod_annotations={"mokka.io/gpus": "9"}), layout, Config())
    assert d.error and "'9'" in d.error and "8 mock GPUs" in d.error
    d = decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": "GPU-nope"}), layout, Config())
    assert d.error and "GPU-nope" in d.error
    d = decide(ctr(device_paths=["/dev/nvidia12"]), layout, Config())
    assert d.error and "/dev/nvidia12" in d.error


def test_device_plugin_env_allocation(layout: nodelayout.NodeLayout) -> None:
    d = decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": "1,3"}), layout, Config())
    assert [g.index for g in d.gpus] == [1, 3]
    assert d.edits is not None and d.edits.device_nodes == ()
    assert "NVIDIA_VISIBLE_DEVICES" not in d.edits.env_dict()  # the container's own value stays
    assert {m.container_path for m in d.edits.mounts} >= {"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"}


def test_visible_devices_special_values(layout: nodelayout.NodeLayout) -> None:
    assert decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": "void"}), layout, Config()).edits is None
    assert decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": ""}), layout, Config()).edits is None
    d = decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": "none"}), layout, Config())
    assert d.gpus == () and d.edits is not None and d.edits.mounts
    assert len(decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": "all"}), layout, Config()).gpus) == 8


def test_existing_device_nodes_allocation(layout: nodelayout.NodeLayout) -> None:
    d = decide(ctr(device_paths=["/dev/nvidia4", "/dev/nvidiactl", "/dev/fuse"]), layout, Config())
    assert [g.index for g in d.gpus] == [4]
    assert d.edits is not None and d.edits.device_nodes == ()


def test_cdi_requests_are_left_to_the_runtime(layout: nodelayout.NodeLayout) -> None:
    d = decide(ctr(annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=1"}), layout, Config())
    assert d.edits is None and "CDI" in d.reason
    # other vendors' CDI devices do not count as a GPU allocation
    d = decide(ctr(annotations={"cdi.k8s.io/net": "example.com/nic=0"}), layout, Config())
    assert len(d.gpus) == 8


def test_config_parse() -> None:
    cfg = Config.parse({"mode": "opt-in", "excludeNamespaces": ["a", "b"]})
    assert cfg.mode == "opt-in" and cfg.exclude_namespaces == frozenset({"a", "b"})
    with pytest.raises(ValueError, match="unknown"):
        Config.parse({"mdoe": "all"})
    with pytest.raises(ValueError, match="mode"):
        Config.parse({"mode": "some"})


def test_summary_names_the_container(layout: nodelayout.NodeLayout) -> None:
    c = ctr(pod_annotations={"mokka.io/gpus": "0"})
    line = decide(c, layout, Config()).summary(c)
    assert line.startswith("default/pod/app: GPUs 0") and "device nodes" in line


def test_cdi_device_references(layout: nodelayout.NodeLayout) -> None:
    cfg = Config(cdi_devices=True)
    d = decide(ctr(pod_annotations={"mokka.io/gpus": "1,3"}), layout, cfg)
    assert d.cdi_devices == ("nvidia.com/gpu=1", "nvidia.com/gpu=3")
    # a container's own allocation is never turned into references
    assert decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": "2"}), layout, cfg).cdi_devices == ()
    assert decide(ctr(), layout, Config()).cdi_devices == ()
    assert Config.parse({"cdiDevices": True}).cdi_devices is True


# ---- allocator external: a device plugin or DRA driver allocates; Mokka serves what it allocated

EXTERNAL = Config(allocator="external")


def test_external_without_allocation_gets_nothing(layout: nodelayout.NodeLayout) -> None:
    d = decide(ctr(), layout, EXTERNAL)
    assert d.edits is None and "no GPU allocation" in d.reason
    # a Mokka annotation is no allocation either
    assert decide(ctr(pod_annotations={"mokka.io/gpus": "0"}), layout, EXTERNAL).edits is None


def test_external_envvar_gets_its_gpus_device_nodes(layout: nodelayout.NodeLayout) -> None:
    """Envvar mode (the device plugin set NVIDIA_VISIBLE_DEVICES): exactly those GPUs' nodes,
    the control nodes, library, state, nvidia-smi — the container's variable stays."""
    uuids = f"{layout.gpus[1].uuid},{layout.gpus[3].uuid}"
    d = decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": uuids}), layout, EXTERNAL)
    assert [g.index for g in d.gpus] == [1, 3]
    assert gpu_nodes(d) == ["/dev/nvidia1", "/dev/nvidia3"]
    assert d.edits is not None
    paths = {n.path for n in d.edits.device_nodes}
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"} <= paths
    assert "NVIDIA_VISIBLE_DEVICES" not in d.edits.env_dict()
    assert {m.container_path for m in d.edits.mounts} >= {
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/bin/nvidia-smi",
    }
    same = decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": "1,3"}), layout, EXTERNAL)
    assert same.edits == d.edits  # indices or UUIDs
    assert len(decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": "all"}), layout, EXTERNAL).gpus) == 8


def test_external_envvar_special_values(layout: nodelayout.NodeLayout) -> None:
    for value in ("void", ""):
        assert decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": value}), layout, EXTERNAL).edits is None
    d = decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": "none"}), layout, EXTERNAL)
    assert d.gpus == () and d.edits is not None and gpu_nodes(d) == []
    assert "/dev/nvidiactl" in {n.path for n in d.edits.device_nodes} and d.edits.mounts
    d = decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": "9"}), layout, EXTERNAL)
    assert d.error and "'9'" in d.error


def test_external_device_specs_get_the_rest(layout: nodelayout.NodeLayout) -> None:
    """Device nodes passed by the device plugin: the missing control nodes, mounts and env are added,
    the GPU nodes it passed are not added twice."""
    d = decide(ctr(device_paths=["/dev/nvidia4", "/dev/nvidiactl"]), layout, EXTERNAL)
    assert [g.index for g in d.gpus] == [4]
    assert d.edits is not None
    added = [n.path for n in d.edits.device_nodes]
    assert "/dev/nvidia4" not in added and "/dev/nvidiactl" not in added and "/dev/nvidia-uvm" in added
    assert d.edits.env_dict()["NVIDIA_VISIBLE_DEVICES"] == "4"  # GPU 4 by its index
    d = decide(ctr(device_paths=["/dev/nvidia4"], env={"NVIDIA_VISIBLE_DEVICES": "4"}), layout, EXTERNAL)
    assert d.edits is not None and "NVIDIA_VISIBLE_DEVICES" not in d.edits.env_dict()
    # a CDI spec's "void" (NVIDIA's nvcdi keeps the legacy hook out so): the nodes are the allocation
    d = decide(ctr(device_paths=["/dev/nvidia4"], env={"NVIDIA_VISIBLE_DEVICES": "void"}), layout, EXTERNAL)
    assert d.edits is not None and d.edits.env_dict()["NVIDIA_VISIBLE_DEVICES"] == "4"
    assert decide(ctr(device_paths=["/dev/nvidia12"]), layout, EXTERNAL).error


def test_external_cdi_through_cri_adds_only_the_kernels_view(layout: nodelayout.NodeLayout) -> None:
    """A CDI spec passed through CRI (NVIDIA's DRA driver's claims: no annotation) brought the device
    nodes, the driver and nvidia-smi: nothing of that is added again, nor is its
    ``NVIDIA_VISIBLE_DEVICES`` replaced; only the kernel's view (sysfs shim and trees, kernel log)."""
    import dataclasses

    from gpumodel.edits import kernel_view

    shim, log = "/var/lib/mokka/driver/usr/lib64/libmokka-sysfs.so", "/var/lib/mokka/driver/var/log/kern.log"
    layout = dataclasses.replace(layout, sysfs_shim=shim, kernel_log=log)
    lib = f"/usr/lib64/libnvidia-ml.so.{layout.driver_version}"
    env = {"NVIDIA_VISIBLE_DEVICES": "void"}
    c = ctr(device_paths=["/dev/nvidia4", "/dev/nvidiactl"], env=env, driver_mounts=[lib])
    d = decide(c, layout, EXTERNAL)
    assert [g.index for g in d.gpus] == [4] and d.edits == kernel_view(layout) and lib in d.reason
    assert d.edits.device_nodes == () and "NVIDIA_VISIBLE_DEVICES" not in d.edits.env_dict()
    assert not any("libnvidia-ml" in m.container_path or "nvidia-smi" in m.container_path for m in d.edits.mounts)
    assert {m.container_path for m in d.edits.mounts} >= {"/usr/lib/mokka/libmokka-sysfs.so", "/var/log/kern.log"}
    assert d.edits.env_dict()["LD_PRELOAD"] == "/usr/lib/mokka/libmokka-sysfs.so"
    # without the library (device specs alone) the runtime's part is still Mokka's to add
    d = decide(ctr(device_paths=["/dev/nvidia4"], env=env), layout, EXTERNAL)
    assert d.edits is not None and any("libnvidia-ml" in m.container_path for m in d.edits.mounts)


def test_external_cdi_is_left_to_the_runtime(layout: nodelayout.NodeLayout) -> None:
    """CDI-annotation and CDI-CRI modes: the runtime applied the spec before the plugin runs."""
    d = decide(ctr(annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=1"}), layout, EXTERNAL)
    assert d.edits is None and "CDI" in d.reason
    # the device plugin's own CDI kind: its spec put the device nodes there already
    d = decide(
        ctr(annotations={"cdi.k8s.io/dp": "k8s.device-plugin.nvidia.com/gpu=GPU-x"}, device_paths=["/dev/nvidia1"]),
        layout,
        EXTERNAL,
    )
    assert d.edits is None and "CDI" in d.reason
    # another vendor's CDI device does not hide a GPU allocation
    d = decide(
        ctr(annotations={"cdi.k8s.io/net": "example.com/nic=0"}, env={"NVIDIA_VISIBLE_DEVICES": "2"}),
        layout,
        EXTERNAL,
    )
    assert [g.index for g in d.gpus] == [2]


def test_external_ignores_namespace_rules_but_honours_opt_out(layout: nodelayout.NodeLayout) -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "0"}
    assert len(decide(ctr(pod_namespace="kube-system", env=env), layout, EXTERNAL).gpus) == 1
    assert len(decide(ctr(env=env), layout, Config(allocator="external", mode="opt-in")).gpus) == 1
    d = decide(ctr(env=env, pod_annotations={"mokka.io/inject": "false"}), layout, EXTERNAL)
    assert d.edits is None and "opted out" in d.reason


def test_config_parse_allocator() -> None:
    assert Config.parse({"allocator": "external"}).allocator == "external"
    assert Config.parse({}).allocator == "nri"
    base = Config(allocator="external", mode="opt-in")
    assert Config.parse({"cdiDevices": True}, base) == Config(allocator="external", mode="opt-in", cdi_devices=True)
    with pytest.raises(ValueError, match="allocator"):
        Config.parse({"allocator": "kubelet"})


def test_nri_mode_is_unchanged_by_the_external_rules(layout: nodelayout.NodeLayout) -> None:
    # today's standalone rules: a device plugin's variable keeps its value and gets no device nodes
    d = decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": "1"}), layout, Config(allocator="nri"))
    assert d.edits is not None and d.edits.device_nodes == ()


def test_the_mig_configuration_capability_brings_the_nodes_proc_modules(layout: nodelayout.NodeLayout) -> None:
    """Every GPU container gets Mokka's OCI hook showing it the driver's procfs; one asking for the
    MIG configuration capability (NVIDIA's MIG manager) also /proc/modules and the state's library
    writable; a node staged without the hook, no hook; rendered as NRI's create_container hook."""
    from dataclasses import replace

    from nri_mokka import reply
    from nri_mokka.nri._pb.nri.pkg.api import v1alpha1 as api

    hooked = replace(layout, proc_hook="/var/lib/mokka/lib/mokka-proc-hook")
    external = Config(allocator="external")
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_MIG_CONFIG_DEVICES": "all"}
    d = decide(ctr(env=env), hooked, external)
    assert d.edits is not None and gpu_nodes(d) == [f"/dev/nvidia{i}" for i in range(8)]
    args = ("mokka-proc-hook", "--driver", "/var/lib/mokka/proc/driver")
    args += ("--proc", "modules=/var/lib/mokka/proc/modules")
    link = ("--link", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1=libnvidia-ml.so.550.163.01")
    assert d.edits.hooks == (edits.Hook(hooked.proc_hook, args + link),)
    assert "NVIDIA_MIG_CONFIG_DEVICES: the state writable, the node's /proc/modules" in d.describe()
    library = [m for m in d.edits.mounts if m.host_path == hooked.state]
    assert [m.container_path for m in library] == ["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.163.01"]
    assert library[0].options == edits.WRITABLE  # .so.1: the hook's link to it
    assert all(m.options == edits.READ_ONLY for m in d.edits.mounts if m.host_path != hooked.state)
    adjust = api.ContainerAdjustment().parse(reply.adjustment(d.edits))
    assert [(h.path, h.args) for h in adjust.hooks.create_container] == [(hooked.proc_hook, list(args + link))]
    assert decide(ctr(env=env), hooked, Config()).edits.hooks  # Mokka allocating: the same  # type: ignore[union-attr]
    driver_only = (edits.Hook(hooked.proc_hook, args[:3] + link),)  # every GPU container: the driver's procfs
    plain = decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": "all"}), hooked, external)
    assert plain.edits is not None and plain.edits.hooks == driver_only
    assert all(m.options == edits.READ_ONLY for m in plain.edits.mounts)
    for value in ("", "void", "none"):
        mine = decide(ctr(env={**env, "NVIDIA_MIG_CONFIG_DEVICES": value}), hooked, external)
        assert mine.edits is not None and mine.edits.hooks == driver_only, value
    assert decide(ctr(env=env), layout, external).edits.hooks == ()  # no hook staged  # type: ignore[union-attr]
    assert decide(ctr(env={"NVIDIA_MIG_CONFIG_DEVICES": "all"}), hooked, external).edits is None  # no GPUs asked
