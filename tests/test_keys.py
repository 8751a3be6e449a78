"""API keys: the keys file's format, the sources combined, names unique, a key matched to
its entry, a reload that keeps the old keys when the file is wrong, and no message that
shows a key."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxcel.cli.flags import build_parser, settings_from_args
from mlxcel.cli.main import server_main
from mlxcel.errors import ConfigError
from mlxcel.http.guards import key_name
from mlxcel.keys import ApiKey, KeyLimits, Keyring, combine, parse_key_file

from support import KeysFile

FILE = """\
# the team's keys

alice:sk-alice-1 rpm=60 tpm=40000
sk-anon-2
bob:sk-bob-3 daily=1000000   # Bob's nightly jobs
"""


def test_the_file_names_keys_and_keeps_their_limits() -> None:
    alice, anon, bob = parse_key_file(FILE, "keys")
    assert (alice.name, alice.limits) == ("alice", KeyLimits(rpm=60, tpm=40000))
    assert (anon.name, anon.limits) == (key_name("sk-anon-2"), KeyLimits())
    assert anon.name.startswith("key-")
    assert len(anon.name) == 16
    assert (bob.name, bob.limits) == ("bob", KeyLimits(daily=1_000_000))


def test_a_presented_key_matches_its_entry_and_nothing_else(keys_file: KeysFile) -> None:
    path = keys_file(FILE)
    ring = Keyring.load(["sk-flag-a,sk-flag-b", "sk-flag-c"], path)
    assert [e.name for e in ring.entries] == [
        key_name("sk-flag-a"),
        key_name("sk-flag-b"),
        key_name("sk-flag-c"),
        "alice",
        key_name("sk-anon-2"),
        "bob",
    ]
    assert ring.match(b"sk-alice-1") == ApiKey("alice", KeyLimits(rpm=60, tpm=40000))
    assert ring.match(b"sk-flag-b") is not None
    assert ring.match(b"sk-flag-b").name == key_name("sk-flag-b")  # type: ignore[union-attr]
    for wrong in (b"sk-alice-", b"sk-alice-10", b"", b"alice", b"SK-ALICE-1"):
        assert ring.match(wrong) is None


def test_an_entry_never_holds_its_key() -> None:
    (entry,) = parse_key_file("carol:sk-carol-secret", "keys")
    assert "sk-carol-secret" not in repr(entry)
    assert b"sk-carol-secret" not in entry.digest


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a:sk-1\na:sk-2\n", "line 2: the name a is taken by line 1"),
        ("a:sk-1\nb:sk-1\n", "line 2: the same key as on line 1"),
        ("sk-1\n\nsk-1\n", "line 3: the same key as on line 1"),
        ("bad name:sk-1\n", "line 1: after the key"),
        (":sk-1\n", "line 1: a key's name"),
        ("a:\n", "line 1: no key after the name"),
        ("a:sk-1 rpm=-1\n", "line 1: rpm must be a whole number"),
        ("a:sk-1 rpm=x\n", "line 1: rpm must be a whole number"),
        ("a:sk-1 rpm=\u00b2\n", "line 1: rpm must be a whole number"),
        ("a:sk-1 tpm=\u0663\n", "line 1: tpm must be a whole number"),
        ("a:sk-1 daily=" + "9" * 5000 + "\n", "line 1: daily must be a whole number"),
        ("a:sk-1 rpm=1 rpm=2\n", "line 1: rpm is given twice"),
        ("# c\n\na:sk-1 sk-secret-tail\n", "line 3: after the key only"),
        ("a:sk-1 burst=3\n", "line 1: after the key only"),
        ("a:sk-1 admin=yes\n", "line 1: admin must be true or false"),
        ("a:sk-1 admin=true admin=true\n", "line 1: admin is given twice"),
    ],
)
def test_a_wrong_file_is_one_clear_error_without_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        combine(parse_key_file(text, "keys"))
    assert message in caught.value.message
    assert "sk-" not in caught.value.message


def test_every_source_combines(keys_file: KeysFile) -> None:
    path = keys_file("dana:sk-dana\n")
    env = {"LLAMA_API_KEY": "sk-env-1,sk-env-2", "MLXCEL_API_KEY_FILE": str(path)}
    argv = ["--api-key", "sk-flag-1", "--api-key", "sk-flag-2,sk-flag-3"]
    settings = settings_from_args(build_parser("t", env).parse_args(argv))
    assert settings.api_keys == ("sk-env-1", "sk-env-2", "sk-flag-1", "sk-flag-2", "sk-flag-3")
    assert settings.api_key_file == path
    ring = Keyring.load(settings.api_keys, settings.api_key_file)
    assert len(ring.entries) == 6
    assert ring.match(b"sk-dana") is not None
    assert ring.match(b"sk-env-2") is not None
    flag = settings_from_args(build_parser("t", {}).parse_args(["--api-key-file", "/k"]))
    assert flag.api_key_file == Path("/k")


def test_reload_replaces_the_files_keys_and_keeps_the_flags(keys_file: KeysFile) -> None:
    path = keys_file("old:sk-old\n")
    ring = Keyring.load(["sk-flag"], path)
    keys_file("new:sk-new\n")
    assert [e.name for e in ring.reload()] == [key_name("sk-flag"), "new"]
    assert ring.match(b"sk-old") is None
    assert ring.match(b"sk-new") is not None
    for broken in ("new:sk-new\nnew:sk-other\n", "x:sk-new rpm=-1\n"):
        keys_file(broken)
        with pytest.raises(ConfigError):
            ring.reload()
        assert ring.match(b"sk-new") is not None  # the old keys stay
    path.unlink()
    with pytest.raises(ConfigError, match="cannot be read"):
        ring.reload()
    assert ring.match(b"sk-new") is not None


def test_an_empty_keys_file_still_requires_a_key(keys_file: KeysFile) -> None:
    path = keys_file("# nobody yet\n")
    ring = Keyring.load([], path)
    assert ring
    assert not ring.entries
    assert ring.match(b"") is None
    assert not Keyring.load([], None)  # no keys at all: one open tenant


@pytest.mark.parametrize(
    "text",
    [
        "a:sk-dup-1\na:sk-dup-2\n",
        "a:sk-dup-1\nb:sk-dup-1\n",
        "a:sk-dup-1 x\n",
        "a:sk-dup-1 rpm=\u00b2\n",
    ],
)
def test_a_wrong_keys_file_stops_start_up_with_exit_2(
    keys_file: KeysFile, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = keys_file(text)
    # The keys are read before the model is looked for (there is none at /none).
    assert server_main(["--api-key-file", str(path), "--model", "/none"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"error: --api-key-file {path} line " in err
    assert "sk-dup" not in err


def test_a_key_given_by_a_flag_and_the_file_is_refused(keys_file: KeysFile) -> None:
    path = keys_file("erin:sk-twice\n")
    with pytest.raises(ConfigError, match="is the same key as") as caught:
        Keyring.load(["sk-twice"], path)
    assert "sk-twice" not in caught.value.message
    keys_file(f"{key_name('sk-other')}:sk-third\n")
    with pytest.raises(ConfigError, match="two API keys are named key-"):
        Keyring.load(["sk-other"], path)


def test_a_missing_keys_file_stops_start_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "absent"
    assert server_main(["--api-key-file", str(missing), "--model", "/none"]) == 2
    assert f"--api-key-file {missing}: cannot be read" in capsys.readouterr().err


def test_a_non_ascii_flag_key_is_refused() -> None:
    with pytest.raises(ConfigError, match="printable ASCII"):
        Keyring.load(["sk-é"], None)


def test_a_keys_file_with_a_byte_order_mark_and_crlf_line_ends_reads_as_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "keys"
    path.write_bytes(b"\xef\xbb\xbfalice:sk-bom-1 rpm=3\r\nbob:sk-bom-2\r\n")
    keyring = Keyring.load([], path)
    assert [entry.name for entry in keyring.entries] == ["alice", "bob"]
    assert keyring.limits_of("alice") == KeyLimits(rpm=3)
    assert keyring.match(b"sk-bom-1") is not None
    assert keyring.match(b"sk-bom-2") is not None


def test_admin_keys_come_from_the_file_and_the_flag(keys_file: KeysFile) -> None:
    path = keys_file("ops:sk-ops-1 admin=true rpm=2\nviewer:sk-view-2 admin=false\nsk-plain-3\n")
    env = {"MLXCEL_ADMIN_KEY": "sk-adm-env"}
    argv = ["--admin-key", "sk-adm-a,sk-adm-b", "--api-key", "sk-user", "--api-key-file", str(path)]
    settings = settings_from_args(build_parser("t", env).parse_args(argv))
    assert settings.admin_keys == ("sk-adm-env", "sk-adm-a", "sk-adm-b")
    assert "sk-adm" not in repr(settings)
    ring = Keyring.load(settings.api_keys, settings.api_key_file, settings.admin_keys)
    admins = {entry.name for entry in ring.entries if entry.admin}
    assert admins == {"ops", key_name("sk-adm-env"), key_name("sk-adm-a"), key_name("sk-adm-b")}
    for key in (b"sk-adm-b", b"sk-ops-1"):
        assert ring.match(key).admin  # type: ignore[union-attr]
    for key in (b"sk-user", b"sk-view-2", b"sk-plain-3"):
        assert not ring.match(key).admin  # type: ignore[union-attr]
    assert ring.limits_of("ops") == KeyLimits(rpm=2)
    assert Keyring.load([], None, ["sk-adm-only"])  # an admin key alone requires keys


def test_an_admin_key_given_twice_or_wrongly_is_refused() -> None:
    with pytest.raises(ConfigError, match="is the same key as") as caught:
        Keyring.load(["sk-both"], None, ["sk-both"])
    assert "--admin-key" in caught.value.message
    assert "sk-both" not in caught.value.message
    with pytest.raises(ConfigError, match="--admin-key: a key must be printable ASCII"):
        Keyring.load([], None, ["sk-\u00e9"])
