"""The host-change journal (hostsetup/journal.py): intent before change, exact undo, recovery
from an interrupted change, unreadable journals refused with one line."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from hostsetup.journal import Journal, JournalError


def state_of(path: Path) -> tuple[object, ...]:
    st = path.lstat()
    content = os.readlink(path) if path.is_symlink() else path.read_bytes()
    return (st.st_ino, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns, content)


def test_every_change_is_recorded_before_it_is_made(tmp_path: Path) -> None:
    file = tmp_path / "root/.mokka/journal.jsonl"
    journal = Journal.open(file, "test")
    target = tmp_path / "run/nvidia/driver"
    records: list[str] = []
    real_link = os.link

    def spy_link(src: object, dst: object, **kw: object) -> None:
        records.append(file.read_text().splitlines()[-1])
        real_link(src, dst, **kw)  # type: ignore[arg-type]

    target.parent.mkdir(parents=True)
    target.symlink_to("/opt/old")
    os.link = spy_link  # type: ignore[assignment]
    try:
        journal.symlink(target, "/var/lib/mokka/driver")
    finally:
        os.link = real_link
    journal.close()
    begin = json.loads(records[0])["begin"]
    assert begin["kind"] == "replace" and begin["paths"] == [str(target)] and begin["backup"]
    assert json.loads(file.read_text().splitlines()[-1]) == {"done": begin["seq"]}


def test_undo_puts_back_the_original_inode(tmp_path: Path) -> None:
    original = tmp_path / "etc/config.toml"
    original.parent.mkdir()
    original.write_text("mine\n")
    original.chmod(0o640)
    if os.geteuid() == 0:
        os.chown(original, 4321, 4321)
    os.utime(original, ns=(10**18, 10**18))
    before = state_of(original)
    journal = Journal.open(tmp_path / "etc/.j/journal.jsonl", "test")
    assert journal.write(original, b"ours\n", 0o644)
    assert not journal.write(original, b"ours\n", 0o644)  # idempotent
    journal.write(original, b"ours, again\n", 0o644)
    journal.write(tmp_path / "etc/new/dir/file", b"x")
    assert original.read_bytes() == b"ours, again\n"
    journal.undo()
    journal.teardown()
    assert state_of(original) == before
    assert sorted(p.name for p in (tmp_path / "etc").iterdir()) == ["config.toml"]


def test_an_interrupted_change_is_rolled_back_on_opening(tmp_path: Path) -> None:
    file = tmp_path / "root/.mokka/journal.jsonl"
    target = tmp_path / "root/node.json"
    journal = Journal.open(file, "test")
    journal.write(target, b"{}\n")
    tmp = tmp_path / "root/.other.mokka-0123456789abcdef"
    # as if killed after recording a new file and writing its temporary, before the rename
    journal._begin(journal._new("create", [tmp_path / "root/other"], temps=[str(tmp)]))
    tmp.write_text("half")
    journal.close()
    again = Journal.open(file, "test")
    assert not tmp.exists() and again.recovered == [f"rolled back interrupted change of {tmp_path}/root/other"]
    assert again.owns(target) and not again.owns(tmp_path / "root/other")
    again.close()


def test_a_torn_last_record_is_ignored(tmp_path: Path) -> None:
    file = tmp_path / "root/.mokka/journal.jsonl"
    journal = Journal.open(file, "test")
    journal.write(tmp_path / "root/a", b"a")
    journal.close()
    with open(file, "a") as fh:
        fh.write('{"begin":{"seq":9,"kind":"cre')  # the process died mid-append
    again = Journal.open(file, "test")
    assert [e.paths for e in again.entries.values()] == [[str(tmp_path / "root/a")]]
    again.write(tmp_path / "root/b", b"b")  # appended after the torn piece, which is dropped
    again.close()
    again = Journal.open(file, "test")
    assert again.undo() == [f"removed {tmp_path}/root/b", f"removed {tmp_path}/root/a"]
    again.teardown()
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json\n",
        '{"entries": []}\n',  # the old format
        '{"mokka-journal": 1, "home": []}\n{"done": 4}\n',
        '{"mokka-journal": 1, "home": []}\n{"begin": {"seq": 1, "kind": "delete", "paths": ["/x"]}}\n',
        '{"mokka-journal": 1, "home": []}\n{"begin": {"seq": 1, "kind": "create", "paths": ["relative"]}}\n',
    ],
)
def test_an_unreadable_journal_is_one_clear_error(tmp_path: Path, text: str) -> None:
    file = tmp_path / "root/.mokka/journal.jsonl"
    file.parent.mkdir(parents=True)
    file.write_text(text)
    with pytest.raises(JournalError) as err:
        Journal.open(file, "test")
    message = str(err.value)
    assert message.startswith(f"{file}: corrupt journal (line ") and "\n" not in message
    assert file.read_text() == text


def test_leftovers_of_a_killed_compaction_are_swept(tmp_path: Path) -> None:
    file = tmp_path / "root/.mokka/journal.jsonl"
    Journal.open(file, "test").close()
    leftover = file.with_name(".journal.jsonl.mokka-0123456789abcdef")
    leftover.write_text("half a journal")
    journal = Journal.open(file, "test")
    assert journal.swept == [f"removed leftover {leftover}"] and not leftover.exists()
    journal.close()


def test_leftovers_of_a_killed_bootstrap_are_swept(tmp_path: Path) -> None:
    (tmp_path / "var/lib").mkdir(parents=True)
    leftover = tmp_path / "var/lib/.mokka.mokka-0123456789abcdef"
    (leftover / ".mokka").mkdir(parents=True)
    (leftover / ".mokka/journal.jsonl").write_text("{}\n")
    assert Journal.sweep(tmp_path / "var/lib/mokka/.mokka/journal.jsonl") == [f"removed leftover {leftover}"]
    assert list((tmp_path / "var/lib").iterdir()) == []


def test_a_second_mokka_waits_for_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hostsetup import journal_file

    monkeypatch.setattr(journal_file, "LOCK_WAIT_S", 0.2)
    file = tmp_path / "var/lib/mokka/.mokka/journal.jsonl"
    first = Journal.open(file, "first")  # made the directories, holds their locks
    for what in ("second", None):
        with pytest.raises(JournalError, match="another mokka is changing this host"):
            Journal.open(file, what)
    first.close()
    second = Journal.open(file)
    assert second.exists and second.what == "first"
    assert second.undo() == [] and second.teardown() == [f"removed {tmp_path}/var/"]
    second.close()
    assert list(tmp_path.iterdir()) == []
