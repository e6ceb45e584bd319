"""NRI transport: mux and ttrpc framing and envelopes, the field-level wire reader, the lazy
request reader, and the conformance of Mokka's .proto and tables with NRI's official ones.

The conformance tests compile NRI's official api.proto and ttrpc's request/status protos
(Debian's golang-github-containerd-nri-dev and -ttrpc-dev, fetched into the private cache)
and google.rpc.Status (googleapis-common-protos) with grpcio-tools' protoc, at test time,
and check every message of nri_mokka/nri/proto/ against them: field by field, and by
encoding with one side and decoding with the other, in both directions. The hand-written
parts (the envelopes, the method tables, the field numbers the request reader uses) are
checked against the same files and against betterproto's encoding.
"""

from __future__ import annotations

import importlib
import random
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import betterproto
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message as PbMessage

from fetch import debcache
from gpumodel import edits
from nri_mokka import decision, reply, request
from nri_mokka.nri import gen, mux, stub, ttrpc, wire
from nri_mokka.nri._pb import ttrpc as pb_ttrpc
from nri_mokka.nri._pb.nri.pkg.api import v1alpha1 as pb_api

# --------------------------------------------------------------------------- mux


def test_frames_of_a_20k_message_are_at_most_4096_bytes() -> None:
    data = random.Random(1).randbytes(20_000)
    trunk = mux.encode_frames(2, data)
    frames = mux.FrameDecoder().feed(trunk)
    assert len(frames) == 5
    assert [c for c, _ in frames] == [2] * 5
    assert [len(p) for _, p in frames] == [4096] * 4 + [20_000 - 4 * 4096]
    assert b"".join(p for _, p in frames) == data
    assert len(trunk) == 20_000 + 5 * 8


def test_frame_header_is_big_endian() -> None:
    assert mux.encode_frames(1, b"abc") == bytes.fromhex("00000001 00000003") + b"abc"
    assert mux.encode_frames(1, b"") == b""
    with pytest.raises(ValueError):
        mux.encode_frames(0, b"x")


def _pieces(data: bytes, rng: random.Random) -> Iterator[bytes]:
    i = 0
    while i < len(data):
        n = rng.choice([1, 2, 3, 7, 8, 9, 10, 11, 100, 4095, 4096, 4097, 10_000, 70_000])
        yield data[i : i + n]
        i += n


def test_frame_decoder_reassembles_across_arbitrary_reads() -> None:
    rng = random.Random(2)
    messages = [(1 + i % 2, rng.randbytes(rng.choice([0, 1, 10, 4096, 5000, 20_000]))) for i in range(40)]
    trunk = b"".join(mux.encode_frames(conn, data) for conn, data in messages)
    for seed in range(5):
        decoder = mux.FrameDecoder()
        frames = [f for piece in _pieces(trunk, random.Random(seed)) for f in decoder.feed(piece)]
        assert decoder.pending == 0
        for conn in (1, 2):
            got = b"".join(p for c, p in frames if c == conn)
            assert got == b"".join(d for c, d in messages if c == conn)


def test_frame_decoder_rejects_oversized_frames() -> None:
    decoder = mux.FrameDecoder()
    assert decoder.feed(struct.pack(">II", 1, 1 << 24)) == []  # the limit itself is allowed
    with pytest.raises(mux.MuxError):
        mux.FrameDecoder().feed(struct.pack(">II", 1, (1 << 24) + 1))


# --------------------------------------------------------------------------- ttrpc framing


def test_ttrpc_message_header() -> None:
    assert ttrpc.encode_message(1, 1, 0, b"abc") == bytes.fromhex("00000003 00000001 01 00") + b"abc"
    assert ttrpc.encode_message(0x01020305, 2, 4, b"") == bytes.fromhex("00000000 01020305 02 04")
    with pytest.raises(ValueError):
        ttrpc.encode_message(1, 1, 0, bytes(ttrpc.MAX_MESSAGE + 1))


def test_ttrpc_decoder_reassembles_across_arbitrary_reads() -> None:
    rng = random.Random(5)
    sizes = [0, 5, 4096, 9000, 65_537, 300_000, 2_000_000]  # large ones are collected piece by piece
    sent = [ttrpc.Message(2 * i + 1, 1 + i % 3, i % 8, rng.randbytes(rng.choice(sizes))) for i in range(30)]
    stream = b"".join(ttrpc.encode_message(m.stream_id, m.type, m.flags, m.payload) for m in sent)
    for seed in range(3):
        decoder = ttrpc.MessageDecoder()
        assert [m for piece in _pieces(stream, random.Random(seed)) for m in decoder.feed(piece)] == sent
        assert decoder.pending == 0
    with pytest.raises(ttrpc.ProtocolError):
        ttrpc.MessageDecoder().feed(struct.pack(">IIBB", ttrpc.MAX_MESSAGE + 1, 1, 1, 0))


