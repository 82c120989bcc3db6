"""llmbatch.ray: the batch transformation called directly on dict, numpy and pandas
batches (a bad row gets its error, the others their completions, in order), and
one real local Ray run through ``Dataset.map_batches``. Against a real simulator
process.

The tests that import numpy, pandas, pyarrow or Ray are marked ``ray`` and are
deselected by default (they would add ~200 MB to the test process, which
tests/jobs/test_scale.py's peak-RSS bound counts). CI's ray stage installs
``llmbatch[ray]`` and runs the whole file: ``pytest -m "not slow"
tests/integrations/test_ray.py``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import llmbatch
import llmbatch.ray
from llmbatch_server.testing import SimulatorProcess, run_simulator

# A context of 64 tokens: the long prompt below does not fit.
LONG_PROMPT = "word " * 500


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency", "--max-model-len", "64") as server:
        yield server


@pytest.fixture
def completions(sim: SimulatorProcess) -> Iterator[llmbatch.ray.Completions]:
    rows = llmbatch.ray.Completions(sim.base_url, max_tokens=3)
    yield rows
    rows.close()


def test_dict_batch_gets_completion_and_error_columns(
    completions: llmbatch.ray.Completions,
) -> None:
    batch = {"prompt": ["a", 7, "b", LONG_PROMPT, "c"], "id": [0, 1, 2, 3, 4]}
    out = completions(batch)
    assert out["id"] == [0, 1, 2, 3, 4]
    assert out["prompt"] is batch["prompt"]
    assert [c is not None for c in out["completion"]] == [True, False, True, False, True]
    assert all(isinstance(c, str) and c for c in out["completion"] if c is not None)
    assert out["error"][0] is None
    assert out["error"][1] == "InvalidTypeError: prompt must be a str, got int"
    # The client knows the server's context length and refuses the row before sending.
    assert out["error"][3].startswith("InvalidRequestError")
    assert "max_model_len" in out["error"][3]
    assert out["error"][4] is None
    # The client was opened once, on the first batch, and is reused.
    again = completions({"prompt": ["d"]})
    assert again["error"] == [None]
    stats = completions._client.stats()
    assert stats.tiers[llmbatch.Priority.BATCH].done >= 4


def test_a_batch_of_only_bad_rows_sends_nothing(sim: SimulatorProcess) -> None:
    rows = llmbatch.ray.Completions(sim.base_url)
    out = rows({"prompt": [None, 3.5]})
    assert out["completion"] == [None, None]
    assert out["error"] == [
        "InvalidTypeError: prompt must be a str, got NoneType",
        "InvalidTypeError: prompt must be a str, got float",
    ]
    assert not rows._open  # nothing to send: the client was never opened
    rows.close()


@pytest.mark.ray
def test_numpy_batch(sim: SimulatorProcess) -> None:
    numpy = pytest.importorskip("numpy")
    rows = llmbatch.ray.Completions(sim.base_url, prompt_column="text", max_tokens=2)
    try:
        out = rows({"text": numpy.array(["x", "y", "z"]), "n": numpy.arange(3)})
    finally:
        rows.close()
    assert list(out["n"]) == [0, 1, 2]
    # Typed Arrow string columns: Ray would turn a list of nothing but None into a
    # column of Arrow's null type, read back as NaN in a later numpy batch.
    assert str(out["error"].type) == "string"
    assert out["error"].to_pylist() == [None, None, None]
    assert all(out["completion"].to_pylist())


@pytest.mark.ray
def test_pandas_batch_keeps_order_and_none(sim: SimulatorProcess) -> None:
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"prompt": [f"p{i}" for i in range(50)] + [LONG_PROMPT]})
    frame.index = pandas.RangeIndex(100, 151)  # a batch's index need not start at 0
    rows = llmbatch.ray.Completions(sim.base_url, max_tokens=2)
    try:
        out = rows(frame)
    finally:
        rows.close()
    assert list(out.index) == list(frame.index)
    assert list(out["prompt"]) == list(frame["prompt"])
    assert "completion" not in frame.columns  # the input batch is left as it was
    assert out["completion"].iloc[:50].map(bool).all()
    assert out["completion"].iloc[50] is None
    assert out["error"].iloc[:50].isna().all()
    assert "max_model_len" in out["error"].iloc[50]


def test_chat_rows_including_numpy_messages_with_missing_keys(sim: SimulatorProcess) -> None:
    rows = llmbatch.ray.Chat(sim.base_url, max_tokens=2)
    messages: list[Any] = [
        [{"role": "user", "content": "hi"}],
        # What Arrow hands back for messages whose keys differ: None for the gaps.
        [{"role": "system", "content": "be brief", "name": None}, {"role": "user", "content": "x"}],
        "not a list",
        [{"role": "user", "content": LONG_PROMPT}],
    ]
    try:
        out = rows({"messages": messages})
    finally:
        rows.close()
    assert out["completion"][0]
    assert out["completion"][1]
    assert out["error"][:2] == [None, None]
    assert out["error"][2] == "InvalidTypeError: messages must be a list of messages, got str"
    assert out["error"][3].startswith("BadRequestError")


def test_missing_column_and_bad_batch_type_raise(completions: llmbatch.ray.Completions) -> None:
    with pytest.raises(llmbatch.InvalidTypeError, match="no 'prompt' column"):
        completions({"text": ["a"]})
    with pytest.raises(llmbatch.InvalidTypeError, match="dict of columns"):
        completions(["a", "b"])


@pytest.mark.ray
def test_pyarrow_batch_is_refused(completions: llmbatch.ray.Completions) -> None:
    pyarrow = pytest.importorskip("pyarrow")
    with pytest.raises(llmbatch.InvalidTypeError, match="dict of columns"):
        completions(pyarrow.table({"prompt": ["a"]}))


def test_bad_client_option_fails_in_the_constructor() -> None:
    with pytest.raises(llmbatch.ConfigTypeError):
        llmbatch.ray.Completions("http://127.0.0.1:1/v1", limits="many")  # type: ignore[arg-type]
    with pytest.raises(llmbatch.InvalidRequestError, match="priority"):
        llmbatch.ray.Chat("http://127.0.0.1:1/v1", priority="urgent")  # type: ignore[arg-type]


def test_options_wrong_for_every_row_fail_in_the_constructor() -> None:
    with pytest.raises(llmbatch.InvalidTypeError, match="did you mean 'max_tokens'"):
        llmbatch.ray.Completions("http://127.0.0.1:1/v1", max_tokenz=4)
    with pytest.raises(llmbatch.InvalidTypeError, match="max_tokens must be a positive int"):
        llmbatch.ray.Chat("http://127.0.0.1:1/v1", max_tokens="4")
    # A chat-only option is wrong for prompts, right for conversations.
    with pytest.raises(llmbatch.InvalidTypeError, match="'tool_choice'"):
        llmbatch.ray.Completions("http://127.0.0.1:1/v1", tool_choice="auto")
    llmbatch.ray.Chat("http://127.0.0.1:1/v1", tool_choice="auto").close()


def test_importing_llmbatch_does_not_import_ray_or_pandas() -> None:
    code = (
        "import sys, llmbatch; "
        "bad = [m for m in ('ray', 'pandas', 'pyarrow', 'llmbatch.ray') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.ray
@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Ray is not installed: pip install 'llmbatch[ray]' (CI's ray stage does)",
)
@pytest.mark.timeout(180)
def test_map_batches_on_a_local_ray(sim: SimulatorProcess) -> None:
    import ray

    n, bad = 2000, 1234
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        # Ten blocks, so both actors get work; one row in one block is too long.
        items = ray.data.from_items(
            [{"id": i, "prompt": LONG_PROMPT if i == bad else f"row {i}"} for i in range(n)],
            override_num_blocks=10,
        )
        dataset = items.map_batches(
            llmbatch.ray.Completions,
            fn_constructor_kwargs={"base_url": sim.base_url, "max_tokens": 2},
            batch_size=200,
            **llmbatch.ray.actor_options(2),
        )
        rows = [
            dict(zip(batch, values, strict=True))
            for batch in dataset.iter_batches(batch_size=None, batch_format="numpy")
            for values in zip(*batch.values(), strict=True)
        ]
        # Chat, pandas batches, and messages whose keys differ (Arrow fills the gaps
        # with None, which must not reach the server).
        conversations = ray.data.from_items(
            [
                {"id": 0, "messages": [{"role": "user", "content": "hi"}]},
                {
                    "id": 1,
                    "messages": [
                        {"role": "system", "content": "be brief", "name": "x"},
                        {"role": "user", "content": "hi"},
                    ],
                },
                {"id": 2, "messages": []},
            ]
        )
        chats = conversations.map_batches(
            llmbatch.ray.Chat,
            fn_constructor_kwargs={"base_url": sim.base_url, "max_tokens": 2},
            concurrency=1,
            num_cpus=0.25,
            batch_format="pandas",
        ).take_all()
    finally:
        ray.shutdown()
    assert sorted(row["id"] for row in rows) == list(range(n))
    # None, not NaN, in the blocks where nothing failed.
    assert all(row["error"] is None and row["completion"] for row in rows if row["id"] != bad)
    [failed] = [row for row in rows if row["id"] == bad]
    assert failed["completion"] is None
    assert "max_model_len" in failed["error"]
    by_id = {row["id"]: row for row in chats}
    assert by_id[0]["completion"]
    assert by_id[1]["completion"]
    assert by_id[1]["error"] is None
    assert by_id[2]["completion"] is None
    assert by_id[2]["error"] == "InvalidRequestError: messages must not be empty"


@pytest.mark.ray
@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Ray is not installed: pip install 'llmbatch[ray]' (CI's ray stage does)",
)
def test_actor_options_make_a_fixed_pool_of_threaded_actors() -> None:
    from ray.data import ActorPoolStrategy

    options = llmbatch.ray.actor_options(3, num_cpus=0.5)
    assert options["num_cpus"] == 0.5
    compute = options["compute"]
    assert isinstance(compute, ActorPoolStrategy)
    assert (compute.min_size, compute.max_size) == (3, 3)
    assert compute.max_concurrent_calls_per_actor == 2
    assert compute.enable_true_multi_threading
    single = llmbatch.ray.actor_options(1, calls_per_actor=1)["compute"]
    assert single.max_concurrent_calls_per_actor == 1
    assert not single.enable_true_multi_threading
    with pytest.raises(llmbatch.ConfigError):
        llmbatch.ray.actor_options(0)


def test_rows_name_their_tenant_by_column_or_all_at_once(sim: SimulatorProcess) -> None:
    rows = llmbatch.ray.Completions(
        sim.base_url, tenant_column="who", tenant="everyone", max_tokens=2
    )
    try:
        out = rows({"prompt": ["a", "b", "c", "d"], "who": ["team-a", None, "team-b", 7]})
        stats = rows._client.stats()
    finally:
        rows.close()
    assert out["error"][:3] == [None, None, None]
    assert out["error"][3].startswith("InvalidTypeError")
    assert "tenant" in out["error"][3]
    assert {name: t.done for name, t in stats.tenants.items()} == {
        "everyone": 1,
        "team-a": 1,
        "team-b": 1,
    }
    with pytest.raises(llmbatch.ConfigTypeError):
        llmbatch.ray.Completions(sim.base_url, tenant_column=3)  # type: ignore[arg-type]


@pytest.mark.ray
@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Ray is not installed: pip install 'llmbatch[ray]' (CI's ray stage does)",
)
@pytest.mark.timeout(180)
def test_actors_share_a_cache_file(sim: SimulatorProcess, tmp_path: Path) -> None:
    """Two actors on one machine with ``client_options={"cache": path}``: the same
    dataset mapped again is answered from the file, the server asked nothing."""
    import ray

    cache = str(tmp_path / "answers.db")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        runs = []
        for _ in range(2):
            before = sim.finished()
            items = ray.data.from_items(
                [{"id": i, "prompt": f"cached row {i}"} for i in range(400)],
                override_num_blocks=4,
            )
            rows = items.map_batches(
                llmbatch.ray.Completions,
                fn_constructor_kwargs={
                    "base_url": sim.base_url,
                    "max_tokens": 2,
                    "temperature": 0,
                    "client_options": {"cache": cache},
                },
                batch_size=100,
                **llmbatch.ray.actor_options(2),
            ).take_all()
            runs.append(({row["id"]: row["completion"] for row in rows}, sim.finished() - before))
    finally:
        ray.shutdown()
    (first, sent_first), (second, sent_second) = runs
    assert sent_first == 400
    assert sent_second == 0
    assert second == first
    assert all(first.values())
