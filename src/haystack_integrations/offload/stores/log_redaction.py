"""
Secrets out of third-party log records: botocore and aiobotocore log, at DEBUG, the requests they send (SSE-C keys and
session tokens in the headers, signatures) and the bodies they receive (STS's secret keys and session tokens).

`install` wraps the process's log record factory once: each record from those libraries' loggers has the values of
secret-bearing headers, fields and XML elements replaced by ``<redacted>`` before any filter or handler sees it.
A factory rather than a filter on the ``botocore`` logger: a logger's filters do not see records propagated from its
children (``botocore.endpoint``, ``botocore.auth``, ``botocore.parsers``), and handlers are the application's.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

REDACTED = "<redacted>"
# The libraries that log requests and responses; records of every other logger are left as they are.
_LOGGERS = ("botocore", "aiobotocore", "boto3", "s3transfer", "s3fs", "fsspec", "urllib3", "aiohttp", "obstore")
_PREFIXES = tuple(f"{name}." for name in _LOGGERS)
_REDACTED_FIELDS = (
    r"x-amz-(?:copy-source-)?server-side-encryption-customer-key(?:-md5)?"
    r"|x-amz-security-token|x-amz-signature"
    r"|(?:CopySource)?SSECustomerKey(?:MD5)?|SecretAccessKey|SessionToken|aws_secret_access_key|aws_session_token"
    r"|Signature"
)
# A name, then what joins it to its value in a dict repr (': '), a header line (':'), a query or Authorization
# header ('='), an XML element ('>'), or botocore.auth's "Signature:\n"; then the value: a quoted string (bytes repr
# included, escapes and all) or a run of characters up to the next delimiter.
_SECRET = re.compile(
    rf"(?P<name>\b(?:{_REDACTED_FIELDS}))(?P<join>['\"]?[ \t]*(?:[:=>])\s*)"
    r"(?P<value>b?'(?:[^'\\]|\\.)*'|b?\"(?:[^\"\\]|\\.)*\"|[^\s'\",;&<}\]]+)",
    re.IGNORECASE,
)
_lock = threading.Lock()
_installed = False


def _replacement(match: re.Match[str]) -> str:
    value = match.group("value")
    if value[-1:] in {"'", '"'}:  # keep the quotes (and a bytes prefix) so the message still reads as a repr
        opening = value[: value.index(value[-1]) + 1]
        value = f"{opening}{REDACTED}{value[-1]}"
    else:
        value = REDACTED
    return f"{match.group('name')}{match.group('join')}{value}"


def redact(text: str) -> str:
    """
    `text` with the value of every secret-bearing header, field or XML element replaced by ``<redacted>``.

    :param text: A log message.
    :returns: The message without SSE-C keys, STS secret keys, session tokens or request signatures.
    """
    return _SECRET.sub(_replacement, text)


def _redact_record(record: logging.LogRecord) -> None:
    """Replace a library record's message by its redacted text, formatted once (its arguments carry the secrets)."""
    if record.name not in _LOGGERS and not record.name.startswith(_PREFIXES):
        return
    try:
        message = record.getMessage()
    except Exception:  # a malformed record is the handler's to report, as logging does
        return
    redacted = redact(message)
    if redacted != message:
        record.msg, record.args = redacted, None


def install() -> None:
    """
    Redact secrets from botocore's, aiobotocore's and s3fs's records in this process, from now on (idempotent).

    Stores call it when they are given per-tenant credentials or SSE-C keys. An application that later replaces the
    log record factory should wrap the one it finds, as this does.
    """
    global _installed  # once per process, whatever number of stores ask
    with _lock:
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            _redact_record(record)
            return record

        logging.setLogRecordFactory(factory)
        _installed = True
