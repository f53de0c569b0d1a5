"""Batch generation on Ray Data (decoctl.ray.generate_dataset, decoctl generate --ray-actors): every output is the
single-process run's, in the prompts' order, whichever actor ran it, on either node, each running decoctl from the
wheels Ray's runtime environment shipped (those installed here, or those of the folder --ray-wheels names); an actor
killed part-way is replaced; one that keeps dying fails the run with one clear error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from decoctl.errors import ConfigError
from decoctl.generation import BatchPrompt, Generator, result_record
from decoctl.ray import generate_dataset, prompt_dataset

from .conftest import MODEL, jsonl, run_cli, shipped, without_timings

DYING = Path(__file__).with_name("dying.py")
WHERE = Path(__file__).with_name("where.py")


def on_cluster(ray_cluster: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """decoctl generate -m MODEL ARGS as a process of its own, joining the session's cluster by its address."""
    address = ray_cluster.get_runtime_context().gcs_address
    command = [sys.executable, "-m", "decoctl.cli", "generate", "-m", MODEL, *args, "--ray-address", address]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)


def single_process(prompts: list[BatchPrompt], controller: str = "greedy", **limits: Any) -> list[dict[str, Any]]:
    generator = Generator({"target": MODEL}, controller, threads=1)
    results = generator.generate_batch(prompts, batch_size=2, **limits)
    return [without_timings(result_record(i, r)) for i, r in enumerate(results)]


def on_ray(dataset: Any) -> list[dict[str, Any]]:
    rows = [row for table in dataset.iter_batches(batch_format="pyarrow", batch_size=None) for row in table.to_pylist()]
    return [without_timings({k: v for k, v in row.items() if v is not None or k != "completions"}) for row in rows]


