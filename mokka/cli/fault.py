"""`mokka fault ...`: inject faults into a live mock node, list and clear them, replay scenarios."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .root import fail, main

if TYPE_CHECKING:
    from gpumodel.faults import Target

# A fault's fields, named as the command line names them (for one-line errors).
OPTION_NAMES = {
    "code": "CODE",
    "celsius": "CELSIUS",
    "watts": "WATTS",
    "gpu": "GPU%",
    "memory": "MEM",
    "sm": "SM",
    "link": "LINK",
    "start": "--from",
    "over_s": "--over",
}


def _target(
    root: Path | None, driver_root: Path | None, state_file: Path | None, node: str | None, cluster_dir: Path
) -> Target:
    from gpumodel import faults

    chosen = [o for o in (driver_root, state_file, node) if o is not None]
    if len(chosen) > 1 or (chosen and root is not None):
        fail("give one of --root, --driver-root, --state and --node, --root")
    if node is not None:
        root = _cluster_node_root(node, cluster_dir)
    try:
        if driver_root is not None:
            return faults.for_driver_root(driver_root)
        if state_file is not None:
            return faults.for_state(state_file)
        from hostsetup.node import DEFAULT_ROOT

        return faults.for_root(root or DEFAULT_ROOT)
    except faults.FaultError as exc:
        fail(str(exc))
    raise AssertionError("unreachable")


def _cluster_node_root(node: str, cluster_dir: Path) -> Path:
    """The staged mock node of node ``node`` of the local cluster under ``cluster_dir``."""
    from localcluster.cluster import Cluster, ClusterError

    try:
        return Cluster.load(cluster_dir).node(node).layout.node_root
    except ClusterError as exc:
        fail(f"{exc}, --node {node} --cluster-dir {cluster_dir}")
    raise AssertionError("unreachable")


def _virtual_cluster(node: str, cluster_dir: Path) -> Any:
    """The local cluster under ``cluster_dir`` when ``node`` is one of its virtual nodes, else None."""
    from localcluster.addons.virtualpools import find
    from localcluster.cluster import Cluster, ClusterError

    try:
        c = Cluster.load(cluster_dir)
    except ClusterError:
        return None  # the real node's path says what is wrong
    return c if find(c.pools, node) is not None else None


def _virtual_fault(c: Any, node: str, gpu: str | None, kind: str, fields: dict[str, Any]) -> None:
    """Fault ``kind`` on virtual node ``node``: a step added to its entry in the cluster's fault
    ConfigMap, which the fleet controller shows as a real node's watchers would; returns once it has."""
    import yaml

    from gpumodel import faults, scenario
    from localcluster.addons.virtualpools import find, read_fault, write_fault
    from localcluster.cluster import ClusterError
    from virtualfleet.faults import fault_effect, health_of, node_gpus

    pool = find(c.pools, node)
    assert pool is not None
    available = node_gpus(pool.profile, pool.product, pool.gpus, node)  # chosen as on a real node
    try:
        indices = [g.index for g in faults.select(available, gpu)]
        effect, why = fault_effect(kind, fields)
    except (faults.FaultError, ValueError) as exc:
        fail(f"{exc}, --node {node}")
        return
    if effect == "unchanged" and kind == "xid":  # an application Xid: nothing any watcher shows
        for i in indices:
            click.echo(f"GPU {i}: {why}")
        return
    try:
        rack, old = read_fault(c, node)
        first = [(f"fault entry {rack[0]}", rack[1])] if rack else []
        before = health_of([*first, *([(f"fault entry {node}", old)] if old else [])], available)
        steps = (yaml.safe_load(old) or {}).get("steps", []) if old else []
        value = {k: v for k, v in fields.items() if k != "kind" and v is not None}
        steps.append({"gpu": indices, kind: value})
        entry = yaml.safe_dump({"name": f"mokka fault on {node}", "steps": steps}, sort_keys=False)
        mine = health_of([(f"fault entry {node}", entry)], available)
        after = health_of([*first, (f"fault entry {node}", entry)], available)
        write_fault(c, node, entry if mine else None, after)
    except ClusterError as exc:
        fail(f"{exc}, --node {node} --cluster-dir {c.layout.base}")
        return
    except (scenario.ScenarioError, faults.FaultError, ValueError, AttributeError, yaml.YAMLError) as exc:
        # an entry someone else wrote that is not a scenario: say so, change nothing
        fail(f"{str(exc).splitlines()[0]}; fix or remove it (kubectl edit configmap), --node {node}")
        return
    for key in map(str, indices):
        was = key in before.unhealthy or key in before.findings or key in before.probing
        click.echo(f"GPU {key}: {_virtual_gpu_line(after, key, was)}")


