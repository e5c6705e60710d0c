"""A service account key made up for tests: a fresh RSA key, in the JSON shape Google's console gives."""

from typing import Any

GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"  # noqa: S105 - an endpoint, not a secret


def service_account_key(token_uri: str = GOOGLE_TOKEN_URI) -> dict[str, Any]:
    """A service account's key whose token endpoint is `token_uri` (a local fake's, where a test asks for tokens)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return {
        "type": "service_account",
        "project_id": "offload-tests",
        "private_key_id": "worker",
        "private_key": pem.decode(),
        "client_email": "worker@offload-tests.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }
