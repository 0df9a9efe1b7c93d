"""Signed Agent Cards (A2A 1.0, section 8.4): an Agent's `cardKeys` names the public keys its card must be signed
with, and the worker checks the card before it sends a task. The check is a2a-sdk's (a JWS over the card's RFC 8785
canonical form, without its signatures, verified with PyJWT): this module picks the key and the algorithms.

- The key comes from the Agent's own JWKS, by the signature's `kid` (the only key when the JWKS holds one and the
  signature names none). A `jku` in the signature is never fetched: who forges a card can host keys as well.
- Only asymmetric algorithms, each for the key type it belongs to (no `none`, no HMAC: a public key used as an
  HMAC secret would let anyone sign).
"""

import json
from functools import cache

from a2a.types import AgentCard
from a2a.utils.signing import SignatureVerificationError, create_signature_verifier
from jwt import PyJWK
from jwt.exceptions import PyJWTError

from workflows.contract import CardKeys, PublicJwk

ALGORITHMS = {
    "EC": {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"},
    "RSA": ("RS256",),  # another (PS256...) when the key's `alg` names it
    "OKP": {"Ed25519": "EdDSA"},
}


class UnknownKey(PyJWTError):
    """The signature names a key the Agent's JWKS does not hold (a2a-sdk tries the card's next signature)."""


def algorithms_of(key: PublicJwk) -> list[str]:
    """The algorithms a signature by `key` may use: its own `alg`, else those of its type and curve."""
    if key.alg:
        return [key.alg]
    allowed = ALGORITHMS[key.kty]
    if isinstance(allowed, dict):
        return [allowed[key.crv]] if key.crv in allowed else []
    return list(allowed)


@cache
def _jwks(keys_json: str) -> tuple[dict[str | None, PyJWK], tuple[str, ...]]:
    keys = CardKeys.model_validate_json(keys_json).keys
    by_kid = {key.kid: PyJWK(key.model_dump(exclude_none=True), algorithm=key.alg) for key in keys}
    algorithms = sorted({a for key in keys for a in algorithms_of(key)})
    return by_kid, tuple(algorithms)


def card_not_signed(card: AgentCard, keys: CardKeys) -> str | None:
    """None when one of the card's signatures verifies with a key of `keys`; else why not, in a sentence."""
    if not card.signatures:
        return "the card carries no signature"
    by_kid, algorithms = _jwks(json.dumps(keys.model_dump(mode="json", exclude_none=True), sort_keys=True))

    def key_for(kid: str | None, jku: str | None) -> PyJWK:
        if kid in by_kid:
            return by_kid[kid]
        if kid is None and len(by_kid) == 1:
            return next(iter(by_kid.values()))
        raise UnknownKey(f"no key {kid!r}")

    try:
        create_signature_verifier(key_for, list(algorithms))(card)
    except SignatureVerificationError:
        kids = ", ".join(str(k) for k in by_kid)
        return (
            f"none of its {len(card.signatures)} signature(s) verifies with a key of the Agent's cardKeys "
            f"(kid {kids}; algorithms {', '.join(algorithms)})"
        )
    return None
