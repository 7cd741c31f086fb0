"""What every read model shares: `View`, its JSON, and how a view writes a time."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, PlainSerializer

JSON = dict[str, Any]
# A time as `datetime.isoformat` writes it (`+00:00`), in the JSON of the views that say when.
IsoTime = Annotated[datetime, PlainSerializer(datetime.isoformat, return_type=str)]


class View(BaseModel):
    """A read model: immutable, serialized under its JSON names."""

    model_config = ConfigDict(frozen=True, validate_by_name=True, serialize_by_alias=True)

    def to_json(self) -> JSON:
        """The JSON object scripts read (`--json`)."""
        return self.model_dump(mode="json")