def _virtual_gpu_line(health: Any, i: str, was_faulty: bool) -> str:
    """What virtual GPU ``i`` shows under ``health``, in one line: the device plugin's view, the
    node health agent's findings, the fabric probe."""
    shown = [f"unhealthy ({health.unhealthy[i]})"] if i in health.unhealthy else []
    shown += [f"AcceleratedHardwareReady=False {reason} ({message})" for reason, message in health.findings.get(i, [])]
    if i in health.probing:
        shown.append("no clique label while its fabric probe reads In Progress")
    if shown:
        return "; ".join(shown)
    return "healthy again" if was_faulty else "healthy"


def cluster_node_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--node / --cluster-dir: a node of the local cluster."""
    fn = click.option(
        "--cluster-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default="/run/mokka-cluster",
        show_default=True,
        help="With --node: the local cluster's --dir.",
    )(fn)
    return click.option(
        "--node",
        default=None,
        metavar="NAME",
        help="A node of the local cluster (`mokka cluster up`; its names: `mokka cluster status`): only that "
        "node changes.",
    )(fn)


def where_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--root / --driver-root / --state / --node: which node's state to change."""
    fn = cluster_node_options(fn)
    fn = click.option(
        "--state",
        "state_file",
        type=click.Path(path_type=Path),
        default=None,
        help="A state file, or a library carrying one (what MOKKA_STATE names).",
    )(fn)
    fn = click.option(
        "--driver-root",
        type=click.Path(path_type=Path),
        default=None,
        help="A driver root made by `mokka driver-root --out DIR`.",
    )(fn)
    return click.option(
        "--root",
        type=click.Path(path_type=Path),
        default=None,
        help="The node staged by `mokka host setup` (default /var/lib/mokka; reads its node.json).",
    )(fn)


def gpu_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--gpu", "gpu", default=None, metavar="INDEX|UUID", help="The GPU (or a comma-separated list); default: all."
    )(fn)


def inject(kind: str) -> Callable[[Callable[..., dict[str, Any]]], Callable[..., None]]:
    """Turn a function returning a fault's fields into a command that applies that fault."""

    def wrap(build: Callable[..., dict[str, Any]]) -> Callable[..., None]:
        @functools.wraps(build)
        def command(root: Path | None, driver_root: Path | None, state_file: Path | None, node: str | None,
                    cluster_dir: Path, gpu: str | None, **kwargs: Any) -> None:  # fmt: skip
            from pydantic import TypeAdapter, ValidationError

            from gpumodel import faults
            from gpumodel import faultspec as fs

            try:
                fault = TypeAdapter[Any](fs.Fault).validate_python({"kind": kind, **build(**kwargs)})
            except ValidationError as exc:
                err = exc.errors()[0]
                field = next((str(p) for p in reversed(err["loc"]) if isinstance(p, str) and p != kind), "")
                where = OPTION_NAMES.get(field, f"--{field}") if field else kind
                fail(f"{kind}: {err['msg'].removeprefix('Value error, ')}, {where}")
            if node is not None and (virtual_cluster := _virtual_cluster(node, cluster_dir)) is not None:
                _virtual_fault(virtual_cluster, node, gpu, kind, fault.model_dump())
                return
            target = _target(root, driver_root, state_file, node, cluster_dir)
            try:
                chosen = faults.select(faults.gpus(target), gpu)
                results = faults.apply(target, [(chosen, fault)])
            except faults.FaultError as exc:
                fail(str(exc))
            for r in results:
                click.echo(f"GPU {r.gpu}: {r.note}")

        return gpu_option(where_options(command))

    return wrap


@main.group()
def fault() -> None:
    """Inject faults into a live mock node: every NVML consumer (containers too) sees them at its
    next call, event sets wake at once. Faults stay until `clear` (or host cleanup).

    \b
      mokka fault xid 79 --gpu 3            Xid 79: GPU 3 fell off the bus
      mokka fault temperature 95 --gpu 0    95 C: thermal slowdown reasons follow
      mokka fault ecc --uncorrected 1       a DBE: Xid 48, a row remap pending
      mokka fault list                      what is in effect
      mokka fault clear --all               back to the profile
      mokka fault run thermal-runaway       replay a scenario (`mokka fault scenarios`)
    """


def _duration(value: str | None) -> float | None:
    if value is None:
        return None
    from gpumodel.scenario import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        fail(f"{exc}, --over")
    raise AssertionError("unreachable")


@fault.command("xid")
@click.argument("code", type=int)
@click.option("--message", default=None, help="The text after the code (default: the driver's for this Xid).")
@click.option("--pid", type=int, default=None, help="Attribute it to this process id.")
@click.option("--process", default=None, help="That process's name.")
@inject("xid")
def xid(code: int, message: str | None, pid: int | None, process: str | None) -> dict[str, Any]:
    """An Xid: NVML Xid event (eventData = CODE) and the driver's kernel log line. 79 = lost."""
    return {"code": code, "message": message, "pid": pid, "process": process}


@fault.command("lost")
@inject("lost")
def lost() -> dict[str, Any]:
    """The GPU falls off the bus (Xid 79): NVML answers GPU_IS_LOST, nvidia-smi "GPU is lost"."""
    return {}


@fault.command("ecc")
@click.option("--corrected", type=int, default=0, help="Corrected (single-bit) errors to add.")
@click.option("--uncorrected", type=int, default=0, help="Uncorrected (double-bit) errors to add.")
@click.option("--volatile", "counter", flag_value="volatile", help="Count them in the volatile counters only.")
@click.option("--aggregate", "counter", flag_value="aggregate", help="Only in the aggregate counters (no events).")
@click.option(
    "--location",
    type=click.Choice(["dram", "sram", "l1", "l2", "register_file", "texture", "texture_shm", "cbu"]),
    default="dram",
    show_default=True,
    help="Where the errors happened (NVML's memory locations; DRAM errors are the ones that remap rows).",
)
@inject("ecc")
def ecc(corrected: int, uncorrected: int, counter: str | None, location: str) -> dict[str, Any]:
    """ECC errors; uncorrected DRAM errors also remap a row (or retire a page) with Xid 48/63."""
    return {"corrected": corrected, "uncorrected": uncorrected, "counter": counter or "both", "location": location}


@fault.command("remap")
@click.option("--correctable", type=int, default=0, help="Rows remapped for correctable errors.")
@click.option("--uncorrectable", type=int, default=0, help="Rows remapped for uncorrectable errors.")
@click.option("--pending/--no-pending", default=None, help="A remap waits for a reset (default: when rows added).")
@click.option("--failure", is_flag=True, help="Remapping failed (Xid 64).")
@inject("remap")
def remap(correctable: int, uncorrectable: int, pending: bool | None, failure: bool) -> dict[str, Any]:
    """Remapped rows (Ampere and later)."""
    return {"correctable": correctable, "uncorrectable": uncorrectable, "pending": pending, "failure": failure}


@fault.command("retire")
@click.option("--sbe", type=int, default=0, help="Pages retired for multiple single-bit errors.")
@click.option("--dbe", type=int, default=0, help="Pages retired for double-bit errors.")
@click.option("--pending/--no-pending", default=None, help="Retirement waits for a reload (default: when added).")
@inject("retire")
def retire(sbe: int, dbe: int, pending: bool | None) -> dict[str, Any]:
    """Retired pages (boards before Ampere)."""
    return {"sbe": sbe, "dbe": dbe, "pending": pending}


