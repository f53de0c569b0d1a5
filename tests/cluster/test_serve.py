"""decoctl serve on Ray Serve replicas (decoctl.ray._serve): one endpoint, a replica on each of the cluster's two
nodes, each running the engine ``decoctl serve`` runs from the decoctl that Ray's runtime environment unpacked from
the wheels there, every greedy answer the offline one; what is refused before anything loads."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import decoctl.errors
from decoctl.generation import Generator

from .conftest import MODEL, run_cli, shipped

PROMPTS = [
    "def fibonacci(n):",
    "import os\n",
    "class Stack:",
    "for i in range(10):",
    "x = [",
    "def read(path):",
    "# a comment",
    "while True:",
    "try:",
    "return",
    "@property",
    "from typing import",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def replicas(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    """decoctl serve --ray-replicas 2 (one thread, two rows each) on the session's cluster, as a process of its own:
    its base URL and, once it has stopped, what it wrote on stderr."""
    pytest.importorskip("openai")
    port = _free_port()
    address = ray_cluster.get_runtime_context().gcs_address
    command = [
        sys.executable, "-m", "decoctl.cli", "serve", "-m", MODEL, "--ray-replicas", "2", "--threads", "1",
        "--max-rows", "2", "--port", str(port), "--ray-address", address,
    ]  # fmt: skip
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    assert server.stderr is not None
    for line in server.stderr:  # until it says it serves (or ends: then the loop ends and the test fails)
        lines.append(line)
        if line.startswith("decoctl: serving on"):
            break
    try:
        assert lines and lines[-1].startswith(f"decoctl: serving on http://127.0.0.1:{port}"), "".join(lines)
        yield f"http://127.0.0.1:{port}", lines
    finally:
        server.terminate()
        _, rest = server.communicate(timeout=120)
        lines.append(rest)
        assert server.returncode == 0, "".join(lines)


def test_two_replicas_answer_through_one_endpoint_each_greedy_answer_the_offline_one(
    replicas: tuple[str, list[str]],
) -> None:
    import openai

    url, _ = replicas
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)

    def complete(prompt: str) -> tuple[str, str]:
        raw = client.completions.with_raw_response.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        return raw.headers["x-decoctl-replica"], raw.parse().choices[0].text

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(complete, PROMPTS))
    offline = Generator({"target": MODEL}, threads=1)
    assert [text for _, text in answers] == [offline.generate(p, max_new_tokens=24).text for p in PROMPTS]
    assert len({replica for replica, _ in answers}) == 2


def test_each_serve_replica_runs_decoctl_from_the_wheels(ray_cluster: Any, replicas: tuple[str, list[str]]) -> None:
    import openai

    url, _ = replicas
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    seen: set[str] = set()

    def answered_by(_: int) -> str:
        raw = client.completions.with_raw_response.create(model=MODEL, prompt="x", max_tokens=8, temperature=0)
        return str(raw.headers["x-decoctl-replica"])

    # in waves of concurrent requests, more than one replica's rows: Serve's router may send one request at a time to
    # the replica beside its proxy for ever, but not more requests than that replica takes
    with ThreadPoolExecutor(WAVE) as pool:
        for _ in range(16):  # until both replicas have answered
            seen.update(pool.map(answered_by, range(WAVE)))
            if len(seen) == 2:
                break

    def where(_: Any) -> tuple[str, str]:
        import ray

        import decoctl

        return decoctl.__file__, ray.get_runtime_context().get_node_id()

    handles = [ray_cluster.get_actor(f"SERVE_REPLICA::decoctl#decoctl#{r}", namespace="serve") for r in sorted(seen)]
    found = ray_cluster.get([handle.__ray_call__.remote(where) for handle in handles])
    assert len({node for _, node in found}) == 2  # a replica on each node (one CPU each)
    assert all(shipped(path) for path, _ in found), found


def test_an_answer_streams_through_serve_equal_to_the_offline_one(replicas: tuple[str, list[str]]) -> None:
    import openai

    url, _ = replicas
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    chunks = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=20, temperature=0, stream=True)
    pieces = [chunk.choices[0].text for chunk in chunks if chunk.choices]
    assert len([p for p in pieces if p]) > 1
    assert "".join(pieces) == Generator({"target": MODEL}, threads=1).generate("def add(a, b):", max_new_tokens=20).text


#: requests sent at once where a test needs both replicas to answer: more than one replica's rows (--max-rows 2)
WAVE = 4


def _from_replica(url: str, replica: str, ask: Any, tries: int = 64) -> Any:
    """``ask()``'s (replica, answer) until an answer comes from ``replica``: that answer. Asked in concurrent waves
    (Serve picks the replica, and one request at a time may always go to the replica beside its proxy)."""
    with ThreadPoolExecutor(WAVE) as pool:
        for _ in range(tries // WAVE):
            for answered_by, answer in pool.map(lambda _: ask(), range(WAVE)):
                if answered_by == replica:
                    return answer
    raise AssertionError(f"replica {replica} answered none of {tries} requests")


def test_a_client_leaving_a_stream_cancels_its_completion_in_its_replica(replicas: tuple[str, list[str]]) -> None:
    import openai

    url, _ = replicas
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)

    def cancelled() -> tuple[str, float]:
        with urllib.request.urlopen(f"{url}/metrics") as response:
            lines = response.read().decode().splitlines()
            count = next(float(line.split()[1]) for line in lines if line.startswith("decoctl_completions_cancelled "))
            return response.headers["x-decoctl-replica"], count

    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="def f(x):", max_tokens=1900, temperature=0, stream=True
    )
    replica = raw.headers["x-decoctl-replica"]
    before = _from_replica(url, replica, cancelled)
    stream = raw.parse()
    next(iter(stream))  # the completion runs in its replica
    stream.close()

    def both_rows() -> tuple[str, int]:
        answer = client.completions.with_raw_response.create(model=MODEL, prompt="x", max_tokens=1, n=2, temperature=0)
        return answer.headers["x-decoctl-replica"], len(answer.parse().choices)

    # a request for both of the replica's rows is admitted there only once the left completion's row is free
    assert _from_replica(url, replica, both_rows) == 2
    assert _from_replica(url, replica, cancelled) == before + 1


def test_a_killed_replica_is_replaced_and_the_endpoint_answers_throughout(
    ray_cluster: Any, replicas: tuple[str, list[str]]
) -> None:
    import openai

    url, _ = replicas
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    expected = Generator({"target": MODEL}, threads=1).generate("def add(a, b):", max_new_tokens=8).text

    def answer() -> tuple[str, str]:
        raw = client.completions.with_raw_response.create(
            model=MODEL, prompt="def add(a, b):", max_tokens=8, temperature=0
        )
        return raw.headers["x-decoctl-replica"], raw.parse().choices[0].text

    before: set[str] = set()
    with ThreadPoolExecutor(WAVE) as pool:  # in concurrent waves, as in _from_replica
        for _ in range(16):  # until both replicas have answered
            before.update(replica for replica, _ in pool.map(lambda _: answer(), range(WAVE)))
            if len(before) == 2:
                break
        assert len(before) == 2
        killed = sorted(before)[0]
        ray_cluster.kill(ray_cluster.get_actor(f"SERVE_REPLICA::decoctl#decoctl#{killed}", namespace="serve"))
        seen: set[str] = set()
        for _ in range(500):  # until Serve's replacement answers (it loads its models first)
            for replica, text in pool.map(lambda _: answer(), range(WAVE)):
                assert text == expected
                assert replica != killed
                seen.add(replica)
            if seen - before:
                break
    assert seen - before, f"no new replica answered (answers from {sorted(seen)})"


def test_build_app_takes_serve_run_arguments_as_strings() -> None:
    pytest.importorskip("ray")
    from decoctl.ray._serve import build_app

    app = build_app({"model": MODEL, "replicas": "2", "threads": "1", "max_rows": "4", "huge_pages": "false"})
    deployment = app._bound_deployment  # what `serve run` deploys
    assert deployment.num_replicas == 2
    assert deployment.max_ongoing_requests == 4
    assert deployment.ray_actor_options["num_cpus"] == 1


def test_build_app_gives_each_replica_the_deterministic_mode_and_the_image_limits() -> None:
    pytest.importorskip("ray")
    from decoctl.ray._serve import build_app

    app = build_app({"model": MODEL, "deterministic": "true", "max_images": "2", "max_image_pixels": "4096"})
    (config,) = app._bound_deployment.init_args  # what each Replica is built from
    assert (config["deterministic"], config["max_images"], config["max_image_pixels"]) == (True, 2, 4096)
    with pytest.raises(decoctl.errors.ConfigError, match="max_images=0 must be at least 1"):
        build_app({"model": MODEL, "max_images": "0"})


def test_build_app_gives_each_replica_the_lora_adapters_named() -> None:
    pytest.importorskip("ray")
    from decoctl.ray._serve import build_app

    app = build_app({"model": MODEL, "adapters": '{"sql": "/adapters/sql.onnx_adapter"}'})
    (config,) = app._bound_deployment.init_args  # each Replica loads them: decoctl serve --adapter sql=...
    assert config["adapters"] == {"sql": "/adapters/sql.onnx_adapter"}


def test_build_app_passes_an_autoscaling_config_through_instead_of_a_replica_count() -> None:
    pytest.importorskip("ray")
    from decoctl.ray._serve import build_app

    autoscaling = '{"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 6}'
    deployment = build_app({"model": MODEL, "autoscaling": autoscaling, "max_rows": "8"})._bound_deployment
    config = deployment._deployment_config.autoscaling_config
    assert (config.min_replicas, config.max_replicas, config.target_ongoing_requests) == (1, 3, 6)
    assert deployment.max_ongoing_requests == 8


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"modle": MODEL}, "unknown argument 'modle'"),
        ({"threads": "two"}, "threads='two' must be a int"),
        ({"max_rows": 0}, "max_rows=0 must be at least 1"),
    ],
)
def test_build_app_refuses_what_it_does_not_take(args: dict[str, Any], message: str) -> None:
    pytest.importorskip("ray")
    from decoctl.errors import ConfigError
    from decoctl.ray._serve import build_app

    with pytest.raises(ConfigError, match=message):
        build_app(args)


def test_more_replicas_than_the_cluster_has_cpus_are_refused(
    ray_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run_cli(capsys, "serve", "-m", MODEL, "--ray-replicas", "3", "--port", "0")
    assert status == 2
    assert "decoctl: error: 3 Serve replicas of 1 thread need 3 CPUs, and the Ray cluster has 2" in err


def test_serving_on_ray_without_ray_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    status, _, err = run_cli(capsys, "serve", "-m", MODEL, "--ray-replicas", "2")
    assert status == 2
    assert err.strip().endswith("needs Ray (ray is missing): pip install 'decoctl[ray]'")


def test_autoscaling_that_is_not_json_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray")
    status, _, err = run_cli(capsys, "serve", "-m", MODEL, "--ray-replicas", "1", "--ray-autoscaling", "min=1")
    assert status == 2
    assert "decoctl: error: --ray-autoscaling is not JSON" in err


@pytest.mark.parametrize("flag", [["--ray-address", "auto"], ["--ray-autoscaling", "{}"]])
def test_ray_serve_options_without_replicas_are_refused(flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli(capsys, "serve", "-m", MODEL, *flag)
    assert status == 2
    assert f"{flag[0]} needs --ray-replicas N" in err


def test_an_unknown_model_is_refused_before_ray_starts(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray")
    status, _, err = run_cli(capsys, "serve", "-m", "no-such-model", "--ray-replicas", "1")
    assert status == 2
    assert "decoctl: error: model 'no-such-model'" in err
