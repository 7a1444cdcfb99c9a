"""JWT verification with keys generated here (RS256, ES256), and the attacks it refuses."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from servehall import AuthenticationError, ConfigError
from servehall_auth.jwt_verify import JwtVerifier
from servehall_auth.settings import JwtSettings

ISS = "https://idp.test"
AUD = "servehall"


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def pem(key: Any) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@pytest.fixture
def jwks_file(tmp_path: Path, rsa_key: rsa.RSAPrivateKey, ec_key: Any) -> Path:
    keys = []
    for kid, k in (("r1", rsa_key), ("e1", ec_key)):
        jwk = json.loads(
            jwt.algorithms.get_default_algorithms()["RS256" if kid == "r1" else "ES256"].to_jwk(
                k.public_key()
            )
        )
        jwk["kid"] = kid
        keys.append(jwk)
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": keys}))
    return path


def claims(**kw: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {
        "iss": ISS,
        "aud": AUD,
        "sub": "alice",
        "iat": now,
        "exp": now + 300,
        "tenant": "team-a",
        "scope": "inference admin",
    }
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


def verifier(jwks: Path, **kw: Any) -> JwtVerifier:
    cfg = {"issuer": ISS, "audience": AUD, "algorithms": ["RS256", "ES256"], "jwks_file": jwks}
    cfg.update(kw)
    return JwtVerifier(JwtSettings(**cfg))


def test_rs256_and_es256_from_jwks(jwks_file: Path, rsa_key: Any, ec_key: Any) -> None:
    v = verifier(jwks_file)
    p = v.verify(jwt.encode(claims(), rsa_key, "RS256", headers={"kid": "r1"}))
    assert p.id == "jwt:alice" and p.tenant == "team-a" and p.kind == "jwt"
    assert p.policy.scopes == frozenset({"inference", "admin"})
    assert p.policy.models is None
    p = v.verify(jwt.encode(claims(models=["demo"]), ec_key, "ES256", headers={"kid": "e1"}))
    assert p.policy.models == frozenset({"demo"})


def test_static_pem_keys(tmp_path: Path, ec_key: Any) -> None:
    f = tmp_path / "ec.pem"
    f.write_bytes(pem(ec_key))
    v = JwtVerifier(
        JwtSettings(issuer=ISS, audience=[AUD], algorithms=["ES256"], public_key_files=[f])
    )
    assert v.verify(jwt.encode(claims(), ec_key, "ES256")).id == "jwt:alice"


def expect_401(v: JwtVerifier, token: str, code: str = "invalid_token") -> AuthenticationError:
    with pytest.raises(AuthenticationError) as ei:
        v.verify(token)
    assert ei.value.status == 401 and ei.value.code == code
    assert token not in ei.value.message
    return ei.value


def test_wrong_algorithm_not_pinned(jwks_file: Path, rsa_key: Any) -> None:
    v = verifier(jwks_file, algorithms=["ES256"])
    expect_401(v, jwt.encode(claims(), rsa_key, "RS256", headers={"kid": "r1"}))
    v = verifier(jwks_file)
    expect_401(v, jwt.encode(claims(), rsa_key, "RS384", headers={"kid": "r1"}))


def test_hs256_with_public_key_as_secret_is_refused(jwks_file: Path, rsa_key: Any) -> None:
    # classic key-confusion attack: sign HS256 with the server's public key bytes
    header = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=")
    payload = base64.urlsafe_b64encode(json.dumps(claims()).encode()).rstrip(b"=")
    import hashlib
    import hmac

    sig = hmac.new(pem(rsa_key), header + b"." + payload, hashlib.sha256).digest()
    token = b".".join([header, payload, base64.urlsafe_b64encode(sig).rstrip(b"=")]).decode()
    expect_401(verifier(jwks_file), token)


def test_alg_none(jwks_file: Path) -> None:
    token = jwt.encode(claims(), None, algorithm="none")
    expect_401(verifier(jwks_file), token)
    with pytest.raises(ValueError):
        JwtSettings(issuer=ISS, audience=AUD, algorithms=["none"], jwks_file=jwks_file)  # type: ignore[list-item]


def test_wrong_audience_and_issuer(jwks_file: Path, rsa_key: Any) -> None:
    v = verifier(jwks_file)
    expect_401(v, jwt.encode(claims(aud="other"), rsa_key, "RS256", headers={"kid": "r1"}))
    expect_401(v, jwt.encode(claims(aud=None), rsa_key, "RS256", headers={"kid": "r1"}))
    expect_401(v, jwt.encode(claims(iss="https://evil"), rsa_key, "RS256", headers={"kid": "r1"}))
    expect_401(v, jwt.encode(claims(iss=None), rsa_key, "RS256", headers={"kid": "r1"}))


def test_expired_and_leeway(jwks_file: Path, rsa_key: Any) -> None:
    now = int(time.time())
    v = verifier(jwks_file, leeway_s=30)
    old = jwt.encode(claims(exp=now - 60, iat=now - 120), rsa_key, "RS256", headers={"kid": "r1"})
    expect_401(v, old, code="token_expired")
    recent = jwt.encode(
        claims(exp=now - 10, iat=now - 120), rsa_key, "RS256", headers={"kid": "r1"}
    )
    assert v.verify(recent).id == "jwt:alice"  # inside the leeway
    expect_401(verifier(jwks_file, leeway_s=0), recent, code="token_expired")
    expect_401(v, jwt.encode(claims(exp=None), rsa_key, "RS256", headers={"kid": "r1"}))


def test_not_before(jwks_file: Path, rsa_key: Any) -> None:
    now = int(time.time())
    v = verifier(jwks_file, leeway_s=5)
    expect_401(v, jwt.encode(claims(nbf=now + 120), rsa_key, "RS256", headers={"kid": "r1"}))
    assert v.verify(jwt.encode(claims(nbf=now + 2), rsa_key, "RS256", headers={"kid": "r1"}))


def test_bad_signature_and_unknown_key(jwks_file: Path, rsa_key: Any) -> None:
    v = verifier(jwks_file)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    expect_401(v, jwt.encode(claims(), other, "RS256", headers={"kid": "r1"}))
    expect_401(v, jwt.encode(claims(), other, "RS256", headers={"kid": "nope"}))
    good = jwt.encode(claims(), rsa_key, "RS256", headers={"kid": "r1"})
    h, _p, s = good.split(".")
    tampered_payload = (
        base64.urlsafe_b64encode(json.dumps(claims(scope="admin", sub="mallory")).encode())
        .rstrip(b"=")
        .decode()
    )
    expect_401(v, f"{h}.{tampered_payload}.{s}")


@pytest.mark.parametrize("token", ["a.b.c", "x.y", "....", "eyJhbGciOiJSUzI1NiJ9.e30.", "é.b.c"])
def test_malformed(jwks_file: Path, token: str) -> None:
    with pytest.raises(AuthenticationError):
        verifier(jwks_file).verify(token)


def test_claim_mapping_and_defaults(jwks_file: Path, rsa_key: Any) -> None:
    v = verifier(jwks_file, tenant_claim="org", scopes_claim="scp", rpm_claim="rpm")
    t = jwt.encode(
        claims(org="acme", scp=["inference"], rpm=7, scope=None, tenant=None),
        rsa_key,
        "RS256",
        headers={"kid": "r1"},
    )
    p = v.verify(t)
    assert (
        p.tenant == "acme"
        and p.policy.scopes == frozenset({"inference"})
        and p.policy.limits.rpm == 7
    )
    t = jwt.encode(claims(scope=None), rsa_key, "RS256", headers={"kid": "r1"})
    assert verifier(jwks_file).verify(t).policy.scopes == frozenset({"inference"})


def test_config_refuses_private_keys_and_missing_keys(tmp_path: Path, rsa_key: Any) -> None:
    priv = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key))
    f = tmp_path / "jwks.json"
    f.write_text(json.dumps({"keys": [priv]}))
    with pytest.raises(ConfigError):
        JwtVerifier(JwtSettings(issuer=ISS, audience=AUD, algorithms=["RS256"], jwks_file=f))
    with pytest.raises(ValueError):
        JwtSettings(issuer=ISS, audience=AUD, algorithms=["RS256"])
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    with pytest.raises(ConfigError):
        JwtVerifier(
            JwtSettings(issuer=ISS, audience=AUD, algorithms=["RS256"], public_key_files=[bad])
        )


def test_priority_claim(jwks_file: Path, rsa_key: Any) -> None:
    v = verifier(jwks_file, priority_claim="prio")
    t = jwt.encode(claims(prio=3), rsa_key, "RS256", headers={"kid": "r1"})
    assert v.verify(t).policy.priority == 3
    t = jwt.encode(claims(), rsa_key, "RS256", headers={"kid": "r1"})
    assert v.verify(t).policy.priority is None  # unset: the tenant's default, else 0
    t = jwt.encode(claims(prio=0), rsa_key, "RS256", headers={"kid": "r1"})
    assert v.verify(t).policy.priority == 0  # an explicit 0
    for bad in ("high", 1.5, True, 5000):
        t = jwt.encode(claims(prio=bad), rsa_key, "RS256", headers={"kid": "r1"})
        expect_401(v, t)
    # without priority_claim configured the claim is ignored
    t = jwt.encode(claims(prio=3), rsa_key, "RS256", headers={"kid": "r1"})
    assert verifier(jwks_file).verify(t).policy.priority is None