def unbatched(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """JSON lines less how their prompts were batched."""
    return [{**line, "stats": {k: v for k, v in line["stats"].items() if k != "batched"}} for line in lines]


def records(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as JSON lines have them (index, text, stats)."""
    return [{"index": r["index"], "text": r["text"], "stats": r["stats"]} for r in rows]


def test_greedy_outputs_of_an_actor_on_each_node_running_the_shipped_wheels_equal_the_single_process_run(
    ray_cluster: Any, prompts: list[BatchPrompt], tmp_path: Path
) -> None:
    record = tmp_path / "where.jsonl"
    dataset = prompt_dataset(prompts, actors=2, batch_size=2)
    # both actors up before the first block, and each block sent to the least busy actor rather than to the one
    # beside it (the head's): each actor, and so each node, runs some
    dataset.context.wait_for_min_actors_s = 300
    dataset.context.execution_options.actor_locality_enabled = False
    generated = generate_dataset(
        dataset, {"target": MODEL}, f"{WHERE}:Where", options={"record": str(record)}, batch_size=2, actors=2,
        prompts_per_call=2, max_new_tokens=16,
    )  # fmt: skip
    rows = on_ray(generated)
    assert [r["index"] for r in rows] == list(range(len(prompts)))
    assert [r["prompt"] for r in rows] == [p.prompt for p in prompts]
    # each call of an actor batched its two prompts (the single process batched all of them, two rows at a time)
    assert unbatched(records(rows)) == unbatched(single_process(prompts, max_new_tokens=16))
    workers = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    assert len({w["node"] for w in workers}) == 2, workers
    assert all(shipped(w["decoctl"]) for w in workers), workers  # Ray's unpacked wheels, not this environment


def test_seeded_samples_on_two_actors_draw_the_same_text_as_one_process(
    ray_cluster: Any, prompts: list[BatchPrompt], prompts_file: Path
) -> None:
    dataset = prompt_dataset(prompts_file, actors=2, batch_size=2)  # the same prompts, read from their file
    generated = generate_dataset(dataset, {"target": MODEL}, "sample", batch_size=2, actors=2, seed=3)
    expected = single_process(prompts, "sample", seed=3)
    assert records(on_ray(generated)) == expected
    assert len({r["text"] for r in expected}) == len(expected)  # the prompts drew different texts


def test_a_dataset_of_its_own_keeps_its_columns_and_gains_text_stats_and_completions(ray_cluster: Any) -> None:
    import ray.data

    dataset = ray.data.from_items([{"id": "a", "prompt": "def f(x):"}, {"id": "b", "prompt": "import sys"}])
    rows = generate_dataset(dataset, {"target": MODEL}, batch_size=2, max_new_tokens=6).take_all()
    by_id = {row["id"]: row for row in rows}
    expected = single_process([BatchPrompt(prompt="def f(x):"), BatchPrompt(prompt="import sys")], max_new_tokens=6)
    assert set(rows[0]) == {"id", "prompt", "text", "stats", "completions"}
    assert [by_id["a"]["text"], by_id["b"]["text"]] == [e["text"] for e in expected]
    assert by_id["a"]["completions"] is None  # one completion: listed only where a controller gives several


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"text": "def f(x):"}], "already has the column(s) ['text'], which generate_dataset adds"),
        ([{"line": "def f(x):"}], "the dataset has no \"prompt\" column (it has ['line'])"),
    ],
)
def test_a_dataset_without_a_prompt_column_or_with_an_output_column_is_refused_before_any_actor_starts(
    ray_cluster: Any, rows: list[dict[str, str]], message: str
) -> None:
    import ray.data

    with pytest.raises(ConfigError) as refused:
        generate_dataset(ray.data.from_items(rows), {"target": MODEL})
    assert message in str(refused.value)


def test_an_actor_killed_part_way_is_replaced_and_every_output_stands(
    ray_cluster: Any, prompts: list[BatchPrompt], tmp_path: Path
) -> None:
    marker = tmp_path / "died"
    dataset = prompt_dataset(prompts, actors=2, batch_size=2)
    generated = generate_dataset(
        dataset, {"target": MODEL}, f"{DYING}:DiesOnce", options={"marker": str(marker)}, batch_size=2, actors=2
    )
    rows = on_ray(generated)
    assert marker.exists()  # an actor's process did end part-way
    assert [r["text"] for r in rows] == [r["text"] for r in single_process(prompts)]


def test_an_actor_that_keeps_dying_fails_the_command_with_one_clear_error(
    ray_cluster: Any, prompts_file: Path, tmp_path: Path
) -> None:
    controller = f"{DYING}:DiesAlways"
    done = on_cluster(
        ray_cluster, "--prompts", str(prompts_file), "--ray-actors", "1", "-c", controller,
        "-o", f"marker={tmp_path / 'died'}",
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == ""
    assert "decoctl: error: Ray could not finish the prompts" in done.stderr
    assert "out of memory" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_command_on_a_cluster_by_address_writes_the_single_process_lines_in_file_order(
    ray_cluster: Any, prompts_file: Path, wheels: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = ray_cluster.get_runtime_context().gcs_address
    args = ["generate", "-m", MODEL, "--prompts", str(prompts_file), "--batch-size", "3", "-n", "10"]
    ray_args = ["--ray-actors", "2", "--ray-address", address, "--ray-wheels", str(wheels)]
    on_cluster = subprocess.run(
        [sys.executable, "-m", "decoctl.cli", *args, *ray_args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert on_cluster.returncode == 0, on_cluster.stderr
    status, out, _ = run_cli(capsys, *args, "--threads", "1")
    assert status == 0
    lines = [without_timings(line) for line in jsonl(on_cluster.stdout)]
    assert [line["index"] for line in lines] == list(range(len(lines)))
    assert lines == sorted((without_timings(line) for line in jsonl(out)), key=lambda line: line["index"])
    assert "on 2 Ray actors of 1 thread(s)" in on_cluster.stderr


def test_a_prompt_an_actor_refuses_fails_the_command_with_that_refusal(ray_cluster: Any, tmp_path: Path) -> None:
    long = tmp_path / "long.jsonl"
    long.write_text('{"prompt": "x"}\n' + '{"prompt": "%s"}\n' % ("a = 1\\n" * 1500), encoding="utf-8")
    done = on_cluster(ray_cluster, "--prompts", str(long), "--ray-actors", "1")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "decoctl: error: prompts 0 to 1: prompt 1 has 6000 tokens" in done.stderr
    assert "Traceback" not in done.stderr
