"""The operator's files (the consumers file, task files), read as strictly as events and failing in one line.

A file that is missing, a folder, unreadable or not UTF-8 is an error naming the file and what to fix,
never a traceback; a YAML or JSON syntax error is one line with where it is; a key given twice
(``backlog_threshold: 10`` then ``backlog_threshold: 1000``) is an error, not "the last one wins".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from icebatch.core.errors import InvalidEventError, PermanentError
from icebatch.core.untrusted import loads_strict, summarize

MAX_CONFIG_BYTES = 1024 * 1024  # a consumers file of 50 entries, a task with its prompt and schema: kilobytes


def read_text(path: Path, *, what: str, hint: str, error: type[PermanentError]) -> str:
    """The UTF-8 text of ``path``; ``error`` with one line (``what`` and ``hint`` in it) if it cannot be read."""
    shown = summarize(str(path), 200)  # a path from a variable may hold anything, a newline included
    try:
        with path.open("rb") as f:  # bounded: a device or a pipe named by mistake cannot fill memory
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise error(f"{what} {shown} holds more than {MAX_CONFIG_BYTES:,} bytes: is it the right file?")
        return data.decode("utf-8")
    except FileNotFoundError as e:
        raise error(f"{what} {shown} does not exist ({hint})") from e
    except IsADirectoryError as e:
        raise error(f"{what} {shown} is a folder, not a file ({hint})") from e
    except UnicodeDecodeError as e:
        raise error(f"{what} {shown} is not UTF-8 text (byte {e.start})") from e
    except OSError as e:
        raise error(f"{what} {shown} cannot be read ({e.strerror})") from e


def load_json(text: str, *, what: str, error: type[PermanentError]) -> Any:
    """JSON as ``loads_strict`` reads events (no duplicate keys, no NaN, nesting bounded), up to the size of a
    file; ``error`` otherwise."""
    try:
        return loads_strict(text, what=what, max_bytes=MAX_CONFIG_BYTES)
    except InvalidEventError as e:
        message = str(e)
        raise error(message if message.startswith(what) else f"{what}: {message}") from e


def load_yaml(text: str, *, what: str, error: type[PermanentError]) -> Any:
    """YAML (the safe subset) without duplicate keys; ``error`` with one line saying where otherwise."""
    import yaml

    try:
        return yaml.load(text, Loader=_loader())  # a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = summarize(e.problem or e.context or "invalid", 200)
        if isinstance(e, yaml.constructor.ConstructorError):  # YAML, but not a plain document of keys and values
            raise error(f"{what}: {problem}{where}") from e
        raise error(f"{what} is not YAML: {problem}{where}") from e
    except yaml.YAMLError as e:
        raise error(f"{what} is not YAML: {summarize(str(e).splitlines()[0] if str(e) else 'invalid', 200)}") from e


_LOADER: Any = None


def _loader() -> Any:
    """yaml.SafeLoader whose mappings refuse a key given twice (built once, on first use)."""
    global _LOADER
    if _LOADER is None:
        import yaml

        class StrictLoader(yaml.SafeLoader):
            pass

        def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = loader.construct_object(key_node)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: construct_mapping says so
                    break
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {summarize(key, 60)!r} is given twice (ambiguous)", key_node.start_mark
                    )
            return loader.construct_mapping(node, deep=True)

        StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
        _LOADER = StrictLoader
    return _LOADER


def closest(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to a misspelt one, else nothing."""
    import difflib

    found = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {found[0]!r}?)" if found else ""


def field_problem(item: Mapping[str, Any], model: type[BaseModel]) -> str:
    """One pydantic error of a file's entry, where and what; an unknown key names the closest key there is."""
    where = ".".join(str(p) for p in item["loc"])
    if item["type"] == "extra_forbidden" and item["loc"]:
        known = _fields_at(model, item["loc"][:-1])
        if known:
            return f"{where}: no such key{closest(str(item['loc'][-1]), known)}; the keys are {', '.join(known)}"
    message = str(item["msg"]).removeprefix("Value error, ")  # a validator's own words, without pydantic's label
    return f"{where}: {message}" if where else message


def _fields_at(model: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The field names of the model (or of a nested model field) at ``path``; [] where that is not a model."""
    for part in path:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field is not None else None
        nested = [
            a
            for a in getattr(annotation, "__args__", (annotation,))
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if not nested:
            return []
        model = nested[0]
    return list(model.model_fields)
