"""What the server does with the parts of a request it cannot serve as sent: hosted tools
and images for a model without vision (`--hosted-tools`, `--images`).

Clients such as Codex CLI send hosted tool types (`web_search`) and images by default;
`screen` refuses them with a 400 that names the setting, or lets the request through
without them (hosted tools dropped from what the model sees, images read as a
placeholder when the prompt is rendered).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel.errors import InvalidRequest, UnsupportedFeature
from mlxcel.generation import ModelInfo
from mlxcel.items import IMAGE_PLACEHOLDER, Item, JsonValue, has_images
from mlxcel.prepare.params import ResponseParams

log = logging.getLogger(__name__)

SERVED_TOOL_TYPES = frozenset({"function", "namespace", "custom"})
"""Tool types this server offers the model; every other type is a hosted tool."""
HOSTED_TOOLS_HINT = (
    "this server runs no hosted tools. Start it with `--hosted-tools ignore` to drop "
    "them from requests, or stop the client sending them (for Codex CLI, set "
    '`web_search = "disabled"` in its config.toml)'
)
IMAGES_HINT = (
    "this model cannot see images. Start the server with `--images placeholder` to "
    "have each image replaced by a short note instead"
)
# Tool types are client-chosen strings: only this many distinct ones are ever logged.
_LOGGED_TYPES_CAP = 64
_logged_types: set[str] = set()


@dataclass(frozen=True, slots=True)
class ClientPolicy:
    """The server's answers to what it cannot serve as sent."""

    ignore_hosted_tools: bool = False
    """`--hosted-tools ignore`: drop hosted tools rather than answer 400."""
    image_placeholders: bool = True
    """`--images placeholder`: a model without vision reads a note for each image
    rather than the request answering 400."""


def screen(params: ResponseParams, policy: ClientPolicy, info: ModelInfo) -> ResponseParams:
    """`params` as this server serves them: hosted tools refused or dropped (a
    `tool_choice` naming a dropped type becomes auto), images in the input refused or
    let through to be read as placeholders."""
    _check_images(params.input, policy, info)
    if not params.tools and not _names_hosted(params.tool_choice):
        return params
    hosted = [(i, t) for i, t in enumerate(params.tools or ()) if _is_hosted(t)]
    if not policy.ignore_hosted_tools:
        if hosted:
            index, tool = hosted[0]
            raise UnsupportedFeature(
                f"Tool type {_type_name(tool)!r} is not supported: {HOSTED_TOOLS_HINT}.",
                param=f"tools[{index}].type",
                code="unsupported_tool",
            )
        if _names_hosted(params.tool_choice):
            assert isinstance(params.tool_choice, dict)
            raise UnsupportedFeature(
                f"'tool_choice' names the hosted tool type {_type_name(params.tool_choice)!r}: "
                f"{HOSTED_TOOLS_HINT}.",
                param="tool_choice",
                code="unsupported_tool",
            )
        return params
    for _, tool in hosted:
        _log_ignored(_type_name(tool))
    choice = None if _names_hosted(params.tool_choice) else params.tool_choice
    ignored = frozenset(index for index, _ in hosted)
    return dataclasses.replace(params, ignored_tools=ignored, tool_choice=choice)


def _is_hosted(tool: dict[str, JsonValue]) -> bool:
    return tool.get("type") not in SERVED_TOOL_TYPES


def _names_hosted(choice: str | dict[str, JsonValue] | None) -> bool:
    """Whether `tool_choice` names a hosted tool type (`{"type": "web_search"}`)."""
    if not isinstance(choice, dict):
        return False
    kind = choice.get("type")
    return isinstance(kind, str) and kind not in SERVED_TOOL_TYPES | {"allowed_tools"}


def _type_name(tool: dict[str, JsonValue]) -> str:
    kind = tool.get("type")
    return kind[:64] if isinstance(kind, str) else repr(kind)[:64]


def _log_ignored(kind: str) -> None:
    """Each ignored type once per process, so a client that sends it every turn does
    not flood the log."""
    if kind in _logged_types or len(_logged_types) >= _LOGGED_TYPES_CAP:
        return
    _logged_types.add(kind)
    log.info("ignoring hosted tool type %r (--hosted-tools ignore): the model never sees it", kind)


def _check_images(items: Sequence[Item], policy: ClientPolicy, info: ModelInfo) -> None:
    if info.vision or not has_images(items):
        return
    if not policy.image_placeholders:
        raise InvalidRequest(
            f"The input contains an image, but {IMAGES_HINT}.",
            param="input",
            code="unsupported_image",
        )
    log.warning("the input contains images the model cannot see; each reads %r", IMAGE_PLACEHOLDER)
