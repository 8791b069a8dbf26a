"""A small pyiceberg FileIO for the control plane: S3 through boto3, local files through the OS.

The launcher only reads table metadata (metadata JSON, manifest lists, the odd manifest); pyiceberg's
default S3 FileIOs need pyarrow (166 MB) or s3fs + aiobotocore (which pins botocore, so the bundle could
not use the boto3 that Lambda's runtime already has). This one is selected with the catalog property
``py-io-impl = icebatch.core.metadata_io.MetadataFileIO`` (``Settings.catalog_props(control_plane=True)``).
Objects are read whole: metadata files are small.
"""

from __future__ import annotations

import io
import os
from typing import Any
from urllib.parse import urlsplit

from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile, OutputStream


def _split(location: str) -> tuple[str, str, str]:
    parts = urlsplit(location)
    scheme = parts.scheme or "file"
    if scheme in {"s3", "s3a", "s3n"}:
        return "s3", parts.netloc, parts.path.lstrip("/")
    if scheme == "file":
        return (
            "file",
            "",
            parts.path if parts.netloc in ("", "localhost") else f"//{parts.netloc}{parts.path}",
        )
    raise ValueError(f"unsupported location {location!r} (the control plane reads s3:// and file:// only)")


class MetadataFileIO(FileIO):
    def __init__(self, properties: dict[str, str] | None = None) -> None:
        super().__init__(properties=properties or {})
        self._s3: Any = None

    @property
    def s3(self) -> Any:
        if self._s3 is None:
            import boto3

            from icebatch.core.aws_clients import bounded_config

            p = self.properties
            self._s3 = boto3.client(
                "s3",
                endpoint_url=p.get("s3.endpoint"),
                region_name=p.get("s3.region") or p.get("client.region"),
                aws_access_key_id=p.get("s3.access-key-id") or p.get("client.access-key-id"),
                aws_secret_access_key=p.get("s3.secret-access-key") or p.get("client.secret-access-key"),
                aws_session_token=p.get("s3.session-token") or p.get("client.session-token"),
                config=bounded_config(),
            )
        return self._s3

    def new_input(self, location: str) -> InputFile:
        return _Input(location, self)

    def new_output(self, location: str) -> OutputFile:
        return _Output(location, self)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        path = location if isinstance(location, str) else location.location
        scheme, bucket, key = _split(path)
        if scheme == "s3":
            self.s3.delete_object(Bucket=bucket, Key=key)
        else:
            os.remove(key)


class _Input(InputFile):
    def __init__(self, location: str, fileio: MetadataFileIO) -> None:
        super().__init__(location)
        self.fileio = fileio
        self._data: bytes | None = None

    def _read(self) -> bytes:
        if self._data is None:
            scheme, bucket, key = _split(self.location)
            if scheme == "s3":
                from botocore.exceptions import ClientError

                try:
                    self._data = self.fileio.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
                except ClientError as e:
                    if e.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
                        raise FileNotFoundError(self.location) from e
                    raise
            else:
                with open(key, "rb") as f:
                    self._data = f.read()
        return self._data

    def __len__(self) -> int:
        return len(self._read())

    def exists(self) -> bool:
        try:
            self._read()
        except FileNotFoundError:
            return False
        return True

    def open(self, seekable: bool = True) -> InputStream:
        return io.BytesIO(self._read())


class _Output(OutputFile):
    def __init__(self, location: str, fileio: MetadataFileIO) -> None:
        super().__init__(location)
        self.fileio = fileio

    def __len__(self) -> int:
        return len(self.to_input_file())

    def exists(self) -> bool:
        return self.to_input_file().exists()

    def to_input_file(self) -> InputFile:
        return _Input(self.location, self.fileio)

    def create(self, overwrite: bool = False) -> OutputStream:
        if not overwrite and self.exists():
            raise FileExistsError(self.location)
        return _Writer(self)


class _Writer(io.BytesIO):
    def __init__(self, target: _Output) -> None:
        super().__init__()
        self.target = target

    def close(self) -> None:
        if not self.closed:
            scheme, bucket, key = _split(self.target.location)
            data = self.getvalue()
            if scheme == "s3":
                self.target.fileio.s3.put_object(Bucket=bucket, Key=key, Body=data)
            else:
                os.makedirs(os.path.dirname(key), exist_ok=True)
                with open(key, "wb") as f:
                    f.write(data)
        super().close()
