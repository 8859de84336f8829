"""verl's agent loop in a real Ray actor, traced by ``rltrace.integrations.verl.instrument()``
(tests/integrations/verl/test_verl_ray.py).

Run as ``python verl_ray_driver.py OUT_DIR``.  As a verl user's script: configure rltrace, call
``instrument()``, then start Ray with a plain ``ray.init(...)`` (as verl's ``run_ppo`` does).
The driver plays verl's trainer: a ``step`` timer with ``gen`` inside, in which verl's
``AgentLoopWorker`` runs as a Ray actor (``ray.remote(AgentLoopWorker)``, as verl's
``AgentLoopManager`` creates it) with a scripted server and reward worker (stand-ins, see
``verl_agent_fixtures``).  Writes ``OUT_DIR/result.json``; rltrace's files go under
``OUT_DIR/logs``.  Everything has its own deadline: the driver exits within 240 s.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
signal.alarm(240)  # the driver's own deadline (the test waits a little longer)


def main(out: Path) -> None:
    import rltrace
    from rltrace.integrations import verl as rv

    rltrace.configure(fileroot=str(out / "logs"), experiment_name="verl", trial_name="t",
                      session_tracer={"enabled": True})
    rv.instrument()

    import cloudpickle
    import ray
    import verl_agent_fixtures as fx

    cloudpickle.register_pickle_by_value(fx)  # the stand-ins travel to the actor by value
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # verl's own call

    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.trainer.ppo.ray_trainer import marked_timer

    import rltrace.ray

    path = out / "model"
    tokenizer = fx.model_dir(path)
    worker = ray.remote(AgentLoopWorker).remote(
        fx.verl_config(path), fx.ScriptedServer(tokenizer),
        reward_loop_worker_handles=[fx.ScriptedReward()])

    class Trainer:
        global_steps = 3

        def fit_step(self) -> tuple[dict[str, float], Any]:
            timing_raw: dict[str, float] = {}
            with marked_timer("step", timing_raw):
                with marked_timer("gen", timing_raw):
                    batch = ray.get(worker.generate_sequences.remote(fx.two_prompt_batch(3)),
                                    timeout=180)
            return timing_raw, batch

    timing, batch = Trainer().fit_step()
    result = {
        "through_rltrace_ray": rltrace.ray.current_job().registry is not None,
        "timing_raw": sorted(timing),
        "samples": len(batch),
        "response_mask": batch.batch["response_mask"].sum(-1).tolist(),
    }
    ray.shutdown()  # wrapped by rltrace.ray: the actor is flushed first
    rltrace.shutdown()
    (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
