"""A pyiceberg FileIO that records every file opened for reading (selected with `py-io-impl`)."""

from __future__ import annotations

from typing import ClassVar

from icebatch.core.metadata_io import MetadataFileIO
from pyiceberg.io import InputFile


class CountingFileIO(MetadataFileIO):
    opened: ClassVar[list[str]] = []

    def new_input(self, location: str) -> InputFile:
        CountingFileIO.opened.append(location)
        return super().new_input(location)
