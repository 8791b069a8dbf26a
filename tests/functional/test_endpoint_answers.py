"""Endpoint mode against a server that answers badly: each row is kept, with what went wrong, never a crash.

The server here is a real HTTP server that answers chat completions with crafted bodies (what a broken
proxy or a non-conforming server returns); the job's endpoint stage calls it with its real HTTP client,
and its output goes through the job's result parser into Arrow rows of the results schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest
from icebatch.core.ledger.results_table import STATUS_ERROR, STATUS_OK
from icebatch.core.settings import Settings
from icebatch.core.task import load_task
from icebatch_job.columns import SOURCE_FILE, SOURCE_HASH, SOURCE_POS
from icebatch_job.stages.endpoint import EndpointStage
from icebatch_job.stages.parse import ResultParser

from tests.support.http_server import QuietHandler, serving

pytestmark = pytest.mark.functional
TASK = load_task()
VERDICT = json.dumps({"sentiment": "negative", "urgency": "high", "category": "billing", "summary": "Charged twice."})


def completion(content: Any = VERDICT, usage: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
    if usage is not None:
        body["usage"] = usage
    return body


# ticket subject -> the server's answer to it, and what the row must say
ANSWERS: dict[str, tuple[Any, str, tuple[int, int]]] = {
    "plain": (completion(usage={"prompt_tokens": 12, "completion_tokens": 30}), STATUS_OK, (12, 30)),
    "no-usage": (completion(), STATUS_OK, (0, 0)),  # servers that count nothing: 0, as before
    "text-count": (completion(usage={"prompt_tokens": "12", "completion_tokens": 30}), "usage.prompt_tokens", (0, 0)),
    "negative": (completion(usage={"prompt_tokens": 12, "completion_tokens": -5}), "usage.completion_tokens", (0, 0)),
    "too-many": (completion(usage={"prompt_tokens": 10**12, "completion_tokens": 1}), "usage.prompt_tokens", (0, 0)),
    "boolean": (completion(usage={"prompt_tokens": True, "completion_tokens": 1}), "usage.prompt_tokens", (0, 0)),
    "fraction": (completion(usage={"prompt_tokens": 12.5, "completion_tokens": 1}), "usage.prompt_tokens", (0, 0)),
    "usage-list": (completion(usage=[12, 30]), "usage is list", (0, 0)),
    "content-number": (completion(content=42), "message.content is int", (0, 0)),
    "content-object": (completion(content={"sentiment": "negative"}), "message.content is dict", (0, 0)),
    "not-an-object": ([completion()], "unexpected response", (0, 0)),
    "no-choices": ({"choices": []}, "unexpected response", (0, 0)),
}


@contextmanager
def answering_server() -> Iterator[str]:
    """Answers each chat completion with the body ``ANSWERS`` holds for the ticket's subject."""

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            user = request["messages"][-1]["content"]
            subject = next(s for s in ANSWERS if f"Subject: {s}\n" in user)
            payload = json.dumps(ANSWERS[subject][0]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    with serving(Handler) as url:
        yield url + "/v1"


def test_every_row_of_a_badly_answering_server_is_kept_with_its_reason() -> None:
    # given one ticket per kind of answer
    subjects = list(ANSWERS)
    batch = {
        "ticket_id": [f"t{i}" for i in range(len(subjects))],
        "subject": subjects,
        "body": ["I was charged twice this month."] * len(subjects),
        "customer_tier": ["pro"] * len(subjects),
        "channel": ["email"] * len(subjects),
        SOURCE_FILE: ["s3://b/f.parquet"] * len(subjects),
        SOURCE_POS: list(range(len(subjects))),
        SOURCE_HASH: list(range(len(subjects))),
    }
    with answering_server() as url:
        settings = Settings(engine_mode="endpoint", endpoint_url=url, endpoint_model="m", endpoint_max_retries=0)
        # when the endpoint stage asks the server about each, and the parser turns the answers into result rows
        outputs = EndpointStage(TASK, settings)(batch)
    rows = ResultParser(TASK, "run-1", "m")(pa.Table.from_pydict(outputs)).to_pylist()
    # then every ticket has its row: the good answers labelled with their counts, the others kept as
    # inference errors that say what the server sent, none with a count it did not give
    assert [r["source_id"] for r in rows] == batch["ticket_id"]
    for subject, row in zip(subjects, rows, strict=True):
        _, expected, tokens = ANSWERS[subject]
        if expected == STATUS_OK:
            assert (row["status"], row["sentiment"]) == (STATUS_OK, "negative"), subject
        else:
            assert row["status"] == STATUS_ERROR and expected in row["error"], (subject, row)
        assert (row["num_input_tokens"], row["num_generated_tokens"]) == tokens, subject
