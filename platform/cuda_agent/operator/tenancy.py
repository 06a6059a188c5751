"""Where one namespace's runs may reach, decided by the operator (pure).

The namespace is the boundary: a TrainingRun's author writes its spec, annotations and the artifacts
Secret of their namespace, and none of those may take the run outside it. The trainer image is the
cluster admin's (`--trainer-image`, or one of `--allowed-trainer-image`); checkpoints live under
`s3://<artifacts bucket>/<namespace>/` (a run's own prefix is derived there, a prefix the spec names must
lie there too); a run resumes only from a checkpoint under its own prefix; and of the artifacts Secret
only the storage settings reach a trainer, by name. docs/install.md ("Multi-tenancy") tells the whole
story, with the chart values that scope the storage credentials to the same prefix.
"""

from __future__ import annotations

import re

from cuda_agent.storage.config import ENV_NAMES

# The annotation a run may use to pick one of the images the admin allowed.
TRAINER_IMAGE_ANNOTATION = "cuda-agent.io/trainer-image"
# registry/path[:tag][@digest], as a container runtime parses it; no whitespace or control characters.
IMAGE_REFERENCE = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?"
)
# The artifacts Secret's keys a trainer gets: the storage settings of cuda_agent.storage.config, and
# nothing else (any other key, PYTHONWARNINGS or LD_PRELOAD say, would configure the trainer's process).
# CUDA_AGENT_PVC_ROOT is the operator's own (--pvc-root): it names a directory of the host or pod.
ARTIFACTS_ENV_NAMES = tuple(
    name for setting, names in ENV_NAMES.items() if setting != "pvc_root" for name in names
)


def valid_image(reference: str) -> bool:
    return len(reference) <= 512 and IMAGE_REFERENCE.fullmatch(reference) is not None


def namespace_root(bucket: str, namespace: str) -> str:
    """The storage every run of `namespace` may use: `s3://<bucket>/<namespace>/`."""
    return f"s3://{bucket}/{namespace}/"


def default_checkpoint_prefix(bucket: str, namespace: str, name: str, uid: str) -> str:
    # The uid keeps a run recreated under the same name from resuming its predecessor's checkpoints
    # (the trainer resumes from the newest checkpoint under its prefix after any restart).
    return f"{namespace_root(bucket, namespace)}{name}/{uid}/checkpoints"


def within(uri: str, root: str) -> bool:
    """Whether `uri` lies strictly under `root` (which ends with '/'), with no empty, '.' or '..' path
    segment (object stores take keys literally, but paths built from them may not), no backslash and
    no control character."""
    if not root.endswith("/") or not uri.startswith(root) or not uri.isprintable() or "\\" in uri:
        return False
    rest = uri[len(root) :].removesuffix("/")
    return bool(rest) and all(segment not in ("", ".", "..") for segment in rest.split("/"))


def resume_point(last_checkpoint: object, prefix: str) -> str | None:
    """The status's lastCheckpoint, when it is a checkpoint under the run's own prefix; anything else
    (another run's, another namespace's, garbage) is not a resume point. The trainer then resumes from
    the newest checkpoint under its prefix by itself."""
    if isinstance(last_checkpoint, str) and within(last_checkpoint, prefix.rstrip("/") + "/"):
        return last_checkpoint
    return None
