"""The payload codec: AES-256-GCM over every payload ksquad writes to Temporal (workflow inputs, prompts,
agent results, signals, memos), so the history at rest and in the UI shows ciphertext unless it is decoded
through the codec endpoint by someone allowed to.

Search attributes and workflow ids are not payloads and stay readable: they carry no inputs or prompts
(see `workflows.search_attributes`). Failure messages and stack traces are payloads too (the data converter's
failure converter encodes them), so a provider's error text or a model's question is ciphertext in history.

A process that holds the ring builds none of ksquad's own types from a payload in clear: whoever can write to
the Temporal namespace without the key (`temporal workflow start` or `signal` without `--codec-endpoint`) cannot
hand the worker a Run of their own. The codec marks a payload in clear (`IN_CLEAR`), and ksquad's payload converter
(temporal_client.connection) refuses to make a ksquad model of a marked one: a workflow started in clear never
runs (its first task fails, naming this). Temporal's own payloads in clear (the server's "ACTIVITY_ID_NOT_STARTED"
when an activity is cancelled before it started, a plain string) are read as they are: refusing them would fail
the workflow task of a legitimate run. `accept_plaintext` (KSQUAD_CODEC_ACCEPT_PLAINTEXT) lets marked payloads
become models again, for histories written before a codec was configured; the codec endpoint that shows history to
people passes payloads in clear through unmarked. A key is 32 random bytes in a file (the embedded default writes one
under `.ksquad/`; on a cluster, a Secret mounted as a directory). Keys form a ring: payloads are encrypted with
the active key (`KSQUAD_CODEC_KEY_FILE`) and name it by a short id in their metadata; they decrypt with any key
of the ring, the active one and every file of `KSQUAD_CODEC_KEYS` (a directory: the mounted Secret, whose
files are read again when a payload names a key not seen yet, so a key added to the Secret is known before any
process encrypts with it). Rotation: add the new key to the Secret, then make it the active one; remove an
old key only once no open workflow's history and no retained one needs it.
"""

import base64
import hashlib
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

log = logging.getLogger(__name__)
ENCODING = b"binary/encrypted"
IN_CLEAR = "ksquad-in-clear"  # metadata the codec adds to a payload that came in clear (see the module)
# Metadata the codec adds, instead of failing, to a payload it cannot decrypt (a key it lacks, or data that is not
# what the key encrypted): the payload converter refuses to read it, naming why. Raising here would fail the whole
# workflow task, so one signal of garbage would stop a workflow for good.
UNREADABLE = "ksquad-unreadable"
KEY_ID = "encryption-key-id"
NONCE_BYTES = 12
RELOAD_SECONDS = 5.0  # an unknown key id reads the key directory again at most this often


class CodecKeyError(Exception):
    pass


def load_key(path: Path) -> bytes:
    """A 32-byte key from `path`: raw bytes, or base64 or hex text."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise CodecKeyError(f"cannot read the codec key {path}: {err.strerror}") from None
    text = raw.strip()
    for decode in (base64.b64decode, bytes.fromhex):
        try:
            key = decode(text.decode()) if len(raw) != 32 else raw
        except ValueError:
            continue
        if len(key) == 32:
            return key
    raise CodecKeyError(f"the codec key {path} is not 32 bytes (raw, base64 or hex)")


def ensure_key_file(path: Path) -> bytes:
    """The key at `path`, created (readable by its owner only) when missing."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(base64.b64encode(os.urandom(32)).decode() + "\n")
    return load_key(path)


def key_id(key: bytes) -> bytes:
    """The short id a payload names its key by (not the key: a hash prefix of it)."""
    return hashlib.sha256(key).hexdigest()[:12].encode()


class KeyRing:
    """The active key, which encrypts, and every key that decrypts: the active one and the files of
    `directory` (hidden files aside: a mounted Secret keeps its versions in `..data` links)."""

    def __init__(self, active: bytes, directory: Path | None = None) -> None:
        self.active = active
        self.active_id = key_id(active)
        self.directory = directory
        self._keys: dict[bytes, AESGCM] = {self.active_id: AESGCM(active)}
        self._read_at = float("-inf")
        self._read()

    @classmethod
    def from_files(cls, active_file: Path, directory: Path | None = None) -> "KeyRing":
        return cls(load_key(active_file), directory)

    @property
    def ids(self) -> list[str]:
        return sorted(i.decode() for i in self._keys)

    def _read(self) -> None:
        self._read_at = time.monotonic()
        if self.directory is None:
            return
        try:
            files = sorted(f for f in self.directory.iterdir() if not f.name.startswith(".") and f.is_file())
        except OSError as err:
            log.warning("codec key directory %s: %s", self.directory, err.strerror)
            return
        for file in files:
            try:
                key = load_key(file)
            except CodecKeyError as err:
                log.warning("skipping %s", err)
                continue
            self._keys.setdefault(key_id(key), AESGCM(key))

    def decrypter(self, wanted: bytes) -> AESGCM:
        aes = self._keys.get(wanted)
        if aes is None and time.monotonic() - self._read_at >= RELOAD_SECONDS:
            self._read()  # a key added to the Secret since
            aes = self._keys.get(wanted)
        if aes is None:
            raise ValueError(
                f"payload encrypted with key {wanted.decode() or '(none named)'}, which this codec's key ring "
                f"({', '.join(self.ids)}) does not hold: add that key to the codec key directory"
            )
        return aes


class EncryptionCodec(PayloadCodec):
    def __init__(self, keys: bytes | KeyRing, accept_plaintext: bool = False) -> None:
        self.ring = keys if isinstance(keys, KeyRing) else KeyRing(keys)
        self.aes = AESGCM(self.ring.active)
        self.key_id = self.ring.active_id
        self.accept_plaintext = accept_plaintext

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        encoded = []
        for payload in payloads:
            nonce = os.urandom(NONCE_BYTES)
            data = nonce + self.aes.encrypt(nonce, payload.SerializeToString(), None)
            encoded.append(Payload(metadata={"encoding": ENCODING, KEY_ID: self.key_id}, data=data))
        return encoded

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return self._decode(payloads, self.accept_plaintext, display=False)

    async def decode_for_display(self, payloads: Sequence[Payload]) -> list[Payload]:
        """For the codec endpoint, which shows history to people: a payload in clear is shown as it is."""
        return self._decode(payloads, accept_plaintext=True, display=True)

    def _decode(self, payloads: Sequence[Payload], accept_plaintext: bool, display: bool) -> list[Payload]:
        decoded = []
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCODING:
                if accept_plaintext:
                    decoded.append(payload)  # written without the codec (older history): as it is
                else:
                    marked = Payload()
                    marked.CopyFrom(payload)
                    marked.metadata[IN_CLEAR] = b"1"
                    decoded.append(marked)
                continue
            try:
                aes = self.ring.decrypter(payload.metadata.get(KEY_ID, b""))
                nonce, ciphertext = payload.data[:NONCE_BYTES], payload.data[NONCE_BYTES:]
                decoded.append(Payload.FromString(aes.decrypt(nonce, ciphertext, None)))
            except (ValueError, InvalidTag, DecodeError) as err:
                if display:  # shown to a person: the codec endpoint answers with the reason
                    raise ValueError(str(err) or "the payload does not decrypt with its key") from None
                marked = Payload()
                marked.CopyFrom(payload)
                marked.metadata[UNREADABLE] = (
                    str(err) or "it does not decrypt with the key it names"
                ).encode()
                decoded.append(marked)
        return decoded
