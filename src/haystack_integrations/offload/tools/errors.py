"""
Failures of the read-back tools, worded for the model that called them.

A bad reference, a result that is not there, a store that fails: the model gets a short message it can act on (ask
for another reference, list the results, stop), and the run goes on. Messages never carry a backend's own text, which
may name the bucket or other tenants' paths; that stays in the log.
"""

import logging

from haystack_integrations.offload.errors import (
    InvalidReferenceError,
    OffloadError,
    ResultNotFoundError,
    StorageError,
    StoragePermissionError,
)

logger = logging.getLogger(__name__)


class ReadBackToolError(OffloadError):
    """A read-back tool call failed; the message is safe to show to the model."""


def message_for(error: Exception, *, tool_name: str) -> str:
    """
    Turn an exception raised while serving a tool call into a message for the model.

    This library's own errors carry messages written to be shown (they never name the bucket or other tenants); any
    other store's errors are summarised by kind and logged in full.

    :param error: The exception.
    :param tool_name: The tool that was called, for the log.
    :returns: The message.
    """
    if isinstance(error, ReadBackToolError | InvalidReferenceError | ResultNotFoundError):
        return str(error)
    if isinstance(error, StoragePermissionError | StorageError):
        logger.warning("%s: storage failed: %s", tool_name, error, exc_info=error)
        return f"{error} Try again later."
    logger.warning("%s failed: %r", tool_name, error, exc_info=error)
    if isinstance(error, FileNotFoundError):
        return "No stored result exists under this reference in this conversation."
    if isinstance(error, PermissionError):
        return "The store refused to read this reference."
    if isinstance(error, ValueError):
        return "The store refused this reference: it is not one of this conversation's stored results."
    return f"The result could not be read ({type(error).__name__})."
