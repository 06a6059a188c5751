"""Ops-6K-style data synthesis: an operator catalogue crawled from torch (and transformers), composers
that fuse 1-5 operators into KernelBench-format tasks, named filters with verdicts, decontamination
against a benchmark set, and `cuda-agent data` to write the dataset to a path or MinIO. See docs/data.md."""
