"""
A proxy in front of Azurite that plays a storage account with a hierarchical namespace for directory SAS (``sr=d``),
which Azurite refuses outright (it has no hierarchical namespace).

Each request signed with a directory SAS is checked as Azure documents it: the signature recomputed here from the
service SAS string-to-sign (version 2020-12-06 and later, written out below, not the SDK's), for the directory named by
the first ``sdd`` segments of the blob's path (or of a listing's prefix; of each blob of a Blob Batch); the expiry; the
permission the operation needs. A request that passes goes on to Azurite with the SAS replaced by a container SAS of the
proxy's own; one that fails is answered 403 ``AuthorizationFailure`` and never reaches Azurite (``lenient=True``: it
goes on too, recorded as refused, as on an account that does not confine a SAS to its directory). Requests signed
otherwise (Shared Key) pass unchanged. Get Account Information answers ``x-ms-is-hns-enabled: true``. Every request is
recorded: method, path, query, whether it carried an ``Authorization`` header, and the verdict.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import http.client
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from support.local_http import QuietHandler, serving

# The SAS parameters of a service SAS (what the proxy replaces with its own container SAS).
SAS_PARAMETERS = frozenset(
    {"sv", "ss", "srt", "sp", "se", "st", "spr", "sip", "si", "sr", "sdd", "sig", "ses", "skoid", "sktid", "skt",
     "ske", "sks", "skv", "saoid", "suoid", "scid", "sduoid", "skdutid", "rscc", "rscd", "rsce", "rscl", "rsct"}
)  # fmt: skip
_FORBIDDEN = (
    '<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code>'
    "<Message>This request is not authorized to perform this operation.</Message></Error>"
)
_SUBREQUEST = re.compile(rb"^(DELETE) (\S+) HTTP/1\.1", re.MULTILINE)


@dataclass(frozen=True)
class Seen:
    """One request the proxy received."""

    method: str
    path: str  # without the account: ``container/blob``
    query: dict[str, str]
    authorization: bool
    allowed: bool
    subrequests: tuple[str, ...] = ()  # a Blob Batch's blobs (``container/blob``)

    @property
    def sas(self) -> bool:
        return "sig" in self.query


def string_to_sign(query: dict[str, str], account: str, container: str, directory: str) -> str:
    """
    Azure's documented string-to-sign of a service SAS signed with the account key (versions 2020-12-06 and later):
    permissions, start, expiry, canonicalized resource, identifier, IP, protocol, version, resource, snapshot time,
    encryption scope, then the five response header overrides, one per line.
    """
    resource = f"/blob/{account}/{container}/{directory}"
    fields = ["sp", "st", "se", None, "si", "sip", "spr", "sv", "sr", "snapshot", "ses"]
    fields += ["rscc", "rscd", "rsce", "rscl", "rsct"]
    return "\n".join(resource if name is None else query.get(name, "") for name in fields)


def signature(query: dict[str, str], account: str, key: str, container: str, directory: str) -> str:
    """The signature a directory SAS on ``<container>/<directory>`` carries, computed from the documented format."""
    text = string_to_sign(query, account, container, directory).encode()
    return base64.b64encode(hmac.new(base64.b64decode(key), text, hashlib.sha256).digest()).decode()


def _needs(method: str, query: dict[str, str]) -> str:
    if query.get("comp") == "list":
        return "l"
    if method in ("GET", "HEAD"):
        return "r"
    if method == "DELETE":
        return "d"
    return "w"


class DirectorySasProxy:
    """
    The proxy (a context manager): ``endpoint`` is the account's blob endpoint through it.

    :param lenient: Forward a SAS request it would refuse (still recorded with ``allowed=False``): an account that
        does not keep a directory SAS to its directory.
    :param refusal: The error code of its 403s: ``AuthorizationFailure``, or ``AuthorizationPermissionMismatch``
        (what Azure answers a SAS whose permissions do not cover the operation).
    """

    def __init__(
        self,
        upstream_port: int,
        account: str,
        key: str,
        *,
        lenient: bool = False,
        refusal: str = "AuthorizationFailure",
    ) -> None:
        self.upstream_port = upstream_port
        self.account = account
        self.key = key
        self.lenient = lenient
        self.refusal = refusal
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._server: Any = None
        self._serving: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/{self.account}"

    def snapshot(self) -> list[Seen]:
        with self._lock:
            return list(self.seen)

    def __enter__(self) -> DirectorySasProxy:
        self._serving = serving(_Handler, proxy=self)
        self._server = self._serving.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._serving.__exit__(*exc_info)

    def verdict(self, method: str, container: str, blob: str, query: dict[str, str]) -> bool:
        """Whether a directory SAS authorizes `method` on ``<container>/<blob>`` (a listing: on its prefix)."""
        if query.get("sr") != "d" or not query.get("sdd", "").isdigit():
            return False
        depth = int(query["sdd"])
        named = query.get("prefix", "") if query.get("comp") == "list" else blob
        segments = [segment for segment in named.split("/") if segment]
        if depth < 1 or len(segments) <= depth:  # the directory itself, or above it
            return False
        directory = "/".join(segments[:depth])
        expected = signature(query, self.account, self.key, container, directory)
        expiry = datetime.datetime.strptime(query.get("se", ""), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
        fresh = expiry > datetime.datetime.now(datetime.UTC)
        return hmac.compare_digest(expected, query.get("sig", "")) and fresh and _needs(method, query) in query["sp"]

    def container_sas(self, container: str) -> str:
        from azure.storage.blob import generate_container_sas

        expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
        return generate_container_sas(self.account, container, account_key=self.key, permission="racwdl", expiry=expiry)

    def record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)


def _split(target: str, account: str) -> tuple[str, str, dict[str, str]]:
    parts = urlsplit(target)
    path = unquote(parts.path).removeprefix(f"/{account}").lstrip("/")
    container, _, blob = path.partition("/")
    return container, blob, dict(parse_qsl(parts.query, keep_blank_values=True))


def _rewritten(target: str, sas: str) -> str:
    parts = urlsplit(target)
    kept = [
        (name, value) for name, value in parse_qsl(parts.query, keep_blank_values=True) if name not in SAS_PARAMETERS
    ]
    query = "&".join(f"{quote(name, safe='')}={quote(value, safe='')}" for name, value in kept)
    return f"{parts.path}?{'&'.join(filter(None, [query, sas]))}"


class _Handler(QuietHandler):
    protocol_version = "HTTP/1.1"

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        proxy: DirectorySasProxy = self.server.proxy
        body = self._body()
        container, blob, query = _split(self.path, proxy.account)
        target = self.path
        allowed = True
        subrequests: list[str] = []
        if "sig" in query:
            allowed = query.get("sr") == "d"
            sas = proxy.container_sas(container)
            if query.get("comp") == "batch":
                # Each blob of the batch is checked with the SAS its subrequest carries, and given the proxy's.
                for match in _SUBREQUEST.finditer(body):
                    sub_container, sub_blob, sub_query = _split(match.group(2).decode(), proxy.account)
                    subrequests.append(f"{sub_container}/{sub_blob}")
                    allowed = allowed and proxy.verdict("DELETE", sub_container, sub_blob, sub_query)
                body = _SUBREQUEST.sub(
                    lambda found: b"DELETE " + _rewritten(found.group(2).decode(), sas).encode() + b" HTTP/1.1", body
                )
                allowed = allowed and bool(subrequests)
            else:
                allowed = allowed and proxy.verdict(self.command, container, blob, query)
            target = _rewritten(self.path, sas)
        elif query.get("comp") == "batch":  # a Shared Key batch: its blobs recorded, passed on unchanged
            subrequests = [
                "/".join(_split(match.group(2).decode(), proxy.account)[:2]) for match in _SUBREQUEST.finditer(body)
            ]
        proxy.record(
            Seen(
                self.command, f"{container}/{blob}", query, "Authorization" in self.headers, allowed, tuple(subrequests)
            )
        )
        if not allowed and not proxy.lenient:
            refusal = _FORBIDDEN.format(code=proxy.refusal).encode()
            self.send_response(403)
            self.send_header("x-ms-error-code", proxy.refusal)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(refusal)))
            self.end_headers()
            self.wfile.write(b"" if self.command == "HEAD" else refusal)
            return
        self._forward(target, body, account_information=query.get("restype") == "account")

    def _forward(self, target: str, body: bytes, *, account_information: bool) -> None:
        proxy: DirectorySasProxy = self.server.proxy
        headers = {
            name: value
            for name, value in self.headers.items()
            if name.lower() not in ("transfer-encoding", "content-length")
        }
        headers["Content-Length"] = str(len(body))
        connection = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
        try:
            connection.request(self.command, target, body=body, headers=headers)
            answer = connection.getresponse()
            data = answer.read()
            self.send_response(answer.status, answer.reason)
            for name, value in answer.getheaders():
                if name.lower() in ("transfer-encoding", "connection", "content-length", "x-ms-is-hns-enabled"):
                    continue
                self.send_header(name, value)
            if account_information:
                self.send_header("x-ms-is-hns-enabled", "true")  # the account this proxy plays has one
            length = answer.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
            self.send_header("Content-Length", length or "0")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            connection.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


def tenant_requests(seen: list[Seen]) -> Iterator[Seen]:
    """The requests signed with a SAS (a tenant's)."""
    return (request for request in seen if request.sas)