def test_status_decoding() -> None:
    # Response{status: Status{code: 2, message: "boom", details: [Any{type_url: "x"}]}, payload: "p"}
    status = bytes.fromhex("0802") + b"\x12\x04boom" + b"\x1a\x03\x0a\x01x"
    wire_bytes = b"\x0a" + bytes([len(status)]) + status + b"\x12\x01p"
    with pytest.raises(ttrpc.TtrpcError) as err:
        ttrpc.decode_response(wire_bytes)
    assert err.value.code == ttrpc.Code.UNKNOWN
    assert err.value.message == "boom"
    assert "UNKNOWN" in str(err.value) and "boom" in str(err.value)
    assert ttrpc.decode_response(b"\x0a\x00\x12\x02ok") == b"ok"  # OK status present but empty
    assert ttrpc.decode_response(b"\x12\x02ok") == b"ok"  # no status at all
    assert ttrpc.decode_response(b"") == b""  # OK, empty reply: a zero-length message
    assert ttrpc.TtrpcError(99, "odd").code == 99  # codes beyond gRPC's survive
    assert ttrpc.encode_response(b"x") == b"\x12\x01x"
    err_wire = ttrpc.encode_response(b"", ttrpc.Code.UNIMPLEMENTED, "nope")
    with pytest.raises(ttrpc.TtrpcError) as err:
        ttrpc.decode_response(err_wire)
    assert (err.value.code, err.value.message) == (ttrpc.Code.UNIMPLEMENTED, "nope")


def test_envelopes_agree_with_betterproto() -> None:
    """The hand-written envelopes encode as betterproto does and read what it writes."""
    for service, method, payload, timeout in [
        ("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin", b"\x0a\x05mokka\x12\x0210", 5_000_000_000),
        ("s", "m", b"", 0),
        ("nri.pkg.api.v1alpha1.Plugin", "CreateContainer", random.Random(6).randbytes(9000), 2_000_000_000),
    ]:
        ours = ttrpc.encode_request(service, method, payload, timeout)
        theirs = pb_ttrpc.Request(service=service, method=method, payload=payload, timeout_nano=timeout)
        assert ours == bytes(theirs)
        theirs.metadata = [pb_ttrpc.KeyValue(key="k", value="v")]  # skipped when read
        got = ttrpc.decode_request(bytes(theirs))
        assert (got.service, got.method, got.payload, got.timeout_nano) == (service, method, payload, timeout)
    assert ttrpc.decode_request(bytes(pb_ttrpc.Request(timeout_nano=-5))).timeout_nano == -5
    for payload, code, message in [(b"", 0, ""), (b"abc", 0, ""), (b"", 2, "no"), (b"p", 12, "method X")]:
        ours = ttrpc.encode_response(payload, code, message)
        parsed = pb_ttrpc.Response().parse(ours)
        assert (parsed.payload, parsed.status.code, parsed.status.message) == (payload, code, message)
        if code == 0:
            assert ours == bytes(pb_ttrpc.Response(payload=payload))


# --------------------------------------------------------------------------- wire


def test_varints_agree_with_betterproto() -> None:
    values = [0, 1, 127, 128, 300, 16383, 16384, 2**31 - 1, 2**32, 2**63 - 1, -1, -(2**31), -(2**63)]
    for v in values:
        encoded = wire.encode_varint(v)
        assert encoded == betterproto.encode_varint(v)
        decoded, end = wire.read_varint(encoded + b"tail", 0)
        assert end == len(encoded)
        assert decoded == (v if v >= 0 else v + (1 << 64))
    with pytest.raises(wire.WireError):
        list(wire.fields(b"\x08" + b"\xff" * 11))


def test_fields_walk_a_message_without_decoding_it() -> None:
    req = pb_api.ConfigureRequest(config="x" * 300, runtime_name="containerd", runtime_version="v2.1.9")
    data = b"\x78\x05" + bytes(req) + b"\x21" + bytes(8) + b"\x2d" + bytes(4)  # unknown fields of every kind
    seen = [(n, k) for n, k, _, _ in wire.fields(data)]
    assert seen == [(15, wire.VARINT), (1, wire.LEN), (2, wire.LEN), (3, wire.LEN), (4, 1), (5, 5)]
    a, b = wire.first(data, 2) or (0, 0)
    assert data[a:b] == b"containerd"
    assert wire.first(data, 9) is None
    for broken in (data[:-1], bytes(req)[:-3], b"\x0a\x05ab", b"\x0b"):  # truncated; group wire type
        with pytest.raises(wire.WireError):
            list(wire.fields(broken))
    assert wire.encode_bytes(1, b"") == b"" and wire.encode_varint_field(2, 0) == b""
    assert wire.encode_varint_field(2, 8) == bytes(pb_api.ConfigureResponse(events=8))


