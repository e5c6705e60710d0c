"""
One tenant's downscoped GCS token, as a google-auth ``Credentials`` gcsfs takes for ``token=``: the worker's token
exchanged at Google's STS under a Credential Access Boundary, refreshed in place before it expires.
"""

from __future__ import annotations

import copy
import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import google.auth.exceptions
import google.auth.transport.requests
from google.auth import credentials
from google.oauth2 import sts

from haystack_integrations.offload.errors import StorageError, StoragePermissionError
from haystack_integrations.offload.stores.options import DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT

logger = logging.getLogger(__name__)

# OAuth 2.0 token exchange (RFC 8693) names, not secrets.
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"  # noqa: S105
ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token"  # noqa: S105
# Attempts per exchange: what is transient (no answer, 429, 5xx) is asked again after a short pause; a refusal never.
STS_ATTEMPTS = 3
_PAUSE_SECONDS = 0.2


class _Transport:
    """google-auth's requests transport with the store's timeouts, keeping the last answer's status."""

    def __init__(self, session: Any) -> None:
        self._inner = google.auth.transport.requests.Request(session)
        self.status: int | None = None

    def __call__(self, url: str, method: str = "GET", body: Any = None, headers: Any = None, **kwargs: Any) -> Any:
        self.status = None
        kwargs["timeout"] = (DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT)  # google-auth's default waits 120 s
        response = self._inner(url, method=method, body=body, headers=headers, **kwargs)
        self.status = response.status
        return response


class DownscopedToken(credentials.Credentials):
    """
    A tenant's token on ``gs://``: the source's token exchanged for one limited by `boundary`, renewed in place.

    The store renews it in a worker thread before a request when it is `due`; gcsfs calls `refresh` itself only when
    it finds the token within five minutes of expiry, and that call exchanges nothing unless the token is due.

    :param source: The worker's credentials (refreshed first when they are not valid for `renew_before` more).
    :param boundary: The Credential Access Boundary (`gcs_credentials.tenant_access_boundary`).
    :param token_url: Google's STS token endpoint.
    :param renew_before: Renew this long before expiry (a token shorter-lived than that: at half its life).
    :param session: The ``requests`` session the exchanges use.
    :param counted: Called once per exchange sent (the source's `calls`).
    """

    def __init__(
        self,
        source: credentials.Credentials,
        boundary: Mapping[str, Any],
        *,
        token_url: str,
        renew_before: datetime.timedelta,
        session: Any,
        counted: Callable[[], None],
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._source = source
        self._boundary = copy.deepcopy(dict(boundary))
        self._sts = sts.Client(token_url)  # type: ignore[no-untyped-call]
        self._renew_before = renew_before
        self._session = session
        self._counted = counted
        self._lock = threading.Lock()
        self._renew_at: datetime.datetime | None = None

    @property
    def boundary(self) -> dict[str, Any]:
        """The Credential Access Boundary each exchange sends."""
        return copy.deepcopy(self._boundary)

    def storage_options(self) -> dict[str, Any]:
        """gcsfs's option that sends this token (``token=``: gcsfs takes google-auth credentials)."""
        return {"token": self}

    def due(self) -> bool:
        """Whether the token is missing or due for renewal."""
        renew_at = self._renew_at
        return self.token is None or (renew_at is not None and _utcnow() >= renew_at)

    def refresh(self, request: Any) -> None:
        """
        google-auth's refresh: exchange the source's token for a downscoped one, unless the current one is not due.

        :param request: A google-auth transport (the store's own is used: it bounds each attempt's time).
        :raises StoragePermissionError: If STS or the source refused (the details logged, not in the message).
        :raises StorageError: If STS could not be reached or failed after `STS_ATTEMPTS` attempts.
        """
        with self._lock:
            if self.due():
                self._exchange()

    def _exchange(self) -> None:
        for attempt in range(1, STS_ATTEMPTS + 1):
            transport = _Transport(self._session)
            try:
                self._exchange_once(transport)
                return
            except google.auth.exceptions.GoogleAuthError as error:
                status = transport.status
                if isinstance(error, google.auth.exceptions.TransportError):
                    transient = True  # no answer: refused connection, timeout
                elif status is not None:
                    transient = status == 429 or status >= 500
                else:
                    transient = bool(getattr(error, "retryable", False))
                if transient and attempt < STS_ATTEMPTS:
                    time.sleep(_PAUSE_SECONDS * attempt)
                    continue
                raise _failure(error, status) from error

    def _exchange_once(self, transport: _Transport) -> None:
        source = self._source
        expiry = source.expiry
        if not source.valid or (expiry is not None and expiry - _utcnow() <= self._renew_before):
            # A downscoped token expires with the token it was exchanged from.
            source.refresh(transport)  # type: ignore[no-untyped-call]
        transport.status = None
        now = _utcnow()
        self._counted()
        answer = self._sts.exchange_token(  # type: ignore[no-untyped-call]
            request=transport,
            grant_type=TOKEN_EXCHANGE,
            subject_token=source.token,
            subject_token_type=ACCESS_TOKEN,
            requested_token_type=ACCESS_TOKEN,
            additional_options=self._boundary,
        )
        token = answer.get("access_token")
        if not isinstance(token, str) or not token:
            raise google.auth.exceptions.RefreshError("Google STS answered without an access token.")  # type: ignore[no-untyped-call]
        lifetime = answer.get("expires_in")
        # STS may leave the lifetime out of a downscoped token's answer: it expires with its source's token.
        expiry = now + datetime.timedelta(seconds=float(lifetime)) if lifetime else source.expiry
        self.token, self.expiry = token, expiry
        if expiry is None:
            self._renew_at = None
        elif expiry - now > self._renew_before:
            self._renew_at = expiry - self._renew_before
        else:  # a source token near its end gives a short-lived one: renewed at half its life, not at every request
            self._renew_at = now + (expiry - now) / 2


def _utcnow() -> datetime.datetime:
    # google-auth keeps expiries as naive UTC datetimes.
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


def _failure(error: BaseException, status: int | None) -> Exception:
    # The message may reach a model: what STS or the source said is logged, not put in it.
    logger.warning("Could not get a downscoped GCS token (HTTP %s): %s", status, error)
    what = f"HTTP {status}" if status is not None else type(error).__name__
    message = f"Could not get this tenant's storage credentials from Google STS or its source: {what}."
    refused = status in (400, 401, 403) or (status is None and isinstance(error, google.auth.exceptions.RefreshError))
    return (StoragePermissionError if refused else StorageError)(message)
