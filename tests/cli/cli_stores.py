"""The stores the operator-command tests work on (importable by the tests and by conftest)."""

import json
from dataclasses import dataclass
from typing import Any

from haystack_integrations.offload import FsspecToolResultStore


@dataclass(frozen=True)
class FilledStore:
    """A store holding three conversations: acme/chat-1 (with an approved invoice), acme/chat-2, globex/chat-1."""

    url: str
    storage_options: dict[str, Any]
    root: FsspecToolResultStore

    def arguments(self) -> list[str]:
        """The URL and storage options as command-line arguments."""
        return [self.url, "--storage-options", json.dumps(self.storage_options)]


@dataclass(frozen=True)
class IamEndpoint:
    """A local S3 server in its own process that checks credentials; `storage_options` hold valid admin keys."""

    bucket_url: str
    storage_options: dict[str, Any]
