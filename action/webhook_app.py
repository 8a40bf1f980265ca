"""The hfexport webhook receiver as a standalone app (a Docker Space, or any host the Hub can reach).

Configuration comes from the environment (a Space's secrets and variables):
    WEBHOOK_SECRET      required: the secret set on the Hub webhook (sent in X-Webhook-Secret)
    HF_TOKEN            write token used to read the models and publish the PRs
    HFEXPORT_TARGETS    "all" (default) or target names separated by commas
    HFEXPORT_BRANCH     the branch whose pushes trigger a job (default main)
    HFEXPORT_PUBLISH    pr (default: one PR per model, updated in place) or commit
    HFEXPORT_REPOS      optional comma-separated allowlist of repo ids
    HFEXPORT_DEBOUNCE   seconds a push waits for newer ones before its job starts (default 5)
    HFEXPORT_WORKDIR    where jobs write their exports and the receiver keeps its state file, receiver-state.json
                        (default /tmp/hfexport-webhook; on a Space, /data/hfexport-webhook with persistent storage)
    HFEXPORT_RECONCILE  seconds between two comparisons of the watched repos with the Hub (default 600; 0: only
                        on start)
    HFEXPORT_RETRIES    further attempts of a publication the Hub failed transiently (default 3)
    HFEXPORT_EXECUTOR   local (default: each export in a child process here, one at a time) or hf-jobs (each export
                        a Hugging Face Job of the token's user, side by side)
    HFEXPORT_JOBS_IMAGE hf-jobs: the Docker image (or Space URL) with hfexport installed that each Job runs
    HFEXPORT_JOBS_NAMESPACE, HFEXPORT_JOBS_TIMEOUT  hf-jobs: whose Jobs (default the token's user); the Hub's time
                        limit per Job (default 2h)
    HOST, PORT          where to listen (default 0.0.0.0:7860, a Space's port)
All the logic lives in `hfexport.surfaces.webhook`; this file only reads the settings and serves.
"""

from __future__ import annotations

import os
import sys

from hfexport.surfaces.ci import parse_targets
from hfexport.surfaces.webhook import WebhookConfig, WebhookReceiver, make_server


def config_from_env(environ=os.environ) -> WebhookConfig:
    targets, _ = parse_targets(environ.get("HFEXPORT_TARGETS", "all"))
    repos = [repo.strip() for repo in environ.get("HFEXPORT_REPOS", "").split(",") if repo.strip()] or None
    return WebhookConfig(
        secret=environ.get("WEBHOOK_SECRET", ""),
        token=environ.get("HF_TOKEN") or None,
        workdir=environ.get("HFEXPORT_WORKDIR", "/tmp/hfexport-webhook"),
        targets=targets,
        branch=environ.get("HFEXPORT_BRANCH", "main"),
        publish=environ.get("HFEXPORT_PUBLISH", "pr"),
        repos=repos,
        debounce_s=float(environ.get("HFEXPORT_DEBOUNCE", "5")),
        reconcile_s=float(environ.get("HFEXPORT_RECONCILE", "600")),
        retries=int(environ.get("HFEXPORT_RETRIES", "3")),
        executor=environ.get("HFEXPORT_EXECUTOR", "local"),
        jobs_image=environ.get("HFEXPORT_JOBS_IMAGE") or None,
        jobs_namespace=environ.get("HFEXPORT_JOBS_NAMESPACE") or None,
        jobs_timeout=environ.get("HFEXPORT_JOBS_TIMEOUT", "2h"),
    )


def main() -> int:
    from hfexport.errors import HfExportError

    try:
        config = config_from_env()
    except (HfExportError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    receiver = WebhookReceiver(config)
    server = make_server(receiver, os.environ.get("HOST", "0.0.0.0"), int(os.environ.get("PORT", "7860")))
    host, port = server.server_address[:2]
    print(f"hfexport webhook receiver on http://{host}:{port} (POST /webhook; GET / and /status)", flush=True)
    receiver.start()  # reconcile with the Hub now (what a restart missed) and every HFEXPORT_RECONCILE seconds
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        receiver.stop()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
