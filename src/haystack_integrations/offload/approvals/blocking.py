"""
Running the approvals' async core from sync code.
"""

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """
    Run `coroutine` to its end from sync code: on a new loop here, or in a helper thread when a loop already runs here.

    :param coroutine: The coroutine.
    :returns: What it returns.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="offload-approvals") as pool:
        return pool.submit(asyncio.run, coroutine).result()
