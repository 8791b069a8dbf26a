"""Opening the Iceberg catalog and its tables, with errors that name the fix."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from icebatch.core.aws_clients import unreachable
from icebatch.core.config_files import closest
from icebatch.core.errors import CatalogUnavailableError, ConfigError, TableNotFoundError
from icebatch.core.settings import Settings, ensure_folder
from icebatch.core.untrusted import summarize

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table


def open_catalog(settings: Settings, *, control_plane: bool = False) -> Catalog:
    """Open the configured catalog (SQL/SQLite by default, Glue in AWS, or one pyiceberg's own configuration
    names)."""
    from pyiceberg.catalog import load_catalog

    props = settings.catalog_props(control_plane=control_plane)
    kind, name = settings.catalog.catalog_type, settings.catalog.catalog_name
    if kind == "sql":
        if importlib.util.find_spec("sqlalchemy") is None:  # before any folder: a failed first command leaves none
            raise ModuleNotFoundError("No module named 'sqlalchemy'", name="sqlalchemy")
        ensure_folder(settings.home)
        ensure_folder(settings.home / "warehouse")
    try:
        if kind == "glue":
            return _glue_catalog(name, props)
        return load_catalog(name, **props)
    except (ImportError, ModuleNotFoundError) as e:
        extra = {"sql": "sql-sqlite", "glue": "glue"}.get(kind, "the catalog's extra")
        raise ConfigError(
            f"the {kind} catalog needs an optional dependency ({e.name}); "
            f"install `pyiceberg[{extra}]` (the `icebatch[lambda]` / `icebatch[job]` extras include it)"
        ) from e
    except ValueError as e:
        if kind == "pyiceberg":
            raise ConfigError(
                f"pyiceberg has no usable configuration of the catalog {name!r} ({e}): give it in .pyiceberg.yaml (in "
                f"PYICEBERG_HOME or your home folder) or as PYICEBERG_CATALOG__{name.upper()}__TYPE, __URI, ..., and "
                "name it with ICEBATCH_CATALOG_NAME"
            ) from e
        raise ConfigError(f"cannot open the {kind} catalog: {e}") from e


def _glue_catalog(name: str, props: dict[str, str]) -> Catalog:
    """A Glue catalog with a client we configure: bounded retries and timeouts (a Lambda has seconds)."""
    import boto3
    from botocore.config import Config
    from pyiceberg.catalog.glue import GlueCatalog

    def first(*keys: str) -> str | None:
        return next((props[k] for k in keys if props.get(k)), None)

    client = boto3.client(
        "glue",
        endpoint_url=props.get("glue.endpoint"),
        region_name=first("glue.region", "client.region"),
        aws_access_key_id=first("glue.access-key-id", "client.access-key-id"),
        aws_secret_access_key=first("glue.secret-access-key", "client.secret-access-key"),
        aws_session_token=first("glue.session-token", "client.session-token"),
        config=Config(
            retries={"max_attempts": int(props.get("glue.max-retries", "3")), "mode": "standard"},
            connect_timeout=5,
            read_timeout=30,
        ),
    )
    return GlueCatalog(name, client=client, **props)


def load_table(catalog: Catalog, identifier: str, *, what: str, fix: str) -> Table:
    """Load a table or raise TableNotFoundError saying what it is and how to create it."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError) as e:
        hint = closest(identifier, _table_names(catalog, identifier))
        raise TableNotFoundError(
            f"{what} {identifier!r} does not exist in catalog {catalog.name!r}{hint}: {fix}"
        ) from e
    except Exception as e:
        raise _translate(e, catalog) from e


def table_exists(catalog: Catalog, identifier: str) -> bool:
    from pyiceberg.exceptions import NoSuchNamespaceError

    try:
        return catalog.table_exists(identifier)
    except NoSuchNamespaceError:
        return False
    except Exception as e:
        raise _translate(e, catalog) from e


_AWS_PERMANENT = {
    "AccessDeniedException",
    "AccessDenied",
    "UnrecognizedClientException",
    "InvalidInputException",
}


def _translate(error: Exception, catalog: Catalog) -> Exception:
    """Map storage/SDK failures to icebatch errors by type and error code, never by message text."""
    kind = type(catalog).__name__.replace("Catalog", "").lower() or "the"
    if isinstance(error, OSError):
        return CatalogUnavailableError(f"cannot reach the {kind} catalog: {error}")
    try:
        from botocore.exceptions import ClientError, NoCredentialsError
    except ImportError:  # no AWS SDK: not a Glue catalog
        return error
    if isinstance(error, NoCredentialsError):
        return ConfigError(f"no AWS credentials for the {kind} catalog: configure a profile or role")
    if isinstance(error, ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        if code in _AWS_PERMANENT:
            return ConfigError(
                f"the {kind} catalog refused the request ({code}): grant the function's role glue:GetTable / "
                "s3:GetObject on the tables' metadata (see template.yaml)"
            )
        return CatalogUnavailableError(f"the {kind} catalog failed ({code}); retrying later may help")
    if unreachable(error):  # refused, reset, timed out
        return CatalogUnavailableError(f"cannot reach the {kind} catalog: {summarize(str(error), 300)}")
    return error


SOURCE_FIX = (
    "check the source table (ICEBATCH_SOURCE_TABLE, or the consumer's `source_table` in the consumers file); the "
    "example's support.tickets is made and filled by `icebatch generate`"
)


def _table_names(catalog: Catalog, identifier: str) -> list[str]:
    """The catalog's tables in the namespaces near ``identifier``'s (to suggest the one meant): a local SQL catalog's
    only (a deployed role need not list a Glue database's tables: it is granted the tables it reads)."""
    from pyiceberg.exceptions import NoSuchNamespaceError

    if catalog.properties.get("type") != "sql":
        return []
    namespace = identifier.rsplit(".", 1)[0]
    try:
        spaces = (
            [namespace] if catalog.namespace_exists(namespace) else [".".join(n) for n in catalog.list_namespaces()]
        )
        return [".".join(t) for space in spaces[:20] for t in catalog.list_tables(space)]
    except (NoSuchNamespaceError, OSError, ValueError):
        return []
