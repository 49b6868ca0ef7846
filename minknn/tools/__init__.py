"""The machinery around the course: what keeps runs safe and convenient, none of it an idea of the
papers. A run's flags (options, checks, cli), its parts built and its loop's plumbing (trainer,
step, engine, distributed for torchrun), its life in its folder (run: open, lock, resume, stop,
finish, read from outside), its files (checkpoint, files, curves), the base weights' cache
(weights, packaged, cache_record), and a trained run used (inference, predict, export with card
and onnx_export).
"""
