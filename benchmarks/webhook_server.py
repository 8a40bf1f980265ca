"""Issue 29 benchmark: the receiver's HTTP server, `http.server` (what it uses) vs huggingface_hub's `WebhooksServer`.

Both serve the same `WebhookReceiver.handle` (secret check, size limit, coalescing) on 127.0.0.1; `WebhooksServer` as
its docs show (`add_webhook`, `launch(prevent_thread_lock=True)`, here with `share=False`: outside a Space it
defaults to a public tunnel). Fresh processes, alternated, ROUNDS each: the time from the process start to the
first answered delivery (what a Space pays after each restart), the median of 50 deliveries' round trips, and the
server process's peak RSS (wait4).

Run: `.venv/bin/python benchmarks/webhook_server.py` -> benchmarks/results/webhook_server.json
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from _process import machine  # noqa: E402 - the benchmarks' harness

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SECRET = "bench-secret"

SERVE = r'''
import os, sys
sys.path.insert(0, os.environ["LIBRARY"])
from hfexport.surfaces.webhook import WebhookConfig, WebhookReceiver
receiver = WebhookReceiver(WebhookConfig(secret=os.environ["SECRET"], workdir=os.environ["WORKDIR"], reconcile_s=0))
port = int(os.environ["PORT"])
if os.environ["KIND"] == "http.server":
    from hfexport.surfaces.webhook import make_server
    make_server(receiver, "127.0.0.1", port).serve_forever()
else:
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from huggingface_hub import WebhooksServer

    app = WebhooksServer(webhook_secret=os.environ["SECRET"])

    @app.add_webhook("/webhook")
    async def webhook(request: Request):
        decision = receiver.handle(dict(request.headers), await request.body())
        return JSONResponse(decision.body, status_code=decision.status)

    app.launch(share=False, server_name="127.0.0.1", server_port=port, quiet=True)
'''

BODY = json.dumps({"event": {"action": "create", "scope": "discussion"},
                   "repo": {"type": "model", "name": "user/m"}}).encode()  # answered 200, ignored: nothing queued


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(url: str) -> int:
    request = urllib.request.Request(url, data=BODY, headers={"X-Webhook-Secret": SECRET,
                                                              "Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


def measure(kind: str, work: Path) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}" + ("/webhook" if kind == "http.server" else "/webhooks/webhook")
    env = {**os.environ, "LIBRARY": str(ROOT / "library"), "SECRET": SECRET, "WORKDIR": str(work / kind),
           "PORT": str(port), "KIND": kind, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "0"}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", SERVE], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    while True:
        try:
            assert post(url) == 200
            break
        except (urllib.error.URLError, ConnectionError, OSError):
            if process.poll() is not None:
                raise RuntimeError(f"{kind} server exited with {process.returncode}") from None
            time.sleep(0.02)
    first = time.perf_counter() - start
    trips = []
    for _ in range(50):
        began = time.perf_counter()
        post(url)
        trips.append(time.perf_counter() - began)
    process.terminate()
    _, _, usage = os.wait4(process.pid, 0)
    return {"server": kind, "first_delivery_s": round(first, 2), "round_trip_ms_median": round(
        statistics.median(trips) * 1000, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "load_avg_1m_before": round(load, 2), "load_avg_1m_after": round(os.getloadavg()[0], 2)}


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="bench-webhook-server-"))
    runs = []
    for _ in range(ROUNDS):
        for kind in ("http.server", "WebhooksServer"):
            runs.append(measure(kind, work))
            print(json.dumps(runs[-1]), flush=True)

    def median(kind: str, field: str) -> float:
        return statistics.median(run[field] for run in runs if run["server"] == kind)

    result = {"machine": machine(), "runs": runs,
        "medians": {kind: {field: median(kind, field) for field in ("first_delivery_s", "round_trip_ms_median",
                                                                    "peak_rss_mb")}
                    for kind in ("http.server", "WebhooksServer")}}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "webhook_server.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["medians"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
