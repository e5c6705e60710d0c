"""
Azurite over HTTPS with its basic OAuth mode (``--oauth basic``: it checks a bearer token's audience, issuer and
expiry, not its signature), for what needs an Azure AD identity: user delegation keys. A self-signed certificate for
127.0.0.1 is made with openssl; `ca_bundle` is what a client must trust.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support.azurite import ACCOUNT, _free_port

# Any object and tenant ids: basic mode checks the token's shape and times only.
OBJECT_ID = "23657296-5cd5-45b0-a809-d972a7f4dfe1"
TENANT_ID = "dd0d0df1-06c3-436c-8034-4b9a153097ce"


def _part(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


class FakeIdentity:
    """An azure-core token credential whose unsigned JWTs Azurite's basic OAuth mode accepts; counts its tokens."""

    def __init__(self, audience: str = "https://storage.azure.com") -> None:
        """:param audience: The token's audience (another one: a token Azurite refuses)."""
        self.audience = audience
        self.tokens = 0

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        self.tokens += 1
        now = int(time.time())
        claims = {
            "aud": self.audience,
            "iss": f"https://sts.windows.net/{TENANT_ID}/",
            "iat": now,
            "nbf": now,
            "exp": now + 3600,
            "oid": OBJECT_ID,
            "tid": TENANT_ID,
        }
        return AccessToken(f"{_part({'alg': 'none', 'typ': 'JWT'})}.{_part(claims)}.unsigned", now + 3600)


@contextlib.contextmanager
def azurite_with_oauth() -> Iterator[tuple[str, str]]:
    """
    Start Azurite with HTTPS and basic OAuth on a free loopback port.

    :returns: Its blob endpoint (``https://127.0.0.1:<port>/devstoreaccount1``) and the certificate file to trust.
    """
    openssl, azurite = shutil.which("openssl"), shutil.which("azurite-blob")
    if openssl is None or azurite is None:
        raise RuntimeError("openssl and azurite-blob are needed on PATH")
    folder = Path(tempfile.mkdtemp(prefix="azurite-oauth-"))
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    port = _free_port()
    process = subprocess.Popen(
        [azurite, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence", "--silent",
         "--skipApiVersionCheck", "--disableTelemetry", "--oauth", "basic", "--cert", str(cert), "--key", str(key)],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"Azurite (OAuth) did not listen on port {port}")
        yield f"https://127.0.0.1:{port}/{ACCOUNT}", str(cert)
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)
