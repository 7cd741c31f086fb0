"""What a model reads of an MCP tool's result: text, and images beside it.

`render_result` turns a `CallToolResult` into a `ToolOutput`. Its text holds text blocks
as they are and a one-line note for anything else, never base64: a model pays for every
character of a result again at each later turn, and base64 tells it nothing. An image of a
type the providers take (`IMAGE_TYPES`) is kept beside the text as an `ImagePart`, which
the step puts into the result's message and the model adapters show where the provider
takes images in a tool result (Anthropic) or note where it does not (OpenAI chat). The
images of one result are bounded (`MAX_IMAGE_BYTES`): each is sent with every later turn
and kept in every checkpoint after it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass

import mcp_types

from cairn.agents.models.base import IMAGE_TYPES, image_note
from cairn.storage.records import ImagePart

# Bytes of images one result may show a model; images past it are a note.
MAX_IMAGE_BYTES = 1024 * 1024
# A string of structured content this long, all base64, is binary data, not text.
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{256,}={0,2}")


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """A call's result as the model reads it: text (no base64 in it) and images beside it."""

    text: str
    images: list[ImagePart]


def render_result(result: mcp_types.CallToolResult, limit: int) -> ToolOutput:
    """A tool's result as the model reads it: text of at most about `limit` characters.

    Text blocks as they are, embedded text resources by their text. An image of a type
    models take (`IMAGE_TYPES`) is kept as an `ImagePart` while the result's images fit
    `MAX_IMAGE_BYTES`, and noted in the text (`[image/png, 27,310 bytes]`); other blocks
    (larger images, audio, binary resources, links) are a one-line note. Structured content
    is added as JSON when no block holds text, unless it only repeats the blocks; a long
    base64 string in it is a note too. The middle of a longer text is cut, with a note.
    """
    parts: list[str] = []
    images: list[ImagePart] = []
    room = MAX_IMAGE_BYTES
    for block in result.content:
        if isinstance(block, mcp_types.ImageContent):
            kept = _image(block, room)
            if isinstance(kept, ImagePart):
                images.append(kept)
                room -= kept.size
                kept = image_note(kept.media_type, kept.size)
            parts.append(kept)
        else:
            parts.append(_block_text(block))
    structured = result.structured_content
    if structured is not None and not _has_text(result) and not _repeats_blocks(result):
        parts.append(json.dumps(_without_base64(structured), ensure_ascii=False))
    text = "\n".join(parts) or "(no output)"
    if len(text) > limit:
        head, tail = limit // 2, limit - limit // 2
        text = f"{text[:head]}\n… [{len(text) - limit} characters cut] …\n{text[-tail:]}"
    return ToolOutput(text, images)


def _image(block: mcp_types.ImageContent, room: int) -> ImagePart | str:
    """`block` as an image a model may be shown, or the note that stands for it."""
    try:
        data = base64.b64decode(block.data, validate=True)
    except (binascii.Error, ValueError):
        return f"[{block.mime_type}: not valid base64]"
    if block.mime_type not in IMAGE_TYPES:
        return image_note(block.mime_type, len(data), "not shown")
    if len(data) > room:
        return image_note(block.mime_type, len(data), f"not shown, past {MAX_IMAGE_BYTES:,} bytes")
    return ImagePart(media_type=block.mime_type, data=base64.b64encode(data).decode())


def _block_text(block: mcp_types.ContentBlock) -> str:
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        return image_note(block.mime_type, _decoded_size(block.data), "not shown")
    if isinstance(block, mcp_types.ResourceLink):
        return f"[resource link: {block.uri}]"
    contents = block.resource
    if isinstance(contents, mcp_types.TextResourceContents):
        return contents.text
    size = _decoded_size(contents.blob)
    return f"[resource {contents.uri}: {contents.mime_type or 'binary'}, {size:,} bytes]"


def _has_text(result: mcp_types.CallToolResult) -> bool:
    return any(isinstance(block, mcp_types.TextContent) for block in result.content)


def _repeats_blocks(result: mcp_types.CallToolResult) -> bool:
    """Whether the structured content is `{"content": [the blocks]}` (server-filesystem's)."""
    blocks = [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in result.content]
    return bool(blocks) and result.structured_content == {"content": blocks}


def _without_base64(value: object) -> object:
    """`value` with each string that is a long run of base64 replaced by a note of its size."""
    if isinstance(value, str) and _BASE64_RUN.fullmatch(value):
        return f"[base64, {_decoded_size(value):,} bytes]"
    if isinstance(value, list):
        return [_without_base64(item) for item in value]
    if isinstance(value, dict):
        return {key: _without_base64(item) for key, item in value.items()}
    return value


def _decoded_size(data: str) -> int:
    """Bytes the base64 `data` decodes to, worked out from its length."""
    return len("".join(data.split()).rstrip("=")) * 3 // 4
