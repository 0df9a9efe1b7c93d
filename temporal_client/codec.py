"""The payload codec: AES-256-GCM over every payload ksquad writes to Temporal (workflow inputs, prompts,
agent results, signals, memos), so the history at rest and in the UI shows ciphertext unless it is decoded
through the codec endpoint by someone allowed to.

Search attributes and workflow ids are not payloads and stay readable: they carry no inputs or prompts
(see `workflows.search_attributes`). The key is 32 random bytes in a file (the embedded default writes one
under `.ksquad/`; on a cluster, mount a Secret and point `KSQUAD_CODEC_KEY_FILE` at it). Payloads name the
key by a short id, so a payload written under an old key fails to decode with that id in the message.
"""

import base64
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
NONCE_BYTES = 12


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


class EncryptionCodec(PayloadCodec):
    def __init__(self, key: bytes) -> None:
        self.aes = AESGCM(key)
        self.key_id = hashlib.sha256(key).hexdigest()[:12].encode()

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        encoded = []
        for payload in payloads:
            nonce = os.urandom(NONCE_BYTES)
            data = nonce + self.aes.encrypt(nonce, payload.SerializeToString(), None)
            encoded.append(Payload(metadata={"encoding": ENCODING, KEY_ID: self.key_id}, data=data))
        return encoded

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        decoded = []
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCODING:
                decoded.append(payload)  # written without the codec (older history): as it is
                continue
            key_id = payload.metadata.get(KEY_ID, b"")
            if key_id != self.key_id:
                raise ValueError(
                    f"payload encrypted with key {key_id.decode()}, this codec has {self.key_id.decode()}"
                )
            nonce, ciphertext = payload.data[:NONCE_BYTES], payload.data[NONCE_BYTES:]
            decoded.append(Payload.FromString(self.aes.decrypt(nonce, ciphertext, None)))
        return decoded
