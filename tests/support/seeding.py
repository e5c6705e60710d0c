"""Results put straight into a test bucket (no store, no quota): a tenant or session of a given size, in seconds."""

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from haystack_integrations.offload.stores.names import new_object_name


def seed_results(
    server: Any, prefix: str, count: int, *, per_session: int | None = None, body: bytes = b"x", tenant: str = "acme"
) -> None:
    """
    Put `count` results of a tenant below `prefix`, named as the store names them.

    :param server: An S3 server fixture (moto's or the real one's): `client()` and `bucket`.
    :param prefix: The root's prefix in the bucket.
    :param count: How many results.
    :param per_session: Results per session (``chat-0``, ``chat-1``, ...); None: all in ``chat-1``.
    :param body: Each result's content.
    :param tenant: The tenant.
    """
    keys = [
        f"{prefix}/{tenant}/{f'chat-{index // per_session}' if per_session else 'chat-1'}/"
        f"{new_object_name(key=f'{index}.txt', kind='text', tool_name='t')}"
        for index in range(count)
    ]
    client = server.client()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda key: client.put_object(Bucket=server.bucket, Key=key, Body=body), keys))