@fault.command("temperature")
@click.argument("celsius", type=int)
@click.option("--memory", type=int, default=None, help="Memory temperature (C).")
@click.option("--from", "start", type=int, default=None, help="Ramp from this temperature (default: the profile's).")
@click.option("--over", default=None, help="Ramp duration (30s, 2m, ...); without it the change is immediate.")
@inject("temperature")
def temperature(celsius: int, memory: int | None, start: int | None, over: str | None) -> dict[str, Any]:
    """GPU temperature; crossing the slowdown and max operating thresholds sets the thermal reasons."""
    return {"celsius": celsius, "memory": memory, "from": start, "over_s": _duration(over)}


@fault.command("power")
@click.argument("watts", type=float)
@click.option("--from", "start", type=float, default=None, help="Ramp from this draw (default: the profile's).")
@click.option("--over", default=None, help="Ramp duration (30s, 2m, ...).")
@inject("power")
def power(watts: float, start: float | None, over: str | None) -> dict[str, Any]:
    """Power draw; at or above the enforced limit the SW power cap reason is set."""
    return {"watts": watts, "from": start, "over_s": _duration(over)}


@fault.command("power-limit")
@click.argument("watts", type=float)
@inject("power-limit")
def power_limit(watts: float) -> dict[str, Any]:
    """The power limit (current and enforced), within the board's min/max."""
    return {"watts": watts}


@fault.command("utilization")
@click.argument("gpu_percent", metavar="GPU%", type=int)
@click.argument("memory_percent", metavar="[MEM%]", type=int, required=False)
@click.option("--from", "start", type=int, default=None, help="Ramp GPU% from this value.")
@click.option("--over", default=None, help="Ramp duration (30s, 2m, ...).")
@inject("utilization")
def utilization(gpu_percent: int, memory_percent: int | None, start: int | None, over: str | None) -> dict[str, Any]:
    """GPU (and memory) utilization."""
    return {"gpu": gpu_percent, "memory": memory_percent, "from": start, "over_s": _duration(over)}


@fault.command("clocks")
@click.argument("sm", type=int)
@click.argument("mem", metavar="[MEM]", type=int, required=False)
@inject("clocks")
def clocks(sm: int, mem: int | None) -> dict[str, Any]:
    """Current SM (and graphics) clock, and memory clock, in MHz."""
    return {"sm": sm, "memory": mem}


@fault.command("nvlink")
@click.argument("link", type=int)
@click.argument("action", type=click.Choice(["down", "up", "errors"]))
@click.option("--crc", type=int, default=0, help="With `errors`: CRC errors to add.")
@click.option("--replay", type=int, default=0, help="With `errors`: replay errors to add.")
@click.option("--recovery", type=int, default=0, help="With `errors`: recovery errors to add.")
@gpu_option
@where_options
@click.pass_context
def nvlink(ctx: click.Context, /, **kwargs: Any) -> None:
    """`LINK down` (Xid 74) / `LINK up`, or `LINK errors --crc N --replay N --recovery N`."""
    action = kwargs.pop("action")
    counts = {k: kwargs.pop(k) for k in ("crc", "replay", "recovery")}
    if action != "errors" and any(counts.values()):
        fail(f"--crc, --replay and --recovery go with `nvlink LINK errors`, not `{action}`, nvlink")
    if action == "errors":
        ctx.invoke(_nvlink_errors, **kwargs, **counts)
    else:
        ctx.invoke(_nvlink_state, **kwargs, state=action)


@inject("nvlink")
def _nvlink_state(link: int, state: str) -> dict[str, Any]:
    return {"link": link, "state": state}


@inject("nvlink-errors")
def _nvlink_errors(link: int, crc: int, replay: int, recovery: int) -> dict[str, Any]:
    return {"link": link, "crc": crc, "replay": replay, "recovery": recovery}


@fault.command("fabric")
@click.argument("state", type=click.Choice(["degraded", "in-progress", "healthy"]))
@inject("fabric")
def fabric(state: str) -> dict[str, Any]:
    """The GPUs' NVLink fabric as the fabric manager reports it: `degraded` (the health mask says
    bandwidth degraded, as after an NVSwitch failure; GFD keeps the clique label), `in-progress`
    (the probe reads In Progress, as while the rack's fabric manager trains the fabric again; GFD
    drops the clique label), `healthy` (the profile's again). Boards with an NVLink fabric only."""
    return {"state": state}


