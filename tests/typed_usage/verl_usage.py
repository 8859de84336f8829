"""verl traced by rltrace, as docs/guide/integrations/verl.md tells users (checked by mypy --strict)."""

from __future__ import annotations

import rltrace
from rltrace.integrations import verl as rltrace_verl


def main() -> None:
    # in the script that starts verl (before verl's run_ppo / ray.init)
    rltrace.configure(experiment_name="gsm8k-grpo", trial_name="run1",
                      session_tracer={"enabled": True})
    rltrace_verl.instrument()  # trainer sections, agent loop, Ray workers, fully-async queue
    assert rltrace_verl.is_instrumented()
    failures: int = sum(rltrace_verl.ERRORS.values())  # hooks that failed (verl ran untraced there)
    print(f"rltrace: {failures} tracing failures")


if __name__ == "__main__":
    main()
