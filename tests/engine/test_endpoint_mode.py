"""Endpoint mode (the seed's pattern 1) against vLLM's own OpenAI server with the tiny model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.errors import TooManyErrorsError
from icebatch.core.settings import Settings
from icebatch_job.example.tickets import ensure_source_table, generate
from icebatch_job.job import run_job
from icebatch_job.process.runtime import job_environment

from tests.engine.conftest import ledger
from tests.support.fault_proxy import fault_proxy
from tests.support.vllm_server import free_port, vllm_openai_server

pytestmark = [pytest.mark.engine]


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("server")
    env = job_environment(Settings(home=home), device="cpu")
    with vllm_openai_server(tiny_model, env, home / "vllm.log") as url:
        yield url.removesuffix("/v1")


def _endpoint_settings(base: Settings, url: str, **kw: object) -> Settings:
    return base.with_overrides(engine_mode="endpoint", endpoint_url=url + "/v1", endpoint_model="tiny", **kw)


def test_endpoint_mode_end_to_end_with_usage_tokens(own_settings: Settings, server: str) -> None:
    s = _endpoint_settings(own_settings, server, endpoint_concurrency=4)
    generate(ensure_source_table(open_catalog(s), s.catalog.source_table), tickets=40, batches=2, seed=21)
    result = run_job(s, out=lambda _: None)
    assert result.status == "completed" and result.completed is not None
    e = result.completed
    assert e.rows == 40 and e.rows_ok >= 38
    assert e.tokens.input > 40 * 50 and e.tokens.output > 40 * 10  # from the server's `usage`
    rows = ledger(s).results().scan().to_arrow().to_pylist()
    assert all(r["model"] == "tiny" and r["num_generated_tokens"] > 0 for r in rows)


def test_transient_errors_are_retried_with_backoff(own_settings: Settings, server: str) -> None:
    # given an endpoint that answers 503 to the first two attempts of every request
    with fault_proxy(server, fail_first=2) as (proxy, counts):
        s = _endpoint_settings(own_settings, proxy, endpoint_max_retries=3)
        generate(ensure_source_table(open_catalog(s), s.catalog.source_table), tickets=10, batches=1, seed=22)
        result = run_job(s, out=lambda _: None)
    # then every row succeeded on its third attempt
    assert result.status == "completed" and result.completed is not None
    assert result.completed.rows_by_status.get("inference_error", 0) == 0
    assert counts["injected"] == 20 and counts["requests"] == 30


def test_an_unreachable_endpoint_fails_the_run_and_keeps_the_range(own_settings: Settings) -> None:
    s = _endpoint_settings(own_settings, f"http://127.0.0.1:{free_port()}", endpoint_max_retries=1)
    generate(ensure_source_table(open_catalog(s), s.catalog.source_table), tickets=6, batches=1, seed=23)
    before = ledger(s).watermark()
    with pytest.raises(TooManyErrorsError, match="gave up after 2 attempts"):
        run_job(s, out=lambda _: None)
    assert ledger(s).watermark() == before
    assert ledger(s).backlog().rows == 6


def test_the_job_sends_only_new_and_changed_rows_after_an_overwrite(own_settings: Settings, server: str) -> None:
    from collections import Counter

    import pyarrow.compute as pc

    # given a source whose 12 rows the job labelled (through Ray, the endpoint stage, the driver's parse)
    s = _endpoint_settings(own_settings, server, endpoint_concurrency=4)
    source = ensure_source_table(open_catalog(s), s.catalog.source_table)
    generate(source, tickets=12, batches=1, seed=23)
    assert run_job(s, out=lambda _: None).status == "completed"
    # when the table is overwritten with the same rows but one changed, and one row is deleted
    source = open_catalog(s).load_table(s.catalog.source_table)
    rows = source.scan().to_arrow().sort_by("ticket_id")
    subject = rows.schema.get_field_index("subject")
    edited = pc.if_else(
        pc.equal(rows["ticket_id"], rows["ticket_id"][0]), "changed: " + str(rows["subject"][0]), rows["subject"]
    )
    source.overwrite(rows.set_column(subject, "subject", edited).slice(0, 11))
    result = run_job(s, out=lambda _: None)
    # then the job sent the changed row alone, and the results hold one verdict per live row
    assert result.status == "completed" and result.completed is not None and result.completed.rows == 1
    verdicts = ledger(s).results().scan(selected_fields=("source_id", "source_hash")).to_arrow()
    live = open_catalog(s).load_table(s.catalog.source_table).scan(selected_fields=("ticket_id",)).to_arrow()
    assert Counter(verdicts["source_id"].to_pylist()) == Counter(live["ticket_id"].to_pylist())
    assert verdicts["source_hash"].null_count == 0
