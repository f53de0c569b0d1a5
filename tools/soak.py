"""A soak of ``decoctl serve``: mixed load for a stated time, the server sampled every 10 s.

    python tools/soak.py --model gemma3-270m-int8 --minutes 20 --clients 8 --out build/soak

It starts ``decoctl serve`` (one thread by default) and keeps ``--clients`` clients busy with greedy and seeded
sampling completions, prompt lookup, chats under a JSON schema, streams their clients leave after a few events, and
bad requests (unknown fields and controllers, a logit_bias past its limit, malformed JSON). Every 10 s it samples the
server's resident memory, live rows, queue, the number of series /metrics exposes, and the answers so far by status.
At the end it stops the server with SIGTERM and checks the targets: no 5xx, no traceback in the server's log,
resident memory at the end within 5% of its value after the warm-up (the first quarter), and no more metric series
than installed controllers x endpoints x outcomes. ``OUT/soak.csv`` holds the samples, ``OUT/soak.svg`` plots them,
``OUT/summary.json`` the verdict; the exit status is 0 only when every target holds.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import json
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

SAMPLE_SECONDS = 10.0
PROMPTS = [
    "def fibonacci(n):",
    "The capital of France is",
    "Write a haiku about the sea.",
    "import numpy as np\n\ndef normalise(x):",
    "Explain what a hash table is in one sentence.",
    "SELECT name FROM users WHERE",
]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def _request(rng: random.Random, model: str) -> tuple[str, bytes, bool]:
    """(path, body, leave early): one request of the mix."""
    prompt = rng.choice(PROMPTS)
    kind = rng.choices(["greedy", "sample", "lookup", "schema", "leave", "bad"], weights=[25, 20, 20, 10, 10, 15], k=1)[
        0
    ]
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": rng.randint(8, 48), "temperature": 0}
    path = "/v1/completions"
    if kind == "sample":
        body.update(temperature=0.8, seed=rng.randrange(1 << 30))
    elif kind == "lookup":
        body["decoctl"] = {"controller": "speculative", "options": {"drafter": "prompt-lookup"}}
    elif kind == "schema":
        path = "/v1/chat/completions"
        body.pop("prompt")
        body["messages"] = [{"role": "user", "content": "Give a name and an age as JSON."}]
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    elif kind == "leave":
        body.update(stream=True, max_tokens=200)
    elif kind == "bad":
        broken = rng.randrange(4)
        if broken == 0:
            return path, b'{"model": "x", "prompt": ', False
        if broken == 1:
            body["frequency"] = 1
        elif broken == 2:
            body["decoctl"] = {"controller": rng.choice(["GREEDY", "no-such", "Speculative"])}
        else:
            body["logit_bias"] = {str(t): 1.0 for t in range(2000)}
    return path, json.dumps(body).encode(), kind == "leave"


class Load:
    """The clients: each sends requests of the mix until ``stop``; answers counted by status."""

    def __init__(self, host: str, model: str, clients: int, seed: int) -> None:
        self.host, self.model, self.clients, self.seed = host, model, clients, seed
        self.stop = threading.Event()
        self.statuses: dict[int, int] = {}
        self.failures: list[str] = []
        self.lock = threading.Lock()

    def run(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(self.clients)]
        for thread in threads:
            thread.start()
        return threads

    def _count(self, status: int, what: str = "") -> None:
        with self.lock:
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if status >= 500 or status == 0:
                self.failures.append(what[:300])

    def _client(self, number: int) -> None:
        rng = random.Random(self.seed * 1000 + number)
        while not self.stop.is_set():
            path, body, leave = _request(rng, self.model)
            connection = http.client.HTTPConnection(self.host, timeout=300)
            try:
                connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                if leave and response.status == 200:
                    for _ in range(rng.randint(1, 4)):
                        response.readline()  # a few events, then the client goes
                    self._count(response.status)
                else:
                    text = response.read().decode("utf-8", "replace")
                    self._count(response.status, text)
            except (OSError, http.client.HTTPException) as exc:
                self._count(0, f"{type(exc).__name__}: {exc}")
            finally:
                connection.close()


def _resident_mib(pid: int) -> dict[str, float]:
    """The server's resident memory in MiB: all of it, its anonymous part, and its file-backed part (the weights'
    mapped pages; ``decoctl serve --lazy-weights`` leaves them to fault in as tokens first touch them)."""
    keys = {"VmRSS:": "rss_mib", "RssAnon:": "anon_mib", "RssFile:": "file_mib"}
    found = dict.fromkeys(keys.values(), float("nan"))
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            head = line.split()
            if head and head[0] in keys:
                found[keys[head[0]]] = int(head[1]) / 1024
    return found


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _wait_ready(url: str, server: subprocess.Popen[bytes], seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"decoctl serve exited with {server.returncode} before it answered")
        try:
            if _get(url + "/health")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"decoctl serve did not answer /health within {seconds:.0f} s")


def _svg(rows: list[dict[str, float]], path: Path) -> None:
    """Four small line charts (resident MiB; rows and queue; metric series; 4xx and 5xx answers) over minutes."""
    panels = [
        ("resident memory (MiB): all, anonymous", ["rss_mib", "anon_mib"]),
        ("live rows, queue", ["rows", "queued"]),
        ("metric series", ["series"]),
        ("answers: 4xx, 5xx (cumulative)", ["status_4xx", "status_5xx"]),
    ]
    colours = ["#1f77b4", "#d62728"]
    width, height, pad = 420, 170, 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * width}" height="{2 * height}" font-size="11">']
    minutes = [r["seconds"] / 60 for r in rows]
    span = max(minutes[-1], 1e-9) if minutes else 1.0
    for index, (title, keys) in enumerate(panels):
        x0, y0 = (index % 2) * width, (index // 2) * height
        values = [r[k] for r in rows for k in keys]
        low, high = min(values, default=0.0), max(values, default=1.0)
        if "rss" in keys[0]:
            low = min(low, high * 0.95)
        if high <= low:
            high = low + 1
        parts.append(f'<text x="{x0 + pad}" y="{y0 + 14}">{title}: {low:.0f} to {high:.0f}</text>')
        parts.append(
            f'<rect x="{x0 + pad}" y="{y0 + 20}" width="{width - 2 * pad + 20}" height="{height - 50}" '
            'fill="none" stroke="#999"/>'
        )
        for colour, key in zip(colours, keys, strict=False):
            points = " ".join(
                f"{x0 + pad + (width - 2 * pad + 20) * m / span:.1f},"
                f"{y0 + height - 30 - (height - 50) * (r[key] - low) / (high - low):.1f}"
                for m, r in zip(minutes, rows, strict=True)
            )
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/>')
        parts.append(f'<text x="{x0 + pad}" y="{y0 + height - 14}">0 to {span:.0f} min</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts), encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m-int8")
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-rows", type=int, default=8)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("build/soak"))
    parser.add_argument(
        "--serve-arg", action="append", default=[], metavar="ARG", help="one more argument for decoctl serve"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log_path = args.out / "server.log"
    command = [
        sys.executable,
        "-c",
        "import sys; from decoctl.cli import main; sys.exit(main())",
        "serve",
        "-m",
        args.model,
        "--port",
        str(args.port),
    ]
    command += ["--threads", str(args.threads), "--max-rows", str(args.max_rows), *args.serve_arg]
    url, host = f"http://127.0.0.1:{args.port}", f"127.0.0.1:{args.port}"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_ready(url, server)
            load = Load(host, args.model, args.clients, args.seed)
            threads = load.run()
            rows: list[dict[str, float]] = []
            started = time.monotonic()
            end = started + args.minutes * 60
            while time.monotonic() < end:
                time.sleep(SAMPLE_SECONDS)
                health = json.loads(_get(url + "/health")[1])
                series = [
                    line
                    for line in _get(url + "/metrics")[1].decode().splitlines()
                    if line and not line.startswith("#")
                ]
                with load.lock:
                    statuses = dict(load.statuses)
                rows.append(
                    {
                        "seconds": time.monotonic() - started,
                        **_resident_mib(server.pid),
                        "rows": health.get("rows", 0),
                        "queued": health.get("queued", 0),
                        "series": len(series),
                        "status_200": statuses.get(200, 0),
                        "status_4xx": sum(n for s, n in statuses.items() if 400 <= s < 500),
                        "status_5xx": sum(n for s, n in statuses.items() if s >= 500 or s == 0),
                    }
                )
                print(json.dumps({k: round(v, 1) for k, v in rows[-1].items()}), flush=True)
            load.stop.set()
            for thread in threads:
                thread.join(300)
            controllers = _controllers()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(120)
    with open(args.out / "soak.csv", "w", newline="", encoding="utf-8") as table:
        writer = csv.DictWriter(table, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    _svg(rows, args.out / "soak.svg")
    text = log_path.read_text(encoding="utf-8", errors="replace")
    warm = rows[len(rows) // 4]["rss_mib"]
    final = rows[-1]["rss_mib"]
    # series: per controller (3 counters and a histogram of 8+3 lines) and per endpoint x status, plus the rest
    bound = controllers * 14 + 4 * 8 + 40
    summary = {
        "command": " ".join(["python tools/soak.py", *sys.argv[1:]]),
        "minutes": args.minutes,
        "answers": dict(sorted(load.statuses.items())),
        "failures": load.failures[:10],
        "tracebacks_in_log": text.count("Traceback"),
        "rss_after_warm_up_mib": round(warm, 1),
        "rss_at_end_mib": round(final, 1),
        "rss_change": round(final / warm - 1, 4),
        "anonymous_after_warm_up_mib": round(rows[len(rows) // 4]["anon_mib"], 1),
        "anonymous_at_end_mib": round(rows[-1]["anon_mib"], 1),
        "file_backed_after_warm_up_mib": round(rows[len(rows) // 4]["file_mib"], 1),
        "file_backed_at_end_mib": round(rows[-1]["file_mib"], 1),
        "metric_series": rows[-1]["series"],
        "metric_series_bound": bound,
        "server_exit": server.returncode,
    }
    summary["targets_met"] = (
        not summary["failures"]
        and summary["tracebacks_in_log"] == 0
        and abs(summary["rss_change"]) <= 0.05
        and rows[-1]["series"] <= bound
        and server.returncode == 0
    )
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(json.dumps(summary, indent=2))
    return 0 if summary["targets_met"] else 1


def _controllers() -> int:
    from decoctl.plugins import PluginRegistry

    return len(PluginRegistry().controllers())


if __name__ == "__main__":
    sys.exit(main())
