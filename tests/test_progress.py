"""`hfexport.progress.Heartbeat`: a long step is re-sent while it runs, with its elapsed time, and never after it
ends; every other step passes through unchanged, in order."""

from __future__ import annotations

import time

from hfexport.progress import RUNNING, Heartbeat, Step


def test_heartbeat_resends_an_open_step_with_its_elapsed_time_until_it_ends():
    seen: list[Step] = []
    with Heartbeat(seen.append, every=0.05) as beat:
        beat(Step("target", "start", "pte", "executorch / generation"))
        beat(Step("export", "start", "pte", "executorch / generation"))
        time.sleep(0.4)
        beat(Step("export", "done", "pte", None, 0.4))
        ended = len(seen)
        time.sleep(0.2)
    running = [step for step in seen if step.status == RUNNING]
    assert running and all(step.step == "export" and step.target == "pte" for step in running)  # never the bracket
    assert all(step.detail == "executorch / generation" for step in running)
    seconds = [step.seconds for step in running]
    assert seconds == sorted(seconds) and 0 < seconds[0] < seconds[-1] <= 0.5
    assert len(seen) == ended  # nothing after the step ended
    assert [step.status for step in seen if step.status != RUNNING] == ["start", "start", "done"]


def test_heartbeat_stops_with_its_context():
    seen: list[Step] = []
    with Heartbeat(seen.append, every=0.05) as beat:
        beat(Step("verify", "start", "onnx"))
    count = len(seen)
    time.sleep(0.2)
    assert len(seen) == count and not beat.thread.is_alive()