# --------------------------------------------------------------------------- the request reader


def _request(
    rng: random.Random,
    namespace: str,
    pod_ann: dict[str, str],
    ann: dict[str, str],
    env: list[str],
    devices: list[str],
    mounts: Sequence[str] = (),
) -> pb_api.CreateContainerRequest:
    noise = {f"io.kubernetes.cri/x{i}": "y" * rng.randint(0, 80) for i in range(rng.randint(0, 6))}
    return pb_api.CreateContainerRequest(
        pod=pb_api.PodSandbox(id="p" * 64, name="trainer", namespace=namespace, annotations={**noise, **pod_ann}),
        container=pb_api.Container(
            id="c" * 64,
            pod_sandbox_id="p" * 64,
            name="main",
            annotations={**noise, **ann},
            env=["PATH=/bin", *env, "HOSTNAME=x"],
            mounts=[pb_api.Mount(destination=m, type="bind", source=f"/host{m}", options=["ro"]) for m in mounts],
            linux=pb_api.LinuxContainer(devices=[pb_api.LinuxDevice(path=d, type="c", major=1) for d in devices]),
        ),
    )


def test_request_reader_keeps_exactly_what_decisions_read() -> None:
    """Over random requests, the lazily read inputs equal those of a full parse, filtered by
    the decision's own relevance rules; and a request with none is read without walking it."""
    rng = random.Random(7)
    keys = ["mokka.io/gpus", "mokka.io/inject", "cdi.k8s.io/gpu", "cdi.k8s.io/nic", "example.com/a", "mokka.iox"]
    values = ["0,3", "false", "nvidia.com/gpu=1", "all", ""]
    env_pool = ["NVIDIA_VISIBLE_DEVICES=1,3", "NVIDIA_VISIBLE_DEVICES=", "LD_PRELOAD=/a.so", "NVIDIA_X=1", "A=B"]
    dev_pool = ["/dev/nvidia0", "/dev/nvidia7", "/dev/nvidiactl", "/dev/fuse", "/dev/nvidia-uvm"]
    # the driver's library where CDI specs put it, and mounts that only look alike
    lib = "libnvidia-ml.so"
    mount_pool = [f"/usr/lib64/{lib}.580.105.08", f"/usr/lib/x86_64-linux-gnu/{lib}.1", "/etc/hosts", f"/opt/{lib}.d/x"]
    for _ in range(300):
        pod_ann = {k: rng.choice(values) for k in rng.sample(keys, rng.randint(0, 3))}
        ann = {k: rng.choice(values) for k in rng.sample(keys, rng.randint(0, 3))}
        env = rng.sample(env_pool, rng.randint(0, 4))
        devices = rng.sample(dev_pool, rng.randint(0, 3))
        mounts = rng.sample(mount_pool, rng.randint(0, 3))
        msg = _request(rng, rng.choice(["default", "kube-system", "ml"]), pod_ann, ann, env, devices, mounts)
        raw = bytes(msg)
        read = request.CreateRequest(raw)
        full = pb_api.CreateContainerRequest().parse(raw)
        names = (read.namespace, read.pod_name, read.container_name())
        assert names == (full.pod.namespace, full.pod.name, full.container.name)
        keep_env = {*decision.ENV_READ, *request.RENDER_ENV}
        env_dict = {k: v for k, _, v in (e.partition("=") for e in full.container.env) if k in keep_env}
        want = (
            full.pod.namespace,
            tuple(sorted((k, v) for k, v in full.pod.annotations.items() if decision.relevant_annotation(k))),
            tuple(sorted((k, v) for k, v in full.container.annotations.items() if decision.relevant_annotation(k))),
            tuple(sorted(env_dict.items())),
            tuple(d.path for d in full.container.linux.devices if decision.relevant_device(d.path)),
            tuple(m.destination for m in full.container.mounts if decision.relevant_mount(m.destination)),
        )
        assert read.key() == want
        if not any(t in raw for t in request.TRIGGERS):
            assert want[1:] == ((), (), (), (), ())


def test_request_reader_survives_what_containerd_might_send() -> None:
    empty = request.CreateRequest(b"")
    assert (empty.namespace, empty.pod_name, empty.container_name()) == ("", "", "")
    assert empty.key() == ("", (), (), (), (), ())
    with pytest.raises(wire.WireError):
        request.CreateRequest(b"\x0a\x10short")


# --------------------------------------------------------------------------- generated code


def test_generated_code_is_up_to_date() -> None:
    if problems := gen.version_mismatches():
        pytest.skip("generator versions differ from the pins: " + "; ".join(problems))
    assert gen.check(), "nri_mokka/nri/_pb is stale: run python -m nri_mokka.nri.gen"


