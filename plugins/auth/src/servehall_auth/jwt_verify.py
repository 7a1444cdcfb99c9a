"""JWT bearer tokens verified with local public keys (PyJWT).

Keys come from a JWKS file and/or PEM public-key files named in ``[auth.jwt]``; nothing
is fetched over the network. The allowed algorithms are pinned in config: the token's
``alg`` header only selects among them, ``none`` and HMAC algorithms are never accepted,
and a key is only used with an algorithm of its own family (an RSA key never verifies
an ES256 token). ``iss``, ``aud``, ``exp`` and the configured required claims must be
present; ``exp``/``nbf`` allow ``leeway_s`` seconds of clock skew.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jwt
from jwt.algorithms import get_default_algorithms

from servehall import SCOPE_INFERENCE, AuthenticationError, ConfigError, Limits, Policy, Principal
from servehall_auth.settings import PRIORITY_LIMIT, JwtSettings

_FAMILY = {
    "RS": "RSA",
    "PS": "RSA",
    "ES": "EC",
    "Ed": "OKP",
}


def _family_of_alg(alg: str) -> str:
    return _FAMILY[alg[:2]]


def _family_of_key(key: Any) -> str:
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

    if isinstance(key, rsa.RSAPublicKey):
        return "RSA"
    if isinstance(key, ec.EllipticCurvePublicKey):
        return "EC"
    if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return "OKP"
    raise ConfigError(f"unsupported JWT public key type {type(key).__name__}")


@dataclass(frozen=True, slots=True)
class _Key:
    kid: str | None
    family: str
    key: Any


def _load_keys(cfg: JwtSettings) -> list[_Key]:
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    keys: list[_Key] = []
    if cfg.jwks_file is not None:
        try:
            data = json.loads(cfg.jwks_file.expanduser().read_text(encoding="utf-8"))
            for jwk in data["keys"]:
                if jwk.get("use", "sig") != "sig":
                    continue
                if "d" in jwk:
                    raise ConfigError(
                        f"auth.jwt.jwks_file {cfg.jwks_file}: holds a private key; "
                        "give only public keys"
                    )
                key = jwt.PyJWK(jwk).key
                keys.append(_Key(jwk.get("kid"), _family_of_key(key), key))
        except ConfigError:
            raise
        except (OSError, ValueError, KeyError, TypeError, jwt.PyJWKError) as exc:
            raise ConfigError(
                f"auth.jwt.jwks_file {cfg.jwks_file}: cannot load ({type(exc).__name__})"
            ) from None
    for path in cfg.public_key_files:
        try:
            key = load_pem_public_key(path.expanduser().read_bytes())
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"auth.jwt.public_key_files {path}: not a PEM public key ({type(exc).__name__})"
            ) from None
        keys.append(_Key(path.stem, _family_of_key(key), key))
    if not keys:
        raise ConfigError("auth.jwt: no usable public keys")
    return keys


def _scopes(value: Any) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return frozenset(value)
    raise AuthenticationError("The token's scope claim is malformed.", code="invalid_token")


class JwtVerifier:
    """Verifies bearer JWTs and maps their claims to a :class:`servehall.Principal`.

    Raises:
        ConfigError: at construction, when the key material cannot be loaded.
    """

    def __init__(self, cfg: JwtSettings) -> None:
        self.cfg = cfg
        self._keys = _load_keys(cfg)
        supported = get_default_algorithms()
        missing = [a for a in cfg.algorithms if a not in supported]
        if missing:
            raise ConfigError(f"auth.jwt.algorithms: not supported here: {', '.join(missing)}")

    def _candidates(self, header: dict[str, Any]) -> list[_Key]:
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.cfg.algorithms:
            raise AuthenticationError(
                "The token's algorithm is not accepted.", code="invalid_token"
            )
        family = _family_of_alg(alg)
        kid = header.get("kid")
        keys = [k for k in self._keys if k.family == family]
        if kid is not None:
            keys = [k for k in keys if k.kid == kid] or [k for k in keys if k.kid is None]
        if not keys:
            raise AuthenticationError("No key is known for this token.", code="invalid_token")
        return keys

    def verify(self, token: str) -> Principal:
        """Verify ``token`` and return its principal.

        Raises:
            AuthenticationError: malformed, wrong algorithm, unknown key, bad signature,
                wrong issuer/audience, expired or not yet valid, missing claims. The
                message names the reason, never the token.
        """
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise AuthenticationError(
                "The bearer token is malformed.", code="invalid_token"
            ) from None
        for cand in self._candidates(header):
            try:
                claims = jwt.decode(
                    token,
                    key=cand.key,
                    algorithms=[header["alg"]],
                    audience=self.cfg.audience,
                    issuer=self.cfg.issuer,
                    leeway=self.cfg.leeway_s,
                    options={
                        "require": sorted({"iss", "aud", "exp", *self.cfg.required_claims}),
                        "verify_signature": True,
                        "verify_exp": True,
                        "verify_nbf": True,
                        "verify_iat": True,
                        "verify_aud": True,
                        "verify_iss": True,
                    },
                )
            except jwt.InvalidSignatureError:
                continue  # try the next key of the family (no kid, or a shared kid)
            except jwt.ExpiredSignatureError:
                raise AuthenticationError("The token has expired.", code="token_expired") from None
            except jwt.ImmatureSignatureError:
                raise AuthenticationError(
                    "The token is not valid yet.", code="invalid_token"
                ) from None
            except jwt.InvalidAudienceError:
                raise AuthenticationError(
                    "The token's audience is not accepted.", code="invalid_token"
                ) from None
            except jwt.InvalidIssuerError:
                raise AuthenticationError(
                    "The token's issuer is not accepted.", code="invalid_token"
                ) from None
            except jwt.MissingRequiredClaimError as exc:
                raise AuthenticationError(
                    f"The token lacks the required claim {exc.claim!r}.", code="invalid_token"
                ) from None
            except jwt.PyJWTError:
                raise AuthenticationError(
                    "The bearer token is invalid.", code="invalid_token"
                ) from None
            return self._principal(claims)
        raise AuthenticationError("The token's signature does not verify.", code="invalid_token")

    def _principal(self, claims: dict[str, Any]) -> Principal:
        cfg = self.cfg
        sub = claims.get(cfg.subject_claim)
        if not isinstance(sub, str) or not sub:
            raise AuthenticationError("The token has no subject.", code="invalid_token")
        tenant = claims.get(cfg.tenant_claim)
        if tenant is not None and not isinstance(tenant, str):
            raise AuthenticationError(
                "The token's tenant claim is malformed.", code="invalid_token"
            )
        scopes = _scopes(claims.get(cfg.scopes_claim))
        if scopes is None:
            scopes = frozenset(cfg.default_scopes or [SCOPE_INFERENCE])
        models: frozenset[str] | None = None
        if cfg.models_claim is not None and cfg.models_claim in claims:
            raw = claims[cfg.models_claim]
            if not isinstance(raw, list) or not all(isinstance(m, str) for m in raw):
                raise AuthenticationError(
                    "The token's models claim is malformed.", code="invalid_token"
                )
            models = frozenset(raw)
        limits: dict[str, int] = {}
        for name, claim in (("rpm", cfg.rpm_claim), ("tpm", cfg.tpm_claim)):
            if claim is not None and isinstance(claims.get(claim), int) and claims[claim] > 0:
                limits[name] = int(claims[claim])
        priority: int | None = None
        if cfg.priority_claim is not None and cfg.priority_claim in claims:
            prio = claims[cfg.priority_claim]
            if (
                not isinstance(prio, int)
                or isinstance(prio, bool)
                or not -PRIORITY_LIMIT <= prio <= PRIORITY_LIMIT
            ):
                raise AuthenticationError(
                    "The token's priority claim is malformed.", code="invalid_token"
                )
            priority = prio
        return Principal(
            id=f"jwt:{sub}",
            tenant=tenant,
            kind="jwt",
            policy=Policy(
                scopes=scopes,
                models=models,
                limits=Limits(rpm=limits.get("rpm"), tpm=limits.get("tpm")),
                priority=priority,
            ),
        )
