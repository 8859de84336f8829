"""One-line instrumentation for the RL frameworks people train with.

Each submodule traces one framework's own code without an edit to it:

``rltrace.integrations.trl``      ``instrument(trainer)`` for TRL trainers (``GRPOTrainer`` in full)
``rltrace.integrations.verl``     ``instrument()`` for verl's trainers and agent loop
``rltrace.integrations.openrlhf`` ``instrument()`` for OpenRLHF's agent executors (samples, turns, rewards)

A submodule imports its framework only when it is used; importing this package imports none of them.
"""
