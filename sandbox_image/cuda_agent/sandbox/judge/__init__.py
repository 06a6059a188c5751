"""The judge: turns (task, candidate) into a milestone reward in {-1, 1, 2, 3} that cannot be gamed.

Process model (docs/judge.md): the orchestrator (trusted, never imports candidate code) screens, builds and
computes references; a fresh worker process runs the candidate under recorders and reports over an
authenticated pipe (messages: protocol.py). Modules imported by the worker (channel, protocol, task, recorder,
tamper, timing, inline, confinement, worker) use only the standard library and torch.
"""
