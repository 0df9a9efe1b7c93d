"""The codec's key ring: the active key encrypts, every key of the ring decrypts, and a key added to the key
directory after start is found when a payload names it (the rotation of docs/operating.md, step by step)."""

import base64
import os
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload

from temporal_client import codec as codec_module
from temporal_client.codec import IN_CLEAR, KEY_ID, EncryptionCodec, KeyRing, key_id
from temporal_client.connection import RefusedInClear, RefusedUnreadable, data_converter
from workflows.spec import RunSpec


def write_key(directory: Path, name: str) -> bytes:
    key = os.urandom(32)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(base64.b64encode(key).decode())
    return key


def payload(text: str) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=text.encode())


async def test_the_active_key_encrypts_and_every_key_of_the_ring_decrypts(tmp_path: Path) -> None:
    keys = tmp_path / "codec"
    old = write_key(keys, "key")
    (written_before,) = await EncryptionCodec(old).encode([payload('"before the rotation"')])
    new = write_key(keys, "key-2027")

    rotated = EncryptionCodec(KeyRing.from_files(keys / "key-2027", keys))
    (written_after,) = await rotated.encode([payload('"after the rotation"')])

    assert written_after.metadata[KEY_ID] == key_id(new), "the new key encrypts"
    assert written_before.metadata[KEY_ID] == key_id(old)
    decoded = await rotated.decode([written_before, written_after])
    assert [p.data for p in decoded] == [b'"before the rotation"', b'"after the rotation"']


async def test_a_key_added_to_the_directory_later_is_found_and_an_unknown_one_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = tmp_path / "codec"
    write_key(keys, "key")
    running = EncryptionCodec(KeyRing.from_files(keys / "key", keys))  # a process started before the rotation
    monkeypatch.setattr(codec_module, "RELOAD_SECONDS", 0.0)

    added = write_key(keys, "key-2027")  # the Secret gains a key; another process encrypts with it
    (from_another_process,) = await EncryptionCodec(added).encode([payload('"new"')])
    assert [p.data for p in await running.decode([from_another_process])] == [b'"new"']

    # A payload of a key the ring lacks does not fail the decoding (a workflow task would fail with it, for good,
    # on one signal of garbage): it is marked, and reading it is refused, naming the key.
    (foreign,) = await EncryptionCodec(os.urandom(32)).encode([payload('"foreign"')])
    (marked,) = await running.decode([foreign])
    with pytest.raises(RefusedUnreadable, match="does not hold") as raised:
        data_converter(running).payload_converter.from_payloads([marked], [str])
    assert foreign.metadata[KEY_ID].decode() in str(raised.value)
    with pytest.raises(RefusedUnreadable):
        data_converter(running).payload_converter.from_payloads([marked], None)
    # shown to a person through the codec endpoint, it is an error naming the key
    with pytest.raises(ValueError, match="does not hold"):
        await running.decode_for_display([foreign])


def test_hidden_files_of_a_mounted_secret_are_not_keys(tmp_path: Path) -> None:
    keys = tmp_path / "codec"
    active = write_key(keys, "key")
    (keys / "..data").mkdir()  # how the kubelet lays out a Secret volume
    (keys / ".hidden").write_text("not a key")
    assert KeyRing.from_files(keys / "key", keys).ids == [key_id(active).decode()]


async def test_a_payload_in_clear_becomes_no_typed_value_but_temporals_own_strings_are_read() -> None:
    """The server writes some payloads itself, in clear ("ACTIVITY_ID_NOT_STARTED" when an activity is cancelled
    before it started): they are read; a RunInput or a signal's answer in clear is refused."""
    codec = EncryptionCodec(os.urandom(32))
    converter = data_converter(codec)
    (sentinel,) = await codec.decode([payload('"ACTIVITY_ID_NOT_STARTED"')])
    assert sentinel.metadata[IN_CLEAR] == b"1"
    assert converter.payload_converter.from_payloads([sentinel]) == ["ACTIVITY_ID_NOT_STARTED"]
    for hint in (str, RunSpec):
        with pytest.raises(RefusedInClear, match=f"refused a {hint.__name__} in clear"):
            converter.payload_converter.from_payloads([sentinel], [hint])
    (encrypted,) = await codec.encode([payload('"an answer"')])
    (decoded,) = await codec.decode([encrypted])
    assert converter.payload_converter.from_payloads([decoded], [str]) == ["an answer"]
    migrating = EncryptionCodec(os.urandom(32), accept_plaintext=True)
    (older,) = await migrating.decode([payload('"written before the codec"')])
    assert data_converter(migrating).payload_converter.from_payloads([older], [str]) == [
        "written before the codec"
    ]
