"""Whether a decision's edited arguments are acceptable: same tool, and valid against the tool's parameter schema."""

from typing import Any

# jsonschema ships no type information (Haystack depends on it to check tool schemas; so do we, for edits).
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]

from haystack_integrations.offload.approvals.approval_records import ApprovalRequest, Decision
from haystack_integrations.offload.approvals.errors import InvalidApprovalEditError

_MAX_LISTED_ERRORS = 5


def check_tool_name(claimed: str | None, tool_name: str) -> None:
    """
    Refuse a decision that names another tool: an approval can change arguments, never the tool.

    :param claimed: The tool name the decision carries, if any.
    :param tool_name: The tool the request is about.
    :raises InvalidApprovalEditError: If `claimed` is set and differs.
    """
    if claimed is not None and claimed != tool_name:
        raise InvalidApprovalEditError(
            f"This request is for tool {tool_name!r}; a decision cannot change it to {claimed!r}."
        )


def validated_arguments(tool_name: str, parameters: dict[str, Any], arguments: object) -> dict[str, Any]:
    """
    Validate edited arguments against the tool's JSON schema (`Tool.parameters`, draft 2020-12 as Haystack uses).

    :param tool_name: The tool, for messages.
    :param parameters: The tool's parameter schema.
    :param arguments: The edited arguments.
    :returns: The arguments, as a new dictionary.
    :raises InvalidApprovalEditError: If they are not a JSON object with string keys, or fail the schema; the message
        lists the first few problems with their paths.
    """
    if not isinstance(arguments, dict) or not all(isinstance(key, str) for key in arguments):
        raise InvalidApprovalEditError(
            f"Edited arguments for {tool_name!r} must be an object with string keys, got {type(arguments).__name__}."
        )
    try:
        validator = Draft202012Validator(parameters)
        errors = sorted(validator.iter_errors(arguments), key=lambda error: list(error.absolute_path))
    except SchemaError as error:  # pragma: no cover - Haystack's Tool refuses invalid schemas at construction
        raise InvalidApprovalEditError(
            f"The parameter schema of {tool_name!r} is not valid: {error.message}"
        ) from error
    if errors:
        problems = "; ".join(
            f"{'/'.join(str(part) for part in error.absolute_path) or '(arguments)'}: {error.message}"
            for error in errors[:_MAX_LISTED_ERRORS]
        )
        more = f" (and {len(errors) - _MAX_LISTED_ERRORS} more)" if len(errors) > _MAX_LISTED_ERRORS else ""
        raise InvalidApprovalEditError(f"Edited arguments for {tool_name!r} are not valid: {problems}{more}.")
    return dict(arguments)


def approved_arguments(request: ApprovalRequest, decision: Decision) -> tuple[dict[str, Any], bool]:
    """
    The arguments an approval lets the call run with, checked against the request.

    :param request: The request decided.
    :param decision: The decision (an approval; a denial is only checked for its tool name).
    :returns: ``(arguments, edited)``.
    :raises InvalidApprovalEditError: If the decision names another tool or its edited arguments are not valid.
    """
    check_tool_name(decision.tool_name, request.tool_name)
    if decision.arguments is None:
        return dict(request.arguments), False
    arguments = validated_arguments(request.tool_name, request.parameters, decision.arguments)
    return arguments, arguments != request.arguments