# --------------------------------------------------------------------------- conformance

NRI_API = "usr/share/gocode/src/github.com/containerd/nri/pkg/api"
TTRPC = "usr/share/gocode/src/github.com/containerd/ttrpc"
# Mokka's messages whose official counterpart has another name. ttrpc's Go code sends
# google.rpc.Status in Response.status; its status.proto (".Status") declares only code.
RENAMED = {"ttrpc.Status": "google.rpc.Status"}
SAME_TYPE = {"ttrpc.Status": {"Status", "google.rpc.Status"}}


def _protoc(includes: list[Path], files: list[str], out: Path) -> descriptor_pb2.FileDescriptorSet:
    cmd = [sys.executable, "-m", "grpc_tools.protoc", *(f"-I{i}" for i in includes)]
    cmd += ["--include_imports", f"--descriptor_set_out={out}", *files]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _pool(fds: descriptor_pb2.FileDescriptorSet) -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    return pool


class Protos:
    def __init__(
        self,
        official: descriptor_pool.DescriptorPool,
        ours: descriptor_pool.DescriptorPool,
        names: list[str],
        version: str,
    ) -> None:
        self.official = official
        self.ours = ours
        self.names = names  # full names of Mokka's top-level messages
        self.version = version

    def official_for(self, our_name: str) -> Descriptor:
        return self.official.FindMessageTypeByName(RENAMED.get(our_name, our_name))

    def official_class(self, desc: Descriptor) -> type[PbMessage]:
        return message_factory.GetMessageClass(desc)


# NRI as containerd 1.7 speaks it (0.6.1, trixie) and as 2.1 does (0.8.0, sid). What Mokka
# declares must match both, except what 0.6 does not have yet.
NRI_VERSIONS = {"0.6.1": "trixie", "0.8.0": "sid"}
API_PACKAGE = "nri.pkg.api.v1alpha1"
ADDED_AFTER_0_6 = {f"{API_PACKAGE}.ContainerAdjustment.CDI_devices", f"{API_PACKAGE}.CDIDevice"}


