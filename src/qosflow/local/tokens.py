"""Service-account tokens: issued by the TokenRequest API, recognised by both listeners.

A token is shaped like the API server's bound service-account JWT (``header.claims.signature``,
base64url, with the ``kubernetes.io`` claims), but the local cluster does not verify a signature:
it keeps the SHA-256 of every token it issued, with the account's namespace, name and uid, the
audiences and the expiry, in ``state.json`` (never the token itself). So tokens survive a restart
of the same state directory, and a token stops working when it expires, when its audiences do not
include the API server's, or when its ServiceAccount is deleted (a new account of the same name has
another uid), as bound tokens do.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import uuid
from typing import Any

from qosflow.local.clock import Clock
from qosflow.local.rbac import User, service_account_user
from qosflow.local.store import Store

API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
ISSUER = API_AUDIENCE
DEFAULT_EXPIRATION_S = 3600
MIN_EXPIRATION_S = 600
MAX_EXPIRATION_S = 2**32


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token_hash(token: str) -> str:
    """The key a token is stored under (its SHA-256, hex)."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


class Tokens:
    """Issues and recognises service-account tokens (callers hold the store lock)."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def issue(
        self,
        namespace: str,
        account: dict[str, Any],
        expiration_s: int | None,
        audiences: list[str] | None = None,
    ) -> tuple[str, float | None]:
        """A new token of ``account``; ``(token, expiry epoch or None for never)``."""
        now = self.clock.now()
        name, uid = account["metadata"]["name"], account["metadata"].get("uid", "")
        expires = None if expiration_s is None else now + expiration_s
        claims: dict[str, Any] = {
            "aud": audiences or [API_AUDIENCE],
            "iat": int(now),
            "iss": ISSUER,
            "jti": str(uuid.uuid4()),
            "kubernetes.io": {
                "namespace": namespace,
                "serviceaccount": {"name": name, "uid": uid},
            },
            "nbf": int(now),
            "sub": f"system:serviceaccount:{namespace}:{name}",
        }
        if expires is not None:
            claims["exp"] = int(expires)
        header = {"alg": "RS256", "kid": "qosflow-local"}
        token = ".".join(
            (
                _b64(json.dumps(header, separators=(",", ":")).encode()),
                _b64(json.dumps(claims, separators=(",", ":")).encode()),
                _b64(secrets.token_bytes(64)),
            )
        )
        self._prune(now)
        self.store.tokens[token_hash(token)] = {
            "namespace": namespace,
            "name": name,
            "uid": uid,
            "expires": expires,
            "audiences": claims["aud"],
        }
        self.store.mark_dirty()
        return token, expires

    def _prune(self, now: float) -> None:
        """Forget expired tokens."""
        expired = [
            key
            for key, record in self.store.tokens.items()
            if record.get("expires") is not None and float(record["expires"]) <= now
        ]
        for key in expired:
            del self.store.tokens[key]

    def user(self, token: str) -> User | None:
        """The service account a token stands for, or ``None`` when it is not (or no longer) valid."""
        record = self.store.tokens.get(token_hash(token))
        if record is None:
            return None
        expires = record.get("expires")
        if expires is not None and float(expires) <= self.clock.now():
            return None
        if API_AUDIENCE not in (record.get("audiences") or [API_AUDIENCE]):
            return None
        namespace, name = str(record.get("namespace")), str(record.get("name"))
        account = self.store.get("ServiceAccount", namespace, name)
        if account is None or account["metadata"].get("uid", "") != record.get("uid", ""):
            return None
        return service_account_user(namespace, name, str(record.get("uid") or ""))