@fault.command("clear")
@click.option("--all", "everything", is_flag=True, help="Also the persistent record (aggregate ECC, rows, pages).")
@inject("clear")
def clear(everything: bool) -> dict[str, Any]:
    """Undo faults: what a GPU reset undoes; --all restores the profile's values entirely."""
    return {"all": everything}


@fault.command("list")
@where_options
def list_(
    root: Path | None, driver_root: Path | None, state_file: Path | None, node: str | None, cluster_dir: Path
) -> None:
    """What is in effect on each GPU, and its recent events."""
    from gpumodel import faults

    if node is not None and (virtual_cluster := _virtual_cluster(node, cluster_dir)) is not None:
        from gpumodel import scenario
        from localcluster.addons.virtualpools import find, read_fault
        from localcluster.cluster import ClusterError
        from virtualfleet.faults import health_of, node_gpus

        pool = find(virtual_cluster.pools, node)
        assert pool is not None
        try:
            rack, entry = read_fault(virtual_cluster, node)
        except ClusterError as exc:
            fail(f"{exc}, --node {node}")
            return
        entries = ([(f"fault entry {rack[0]}", rack[1])] if rack else []) + (
            [(f"fault entry {node}", entry)] if entry else []
        )
        gpus = node_gpus(pool.profile, pool.product, pool.gpus, node)
        try:
            health = health_of(entries, gpus)
        except (scenario.ScenarioError, faults.FaultError, ValueError) as exc:
            fail(f"{str(exc).splitlines()[0]}; fix or remove it (kubectl edit configmap), --node {node}")
            return
        faulty = sorted({*health.unhealthy, *health.findings, *health.probing}, key=int)
        click.echo(
            "\n".join(f"GPU {i}:\n  {_virtual_gpu_line(health, i, True)}" for i in faulty) or "no faults in effect"
        )
        return
    target = _target(root, driver_root, state_file, node, cluster_dir)
    try:
        active = faults.active(target)
    except faults.FaultError as exc:
        fail(str(exc))
    if not active:
        click.echo("no faults in effect")
    for index, lines in sorted(active.items()):
        click.echo(f"GPU {index}:")
        for line in lines:
            click.echo(f"  {line}")


@fault.command("scenarios")
def scenarios() -> None:
    """The shipped scenarios."""
    from gpumodel import scenario

    for name in scenario.builtin_names():
        s = scenario.load(name)
        click.echo(f"{name}: {s.description}")


@fault.command("run")
@click.argument("scenario_name", metavar="SCENARIO")
@click.option("--speed", type=click.FloatRange(min=0.001, max=100_000), default=1.0, show_default=True,
              help="Run the timeline (and its ramps) this many times faster.")  # fmt: skip
@click.option("--seed", type=click.IntRange(min=0), default=None, help="Override the scenario's seed.")
@click.option("--dry-run", is_flag=True, help="Print the timeline; change nothing.")
@where_options
def run(
    scenario_name: str,
    speed: float,
    seed: int | None,
    dry_run: bool,
    root: Path | None,
    driver_root: Path | None,
    state_file: Path | None,
    node: str | None,
    cluster_dir: Path,
) -> None:
    """Replay SCENARIO (a shipped name or a YAML file) against the node, deterministically."""
    from gpumodel import faults, scenario

    try:
        s = scenario.load(scenario_name)
    except scenario.ScenarioError as exc:
        fail(str(exc))
    target = _target(root, driver_root, state_file, node, cluster_dir)
    try:
        if dry_run:
            events = s.timeline(faults.gpus(target), seed)
            scenario.check(target, events, s.source)
            for e in events:
                click.echo(scenario.describe(e))
            return
        scenario.run(target, s, speed=speed, seed=seed, report=lambda line: click.echo(line))
    except (scenario.ScenarioError, faults.FaultError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail("interrupted; the faults applied so far stay (mokka fault list / clear)", 130)