@pytest.fixture(scope="module", params=sorted(NRI_VERSIONS))
def protos(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Protos:
    tmp = tmp_path_factory.mktemp("nri-proto")
    suite = NRI_VERSIONS[request.param]
    debs = debcache.fetch(suite, ["golang-github-containerd-nri-dev"])
    debs.update(debcache.fetch("trixie", ["golang-github-containerd-ttrpc-dev"]))
    for deb in debs.values():
        debcache.extract(deb, tmp / "deb")
    google_root = Path(importlib.import_module("google.rpc").__path__[0]).parent.parent
    assert (google_root / "google/rpc/status.proto").is_file(), "googleapis-common-protos ships no status.proto"
    official = _protoc(
        [tmp / "deb" / NRI_API, tmp / "deb" / TTRPC, google_root],
        ["api.proto", "request.proto", "proto/status.proto", "google/rpc/status.proto"],
        tmp / "official.pb",
    )
    proto_files = sorted(p.name for p in gen.PROTO_DIR.glob("*.proto"))
    ours = _protoc([gen.PROTO_DIR], proto_files, tmp / "ours.pb")
    names = [
        f"{f.package}.{m.name}" if f.package else m.name
        for f in ours.file
        if f.name in proto_files
        for m in f.message_type
    ]
    if request.param == "0.6.1":
        names = [n for n in names if n not in ADDED_AFTER_0_6]
    return Protos(_pool(official), _pool(ours), names, request.param)


def _map_entry(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _is_repeated(field: FieldDescriptor) -> bool:
    if hasattr(field, "is_repeated"):  # protobuf >= 6.31; `label` is gone in 7
        return bool(field.is_repeated)
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def _same_type(ours: FieldDescriptor, official: FieldDescriptor) -> bool:
    if ours.type != official.type:
        return False
    if ours.message_type is not None and not _map_entry(ours):
        return official.message_type.full_name in SAME_TYPE.get(
            ours.message_type.full_name, {ours.message_type.full_name}
        )
    if ours.enum_type is not None:
        return bool(ours.enum_type.full_name == official.enum_type.full_name)
    return True


def test_every_declared_field_matches_the_official_protos(protos: Protos) -> None:
    assert len(protos.names) >= 20
    checked: set[str] = set()

    def check(ours: Descriptor, official: Descriptor) -> None:
        if ours.full_name in checked:
            return
        checked.add(ours.full_name)
        assert ours.fields or ours.name == "Empty", f"{ours.full_name} declares no field"
        for f in ours.fields:
            off = official.fields_by_number.get(f.number)
            where = f"{ours.full_name}.{f.name} = {f.number}"
            if off is None and protos.version == "0.6.1" and f"{ours.full_name}.{f.name}" in ADDED_AFTER_0_6:
                continue
            assert off is not None, f"{where}: no field {f.number} in {official.full_name}"
            assert off.name == f.name, f"{where}: official name is {off.name}"
            assert _is_repeated(off) == _is_repeated(f), f"{where}: repeated differs"
            assert _map_entry(off) == _map_entry(f), f"{where}: map differs"
            assert _same_type(f, off), f"{where}: type differs from {official.full_name}.{off.name}"
            if _map_entry(f):
                for k in ("key", "value"):
                    assert _same_type(f.message_type.fields_by_name[k], off.message_type.fields_by_name[k]), where
            elif f.message_type is not None:
                check(f.message_type, protos.official_for(f.message_type.full_name))
            if f.enum_type is not None:
                for value in f.enum_type.values:
                    off_value = off.enum_type.values_by_number.get(value.number)
                    assert off_value is not None and off_value.name == value.name, f"{where}: enum {value.name}"

    for name in protos.names:
        check(protos.ours.FindMessageTypeByName(name), protos.official_for(name))
    assert checked == set(protos.names), "every message is checked at top level"


def test_method_tables_match_the_official_services(protos: Protos) -> None:
    """The transport dispatches by name (stub.PLUGIN_METHODS, RUNTIME_METHODS): same methods,
    same argument and reply messages as NRI's services, and messages Mokka declares."""
    package = API_PACKAGE
    for service, table in ((stub.PLUGIN_SERVICE, stub.PLUGIN_METHODS), (stub.RUNTIME_SERVICE, stub.RUNTIME_METHODS)):
        official = protos.official.FindServiceByName(service)
        for method, (argument, answer) in table.items():
            off = official.methods_by_name[method]
            assert off.input_type.full_name == f"{package}.{argument}", method
            assert off.output_type.full_name == f"{package}.{answer}", method
            assert protos.ours.FindMessageTypeByName(f"{package}.{argument}")
            assert protos.ours.FindMessageTypeByName(f"{package}.{answer}")


def _assert_field_numbers(protos: Protos, fields: dict[tuple[str, str], int]) -> None:
    """Each ``(message, field)`` has its number in Mokka's proto and the official one (but for
    what NRI 0.6.1 does not have yet)."""
    for pool in (protos.ours, protos.official):
        for (message, field), number in fields.items():
            added = {f"{API_PACKAGE}.{message}.{field}", f"{API_PACKAGE}.{message}"} & ADDED_AFTER_0_6
            if pool is protos.official and protos.version == "0.6.1" and added:
                continue  # CDI references: NRI 0.7 and later
            assert pool.FindMessageTypeByName(f"{API_PACKAGE}.{message}").fields_by_name[field].number == number


def test_request_reader_field_numbers(protos: Protos) -> None:
    """The numbers request.py reads by, against Mokka's proto and the official one."""
    _assert_field_numbers(protos, {
        ("CreateContainerRequest", "pod"): request.REQUEST_POD,
        ("CreateContainerRequest", "container"): request.REQUEST_CONTAINER,
        ("PodSandbox", "name"): request.POD_NAME,
        ("PodSandbox", "namespace"): request.POD_NAMESPACE,
        ("PodSandbox", "annotations"): request.POD_ANNOTATIONS,
        ("Container", "name"): request.CONTAINER_NAME,
        ("Container", "annotations"): request.CONTAINER_ANNOTATIONS,
        ("Container", "env"): request.CONTAINER_ENV,
        ("Container", "linux"): request.CONTAINER_LINUX,
        ("LinuxContainer", "devices"): request.LINUX_DEVICES,
        ("LinuxDevice", "path"): request.DEVICE_PATH,
        ("Container", "mounts"): request.CONTAINER_MOUNTS,
        ("Mount", "destination"): request.MOUNT_DESTINATION,
    })  # fmt: skip
    for pool in (protos.ours, protos.official):
        annotations = pool.FindMessageTypeByName(f"{API_PACKAGE}.PodSandbox").fields_by_name["annotations"]
        entry = annotations.message_type
        assert (entry.fields_by_name["key"].number, entry.fields_by_name["value"].number) == (
            request.MAP_KEY,
            request.MAP_VALUE,
        )


def test_reply_field_numbers(protos: Protos) -> None:
    """The numbers reply.py writes by, against Mokka's proto and the official one."""
    _assert_field_numbers(protos, {
        ("CreateContainerResponse", "adjust"): reply.RESPONSE_ADJUST,
        ("ContainerAdjustment", "mounts"): reply.ADJUST_MOUNTS,
        ("ContainerAdjustment", "env"): reply.ADJUST_ENV,
        ("ContainerAdjustment", "hooks"): reply.ADJUST_HOOKS,
        ("ContainerAdjustment", "linux"): reply.ADJUST_LINUX,
        ("ContainerAdjustment", "CDI_devices"): reply.ADJUST_CDI_DEVICES,
        ("KeyValue", "key"): reply.KEY,
        ("KeyValue", "value"): reply.VALUE,
        ("Mount", "destination"): reply.MOUNT_DESTINATION,
        ("Mount", "type"): reply.MOUNT_TYPE,
        ("Mount", "source"): reply.MOUNT_SOURCE,
        ("Mount", "options"): reply.MOUNT_OPTIONS,
        ("Hooks", "create_container"): reply.HOOKS_CREATE_CONTAINER,
        ("Hook", "path"): reply.HOOK_PATH,
        ("Hook", "args"): reply.HOOK_ARGS,
        ("LinuxContainerAdjustment", "devices"): reply.LINUX_DEVICES,
        ("LinuxDevice", "path"): reply.DEVICE_PATH,
        ("LinuxDevice", "type"): reply.DEVICE_TYPE,
        ("LinuxDevice", "major"): reply.DEVICE_MAJOR,
        ("LinuxDevice", "minor"): reply.DEVICE_MINOR,
        ("LinuxDevice", "file_mode"): reply.DEVICE_FILE_MODE,
        ("OptionalFileMode", "value"): reply.FILE_MODE_VALUE,
        ("CDIDevice", "name"): reply.CDI_NAME,
    })  # fmt: skip


def _betterproto_adjustment(e: edits.ContainerEdits, preload: str) -> pb_api.ContainerAdjustment:
    """The same adjustment built as betterproto messages: what reply.adjustment must equal."""
    env = [
        pb_api.KeyValue(key=k, value=f"{v}:{preload}" if k == "LD_PRELOAD" and preload else v)
        for k, v in e.env_dict().items()
    ]
    mounts = [
        pb_api.Mount(destination=m.container_path, type="bind", source=m.host_path, options=list(m.options))
        for m in e.mounts
    ]
    adjust = pb_api.ContainerAdjustment(env=env, mounts=mounts)
    if e.device_nodes:
        adjust.linux = pb_api.LinuxContainerAdjustment(
            devices=[
                pb_api.LinuxDevice(
                    path=d.path, type=d.type, major=d.major, minor=d.minor,
                    file_mode=pb_api.OptionalFileMode(value=d.file_mode),
                )
                for d in e.device_nodes
            ]
        )  # fmt: skip
    if e.hooks:
        adjust.hooks = pb_api.Hooks(create_container=[pb_api.Hook(path=h.path, args=list(h.args)) for h in e.hooks])
    return adjust


def test_replies_are_the_bytes_betterproto_writes() -> None:
    """Over random edits (the node's mounts, environment, device nodes and hooks, with and
    without the container's own LD_PRELOAD, large minors, empty options and arguments) and CDI
    references, reply's bytes equal betterproto's encoding of the same adjustment, and decode
    back to it."""
    rng = random.Random(11)
    paths = ["/usr/bin/nvidia-smi", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/proc/driver/nvidia/é"]
    for _ in range(200):
        e = edits.ContainerEdits(
            env=tuple(rng.sample(["NVIDIA_VISIBLE_DEVICES=0,3", "LD_PRELOAD=/usr/lib/mokka/x.so", "A=", "B=c=d"], 3)),
            device_nodes=tuple(
                edits.DeviceNode(f"/dev/nvidia{i}", rng.choice([0, 195, 511]), rng.choice([0, 7, 255, 1 << 20]), "/h",
                                 file_mode=rng.choice([0o666, 0o600, 0]))
                for i in range(rng.randint(0, 9))
            ),
            mounts=tuple(
                edits.Mount(f"/host{p}", p, rng.choice([edits.READ_ONLY, edits.WRITABLE, ()]))
                for p in rng.sample(paths, rng.randint(0, 3))
            ),
            hooks=tuple(
                edits.Hook(f"/hook{i}", tuple(rng.sample(["x", "", "--driver", "/d"], i)))
                for i in range(rng.randint(0, 2))
            ),
        )  # fmt: skip
        preload = rng.choice(["", "/opt/own.so"])
        expected = _betterproto_adjustment(e, preload)
        written = reply.adjustment(e, preload)
        assert written == bytes(expected)
        assert pb_api.ContainerAdjustment().parse(written) == expected
        assert reply.response(written) == bytes(pb_api.CreateContainerResponse(adjust=expected))
    hooks = (edits.Hook("/var/lib/mokka/lib/mokka-proc-hook", ("mokka-proc-hook", "--driver", "/p")),)
    for names, h in [(("nvidia.com/gpu=0", "nvidia.com/gpu=all"), ()), (("mokka.io/hca=mlx5-3",), hooks)]:
        expected = pb_api.ContainerAdjustment(cdi_devices=[pb_api.CdiDevice(name=n) for n in names])
        if h:
            expected.hooks = pb_api.Hooks(create_container=[pb_api.Hook(path=x.path, args=list(x.args)) for x in h])
        assert reply.cdi_adjustment(names, h) == bytes(expected)


# Values: a distinctive value for every field, from the field's number and depth.


def _scalar(field: FieldDescriptor, n: int) -> Any:
    t = FieldDescriptor
    values: dict[int, Callable[[], Any]] = {
        t.TYPE_STRING: lambda: f"{field.name}-{n}-é",
        t.TYPE_BYTES: lambda: bytes([n % 256, 0, 255]) * 3,
        t.TYPE_BOOL: lambda: True,
        t.TYPE_INT32: lambda: -(1000 + n),
        t.TYPE_SINT32: lambda: -(1000 + n),
        t.TYPE_UINT32: lambda: 0o644 + n,
        t.TYPE_INT64: lambda: -(1 << 40) - n,
        t.TYPE_SINT64: lambda: -(1 << 40) - n,
        t.TYPE_UINT64: lambda: (1 << 40) + n,
        t.TYPE_ENUM: lambda: max(v.number for v in field.enum_type.values),
    }
    return values[field.type]()


def _tree(desc: Descriptor, n: int = 1, depth: int = 0) -> dict[str, Any]:
    """A populated message as a plain tree keyed by field name (all fields of ``desc``)."""
    out: dict[str, Any] = {}
    if depth > 6:
        return out
    for f in desc.fields:
        k = n * 10 + f.number
        if _map_entry(f):
            vf = f.message_type.fields_by_name["value"]
            out[f.name] = {f"k{k}-{i}": _value(vf, k + i, depth) for i in range(2)}
        elif _is_repeated(f):
            out[f.name] = [_value(f, k + i, depth) for i in range(2)]
        else:
            out[f.name] = _value(f, k, depth)
    return out


def _value(f: FieldDescriptor, n: int, depth: int) -> Any:
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        return _tree(f.message_type, n, depth + 1)
    return _scalar(f, n)


def _to_betterproto(cls: type[betterproto.Message], desc: Descriptor, tree: dict[str, Any]) -> betterproto.Message:
    module = sys.modules[cls.__module__]
    kwargs: dict[str, Any] = {}
    for f in desc.fields:
        if f.name not in tree:
            continue
        value = tree[f.name]
        if f.type == FieldDescriptor.TYPE_MESSAGE and not _map_entry(f):
            sub = getattr(module, betterproto.casing.pascal_case(f.message_type.name))
            if _is_repeated(f):
                value = [_to_betterproto(sub, f.message_type, v) for v in value]
            else:
                value = _to_betterproto(sub, f.message_type, value)
        kwargs[_attr(f.name)] = value
    return cls(**kwargs)


def _fill_official(msg: PbMessage, tree: dict[str, Any]) -> None:
    for f in msg.DESCRIPTOR.fields:
        if f.name not in tree:
            continue
        value = tree[f.name]
        target = getattr(msg, f.name)
        if _map_entry(f):
            for k, v in value.items():
                if f.message_type.fields_by_name["value"].type == FieldDescriptor.TYPE_MESSAGE:
                    _fill_official(target[k], v)
                else:
                    target[k] = v
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            if _is_repeated(f):
                for v in value:
                    _fill_official(target.add(), v)
            else:
                target.SetInParent()
                _fill_official(target, value)
        elif _is_repeated(f):
            target.extend(value)
        else:
            setattr(msg, f.name, value)


def _canon_betterproto(
    msg: betterproto.Message, desc: Descriptor, official: Descriptor | None = None
) -> dict[int, Any]:
    """Mokka's fields of a betterproto message; with ``official``, only those it also has."""
    out: dict[int, Any] = {}
    for f in desc.fields:
        sub = None
        if official is not None:
            off = official.fields_by_number.get(f.number)
            if off is None:  # only where the official counterpart is ttrpc's code-only Status
                continue
            sub = off.message_type
        value = getattr(msg, _attr(f.name))
        if f.type == FieldDescriptor.TYPE_MESSAGE and not _map_entry(f):
            if _is_repeated(f):
                value = [_canon_betterproto(v, f.message_type, sub) for v in value]
            else:
                value = _canon_betterproto(value, f.message_type, sub)
        elif _map_entry(f):
            value = dict(value)
        elif _is_repeated(f):
            value = list(value)
        elif f.enum_type is not None:
            value = int(value)
        out[f.number] = value
    return out


def _canon_official(msg: PbMessage, desc: Descriptor) -> dict[int, Any]:
    """Mokka's fields (``desc``, matched by number) of an official message."""
    out: dict[int, Any] = {}
    for f in desc.fields:
        off = msg.DESCRIPTOR.fields_by_number.get(f.number)
        if off is None:  # only where the official counterpart is ttrpc's code-only Status
            continue
        value = getattr(msg, off.name)
        if f.type == FieldDescriptor.TYPE_MESSAGE and not _map_entry(f):
            if _is_repeated(f):
                value = [_canon_official(v, f.message_type) for v in value]
            else:
                value = _canon_official(value, f.message_type)
        elif _map_entry(f):
            value = dict(value)
        elif _is_repeated(f):
            value = list(value)
        out[f.number] = value
    return out


def _attr(field_name: str) -> str:
    """betterproto's attribute for a proto field (``CDI_devices`` -> ``cdi_devices``)."""
    return betterproto.casing.safe_snake_case(field_name)


def _betterproto_class(name: str) -> type[betterproto.Message]:
    package, _, cls = name.rpartition(".")
    module = {"nri.pkg.api.v1alpha1": pb_api, "ttrpc": pb_ttrpc}[package]
    found: type[betterproto.Message] = getattr(module, betterproto.casing.pascal_case(cls))
    return found


def test_every_generated_class_is_declared() -> None:
    generated = {
        f"{pkg}.{name}"
        for pkg, module in (("nri.pkg.api.v1alpha1", pb_api), ("ttrpc", pb_ttrpc))
        for name, obj in vars(module).items()
        if isinstance(obj, type) and issubclass(obj, betterproto.Message) and obj.__module__ == module.__name__
    }
    declared = {
        f"{package}.{line.split()[1]}"
        for package, proto in (("nri.pkg.api.v1alpha1", "nri.proto"), ("ttrpc", "ttrpc.proto"))
        for line in (gen.PROTO_DIR / proto).read_text().splitlines()
        if line.startswith("message ")
    }
    declared = {f"{n.rpartition('.')[0]}.{betterproto.casing.pascal_case(n.rpartition('.')[2])}" for n in declared}
    assert generated == declared


def test_betterproto_to_official(protos: Protos) -> None:
    for name in protos.names:
        desc = protos.ours.FindMessageTypeByName(name)
        tree = _tree(desc)
        ours = _to_betterproto(_betterproto_class(name), desc, tree)
        assert _canon_betterproto(ours, desc) == _canon_betterproto(
            _betterproto_class(name)().parse(bytes(ours)), desc
        ), name
        official_desc = protos.official_for(name)
        official = protos.official_class(official_desc).FromString(bytes(ours))
        assert _canon_official(official, desc) == _canon_betterproto(ours, desc, official_desc), name


def test_official_to_betterproto(protos: Protos) -> None:
    for name in protos.names:
        desc = protos.ours.FindMessageTypeByName(name)
        official_desc = protos.official_for(name)
        official = protos.official_class(official_desc)()
        _fill_official(official, _tree(official_desc))  # every official field, also those Mokka skips
        wire = official.SerializeToString()
        ours = _betterproto_class(name)().parse(wire)
        assert _canon_betterproto(ours, desc, official_desc) == _canon_official(official, desc), name


def test_ttrpc_response_status_as_go_sends_it(protos: Protos) -> None:
    """Go's ttrpc puts google.rpc.Status (code, message, details) into Response field 1."""
    status_cls = protos.official_class(protos.official.FindMessageTypeByName("google.rpc.Status"))
    status = status_cls(code=9, message="plugin said no")
    status.details.add(type_url="type.example/x", value=b"\x01\x02")
    response_cls = protos.official_class(protos.official.FindMessageTypeByName("ttrpc.Response"))
    # Go's Response: field 1 holds google.rpc.Status; ttrpc's status.proto knows only its code.
    wire = b"\x0a" + _varint(len(status.SerializeToString())) + status.SerializeToString() + b"\x12\x00"
    assert response_cls.FromString(wire).status.code == 9
    with pytest.raises(ttrpc.TtrpcError) as err:
        ttrpc.decode_response(wire)
    assert (err.value.code, err.value.message) == (ttrpc.Code.FAILED_PRECONDITION, "plugin said no")
    mine = ttrpc.encode_response(b"", ttrpc.Code.UNKNOWN, "refused")
    status_bytes = response_cls.FromString(mine).status.SerializeToString()  # unknown fields kept
    parsed = status_cls.FromString(status_bytes)
    assert (parsed.code, parsed.message) == (2, "refused")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_event_mask_bits_follow_the_official_enum(protos: Protos) -> None:
    event = protos.official.FindEnumTypeByName("nri.pkg.api.v1alpha1.Event")
    assert event.values_by_name["LAST"].number == stub.LAST_EVENT
    for value in event.values:
        if 0 < value.number < stub.LAST_EVENT:
            assert stub.EVENTS[value.name] == value.number == getattr(pb_api.Event, value.name)
            assert stub.event_mask([stub.EVENTS[value.name]]) == 1 << (value.number - 1)
