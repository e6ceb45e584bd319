"""The Mokka NRI plugin: containers gain the node's mock GPUs at creation.

Three layers, kept apart: the stub (``nri.stub``: socket, mux, ttrpc, registration)
hands ``MokkaPlugin.create_container`` a request's raw bytes; this reads the few fields
a decision depends on (``request``), and answers with bytes encoded once per distinct
input (``answers``, which asks the pure ``decision.decide``; ``reply`` writes them on the
wire: the plugin process never loads betterproto). A container that did not ask
for GPUs is never failed: an internal error yields no changes and a log line. A container
that asked for GPUs the node lacks is refused (``PluginError``). One log line per decision.

A container given GPUs is also listed as a process on them while it runs (``workloads``):
its start is the other event the plugin subscribes to, answered at once and handled after; it
never fails or holds up a container. Its exit is seen by the helper that listed it (a pidfd),
not through containerd's stop event: a container costs the plugin one round trip, two if it
runs and has GPUs.

The process starts light so that it registers within milliseconds: ``warm_up``, run by the
stub once registration is done (or by the first request, if that comes sooner), imports
the decision and loads the node layout.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping

from nri_mokka.log import Logger
from nri_mokka.nri.stub import EVENTS, PluginError, event_mask

# typing is not imported at run time (mypy reads TYPE_CHECKING as true): the plugin starts faster.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpumodel.mig_devices import GpuMig
    from gpumodel.nodelayout import NodeLayout
    from nri_mokka import decision
    from nri_mokka.answers import Answers
    from nri_mokka.mig_view import MigView
    from nri_mokka.request import CreateRequest
    from nri_mokka.state_seq import StateSeq
    from nri_mokka.workloads import Recorder

log = Logger("mokka.plugin")


class MokkaPlugin:
    """Decides at CreateContainer; lists GPU containers as processes from their start (until they
    exit: ``workloads.Helper``). Reads the node layout host setup wrote.

    ``settings`` are the command line's, in the plugin config's keys (``mode``,
    ``excludeNamespaces``, ``cdiDevices``, ``allocator``); a config string from containerd
    overrides them key by key.
    """

    events = event_mask([EVENTS[e] for e in ("CREATE_CONTAINER", "POST_START_CONTAINER")])

    def __init__(self, root: str | os.PathLike[str], settings: Mapping[str, object] | None = None) -> None:
        self.root = os.fspath(root)
        self.settings = dict(settings or {})
        self.config_text = ""
        self.launch_config = ""  # the config containerd gave the plugin it launched (see configure)
        self.runtime = ("", "")
        self.config: decision.Config | None = None
        self.answers: Answers | None = None  # None while no usable layout is staged
        self.layout_gpus = 0
        self.mig: MigView | None = None  # the MIG layout through NVML, where the node has MIG-capable GPUs
        self._seq: StateSeq | None = None  # ... read again when the state's counter moved
        self._seen_seq = 0
        self.warm = False
        self._read: Callable[[bytes], CreateRequest] | None = None  # request.CreateRequest, once warm
        self._note: tuple[CreateRequest, str] | None = None  # the last decision, to be logged
        self._layout_file = f"{self.root}/node.json"  # a plain string: stat() on it per call is cheap
        self._stamp: tuple[int, int] | None = None
        self.layout: NodeLayout | None = None
        self._recorder: Recorder | None = None

    # -- stub interface --

    def configure(self, config: str, runtime_name: str, runtime_version: str) -> None:
        if not config.strip() and self.launch_config:
            config = self.launch_config  # a replacement that dialled: containerd sends it no config
        changed = (config, (runtime_name, runtime_version)) != (self.config_text, self.runtime)
        self.config_text = config
        self.runtime = (runtime_name, runtime_version)
        if self.warm and changed:
            self._apply_config()

    def warm_up(self) -> None:
        """Import what answering needs, load the layout and encode the most common answer."""
        if self.warm:
            return
        from nri_mokka import answers  # noqa: F401  (the decision, gpumodel)
        from nri_mokka.request import CreateRequest

        self._read = CreateRequest
        self.warm = True
        self._apply_config()
        if self.answers is not None:
            self.answers.get(("default", (), (), (), (), ()))
        # What is loaded now lives as long as the process: keep the cyclic collector from
        # walking it again and again while a container waits (and, in the supervisor's copy,
        # from touching pages its forks share).
        gc.collect()
        gc.freeze()

    def create_container(self, payload: bytes) -> bytes:
        if self._read is None:
            self.warm_up()
            assert self._read is not None
        if self._layout_stamp() != self._stamp:
            self._load_layout()
        req = self._read(payload)
        if self._seq is not None and self.answers is not None and self._seq.read() != self._seen_seq:
            # the state changed since the MIG layout was read (MIG reconfigured, or a metric)
            self._seen_seq = self._seq.read()  # read before the layout: a change meanwhile shows next time
            mig = self._mig_now()
            if mig != self.answers.mig:  # reconfigured: answers start afresh
                self.answers = self.answers.for_mig(mig)
        if self.answers is None:
            self._note = (req, "untouched (no node layout)")
            return b""
        answer = self.answers.get(req.key())
        self._note = (req, answer.text)
        if answer.error:
            raise PluginError(answer.error)
        return answer.reply

    def replied(self) -> None:
        """The decision's log line, written once containerd has its answer."""
        if self._note is not None:
            req, text = self._note
            self._note = None
            log.info("%s/%s/%s: %s", req.namespace, req.pod_name, req.container_name(), text)

    def container_event(self, event: int, payload: bytes) -> None:
        """A container started: list it on its GPUs."""
        try:
            self._container_event(event, payload)
        except Exception as exc:  # the container carries on regardless
            log.error("GPU processes: event %d: %s: %s", event, type(exc).__name__, exc)

    def _container_event(self, event: int, payload: bytes) -> None:
        from nri_mokka import workloads

        if event != EVENTS["POST_START_CONTAINER"]:
            return  # the only container event subscribed to
        if self.config is None:
            self.warm_up()
        if self._layout_stamp() != self._stamp:
            self._load_layout()
        c = workloads.Event(payload)
        layout = self.layout
        what = f"{c.name} {c.container_id[:13]}"
        gpus = workloads.gpus_of(c, layout) if layout is not None else []
        if layout is None or not gpus:
            return
        if not c.pid:
            log.info("GPU processes: %s started without a PID in the event; not listed", what)
            return
        if (c.visible or "").strip().lower() == "all":
            # Monitoring agents ask for every GPU (dcgm-exporter, GPU Operator's operands) and
            # hold no CUDA context: real GPUs do not list them either.
            log.info("GPU processes: %s asks for NVIDIA_VISIBLE_DEVICES=all: not listed", what)
            return
        try:
            mib = workloads.memory_mib(c.memory)
        except ValueError as exc:
            mib = workloads.DEFAULT_MEMORY_MIB
            log.error("GPU processes: %s: %s; using %d MiB", what, exc, mib)
        if mib == 0:
            return  # mokka.io/gpu-memory: 0: not a GPU process
        self._send("add", layout, what, [c.pid], {"gpus": gpus, "name": c.process_name(), "mib": mib})

    def _send(self, op: str, layout: NodeLayout, what: str, pids: list[int], extra: dict[str, object]) -> None:
        if self._recorder is None:
            from nri_mokka.workloads import Recorder

            self._recorder = Recorder()
        self._recorder.send({"op": op, "state": layout.state, "what": what, "pids": pids, **extra})

    # -- configuration and layout --

    def _apply_config(self) -> None:
        from nri_mokka import decision

        base = decision.Config.parse(self.settings)
        config = base
        if self.config_text.strip():
            import yaml

            try:
                data = yaml.safe_load(self.config_text) or {}
                if not isinstance(data, dict):
                    raise ValueError("the plugin config must be a mapping")
                config = decision.Config.parse(data, base)
            except (ValueError, yaml.YAMLError) as exc:
                log.error("ignoring invalid plugin config from %s (%s); keeping %s", self.runtime[0], exc, base)
        self.config = config
        self._load_layout()

    def _mig_now(self) -> list[GpuMig]:
        """The node's MIG layout now, as NVML shows it (nothing on a node without MIG)."""
        if self.mig is None:
            return []
        from nri_mokka.mig_view import MigViewError

        try:
            return self.mig.current()
        except MigViewError as exc:
            log.error("MIG layout unreadable: %s", exc)
            return []

    def _layout_stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self._layout_file)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_ino

    def _load_layout(self) -> None:
        """(Re)load node.json and start a fresh answer cache for it."""
        from gpumodel.nodelayout import NodeLayout
        from nri_mokka.answers import Answers, runtime_takes_cdi

        assert self.config is not None
        self._stamp = self._layout_stamp()
        try:
            with open(self._layout_file) as fh:
                layout = NodeLayout.from_json(fh.read())
        except (OSError, ValueError, TypeError, KeyError) as exc:
            self.answers = None
            self.layout = None
            self.layout_gpus = 0
            log.error(
                "no usable node layout at %s (%s): containers pass untouched until "
                "`mokka host setup --root %s` has run",
                self._layout_file,
                exc,
                self.root,
            )
            return
        if self.mig is not None:
            self.mig.close()
        if self._seq is not None:
            self._seq.close()
        self.mig = self._seq = None
        if layout.caps_major is not None:  # MIG-capable GPUs: their MIG layout is live state
            from pathlib import Path

            from nri_mokka.mig_view import MigView, MigViewError
            from nri_mokka.state_seq import StateSeq

            try:
                self._seq = StateSeq(layout.state)
                self._seen_seq = self._seq.read()
                self.mig = MigView(Path(layout.library), Path(layout.state))
            except (MigViewError, OSError, ValueError) as exc:  # MIG devices cannot be named; GPUs still can
                log.error("MIG layout unavailable: %s", exc)
                self.mig = self._seq = None
        self.answers = Answers(layout, self.config, runtime_takes_cdi(*self.runtime), self._mig_now())
        self.layout = layout
        self.layout_gpus = len(layout.gpus)
        log.info(
            "node layout %s: profile %s, %d GPUs; allocator %s",
            self._layout_file,
            layout.profile,
            len(layout.gpus),
            self.config.allocator,
        )
