"""Sessions: one private workspace per agent episode, its processes, its judge channel and its lifetime.

Layout of a session directory (root mode ownership in brackets):
    <state>/sessions/<id>/            0711 [root]
        workspace/                    0700 [agent uid]  \
        tmp/                          0700 [agent uid]   } TMPDIR, and the commands' /tmp and /dev/shm
        shm/                          0700 [agent uid]  /  (root: bound from one tmpfs, the quota)
        scratch/                      0700 [root]       root: that tmpfs (size and inode limits)
        bin/compile|verify|profile    0750 [root:agent] on the agent's PATH; holds the channel's token
        run/judge.sock                0660 [root:agent] the judge channel (agent commands have no network)
    <state>/judge-caches/<id>/        0700 [judge uid]  build cache of this session's judge runs

Agent commands write workspace/, tmp/ and shm/ only (restricted mode: Landlock; root: ownership), and the
quota counts exactly those; the judge's cache lies outside the session directory, so nothing an agent can
write is anything the judge trusts. Nothing of a session outlives its deletion: its judge run is
cancelled, its processes are killed, its directories are moved aside at once (and removed in the
background), and its slot (uids) is handed out again only once no process of them, zombies included, is
left.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hmac
import json
import logging
import os
import queue
import secrets
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from cuda_agent.api.judge_files import FROZEN_FILES, FROZEN_SUBDIR
from cuda_agent.sandbox.server.config import SandboxServerConfig
from cuda_agent.sandbox.server.isolation import (
    AGENT_WRITABLE_DIRS,
    Isolation,
    Slot,
    kill_group,
    kill_uid_processes,
    pids_of_uid,
)
from cuda_agent.sandbox.server.judge_runner import Candidate, JudgeJob, JudgeService
from cuda_agent.sandbox.server.metrics import Metrics
from cuda_agent.sandbox.server.models import (
    BackgroundJobInfo,
    CreateSessionRequest,
    Device,
    JudgeOptions,
    JudgeRun,
    JudgeStage,
    SessionInfo,
    SessionJudgeRequest,
    TodoItem,
)
from cuda_agent.sandbox.server.procs import BackgroundJob
from cuda_agent.sandbox.server.workspace_fs import WorkspaceFS, disk_usage, remove_tree

log = logging.getLogger(__name__)
MAX_CHANNEL_CLIENTS = 8  # judge channel connections of one session at once

SKILL_TEMPLATE = Path(__file__).resolve().parents[1] / "skill" / "SKILL.md"
ENTRYPOINT = Path(__file__).with_name("entrypoint.py")
MNT_DETACH = 2
MS_NOSUID, MS_NODEV, MS_BIND = 0x2, 0x4, 0x1000
SCRATCH_DIRS = AGENT_WRITABLE_DIRS  # what the quota covers: everything an agent command may write
# The quota watchdog checks at most this many sessions per pass (in turn), so one pass is bounded by
# this times the inode limit, however many sessions fill their workspaces at once.
QUOTA_CHECKS_PER_PASS = 8
# Finished background jobs kept for bash_output (with their unread output); older ones are forgotten.
MAX_FINISHED_JOBS = 16


class UnknownSessionError(KeyError):
    pass


class CapacityError(RuntimeError):
    pass


@dataclass
class Session:
    session_id: str
    slot: Slot
    task_source: str
    task_name: str
    device: Device
    gpu: int | None
    judge_options: JudgeOptions
    ttl_s: float
    directory: Path
    cache_dir: Path
    fs: WorkspaceFS
    tmpfs: bool
    judge_token: str = ""
    created_at: float = field(default_factory=time.time)
    last_activity: float = field(default_factory=time.time)
    jobs: dict[str, BackgroundJob] = field(default_factory=dict)
    command_groups: set[int] = field(default_factory=set)  # foreground commands running now
    todos: list[TodoItem] = field(default_factory=list)
    judge_busy: asyncio.Lock = field(default_factory=asyncio.Lock)
    judge_runs: int = 0
    judge_task: asyncio.Task[JudgeRun] | None = None
    channel: asyncio.AbstractServer | None = None
    channel_clients: int = 0
    closing: bool = False
    # The quota watchdog's last finding ("" within the quota) and when it was made: sessions active since
    # are checked again, whether or not a command runs, and file-tool writes are refused while over.
    quota_problem: str = ""
    quota_checked_at: float = 0.0

    @property
    def workspace(self) -> Path:
        return self.directory / "workspace"

    @property
    def scratch_dirs(self) -> list[Path]:
        return [self.directory / name for name in SCRATCH_DIRS]

    def touch(self) -> None:
        self.last_activity = time.time()

    @property
    def expires_at(self) -> float:
        return self.last_activity + self.ttl_s

    def info(self) -> SessionInfo:
        jobs = [
            BackgroundJobInfo(
                bash_id=j.bash_id, command=j.command[:200], status=j.status, exit_code=j.proc.returncode
            )
            for j in self.jobs.values()
        ]
        return SessionInfo(
            session_id=self.session_id,
            workspace=str(self.workspace),
            device=self.device,
            gpu=self.gpu,
            task_name=self.task_name,
            created_at=self.created_at,
            last_activity=self.last_activity,
            expires_at=self.expires_at,
            background_jobs=jobs,
            judge_runs=self.judge_runs,
        )


class SessionManager:
    def __init__(
        self,
        config: SandboxServerConfig,
        isolation: Isolation,
        judge: JudgeService,
        metrics: Metrics,
        gpus: int,
    ) -> None:
        self.config = config
        self.isolation = isolation
        self.judge = judge
        self.metrics = metrics
        self.gpus = gpus
        self.sessions: dict[str, Session] = {}
        self.root = config.state_dir / "sessions"
        self.caches = config.state_dir / "judge-caches"
        # Deleted sessions' trees are renamed here at once and removed in the background: removing a
        # tree of 100,000 entries takes minutes, and must hold neither the request nor the slot.
        self.trash = config.state_dir / "trash"
        self._removals: queue.SimpleQueue[Path] = queue.SimpleQueue()
        self._remover: threading.Thread | None = None
        self._free_slots = list(range(config.max_sessions))
        # Slots whose processes could not all be killed yet: handed out again once they are gone.
        self._quarantined: set[int] = set()
        self._quota_turn = 0
        # Stateless evaluations get their own slots (and uids), handed out in FIFO order.
        self._eval_slots: asyncio.Queue[int] = asyncio.Queue()
        for i in range(config.max_concurrent_judges):
            self._eval_slots.put_nowait(config.max_sessions + i)
        self._libc = ctypes.CDLL(None, use_errno=True)

    # ------------------------------------------------------------------ lifecycle

    def prepare(self) -> None:
        for place in (self.root, self.caches, self.trash):
            place.mkdir(parents=True, exist_ok=True)
            os.chmod(place, 0o711 if place != self.trash else 0o700)
            for stale in place.iterdir():
                remove_tree(stale)

    async def create(self, req: CreateSessionRequest, task_source: str) -> Session:
        if req.device == "cuda" and self.gpus == 0:
            raise ValueError("device 'cuda' requested but this sandbox server has no GPU")
        if not self._free_slots:
            raise CapacityError(f"all {self.config.max_sessions} session slots are in use")
        index = self._free_slots.pop(0)
        slot = self.isolation.slot(index)
        session_id = uuid.uuid4().hex[:16]
        directory = self.root / session_id
        try:
            if self.isolation.is_root:  # leftovers of a crashed run
                await asyncio.to_thread(kill_uid_processes, slot.agent_uid)
                await asyncio.to_thread(kill_uid_processes, slot.judge_uid)
            tmpfs = await asyncio.to_thread(self._make_dirs, directory, slot)
            owner = (slot.agent_uid, slot.agent_gid) if self.isolation.is_root else None
            session = Session(
                session_id=session_id,
                slot=slot,
                task_source=task_source,
                task_name=req.task.name,
                device=req.device,
                gpu=self._pick_gpu() if req.device == "cuda" else None,
                judge_options=req.judge,
                ttl_s=req.ttl_s or self.config.session_ttl_s,
                directory=directory,
                cache_dir=self.caches / session_id,
                fs=WorkspaceFS(directory / "workspace", owner),
                tmpfs=tmpfs,
                judge_token=secrets.token_hex(16),
            )
            self._seed(session)
            session.channel = await asyncio.start_unix_server(
                lambda r, w: self._serve_channel(session, r, w), path=str(directory / "run" / "judge.sock")
            )
            sock = directory / "run" / "judge.sock"
            os.chown(sock, os.getuid(), slot.agent_gid)
            os.chmod(sock, 0o660)
        except BaseException:
            await asyncio.to_thread(self._remove_dirs, directory, self.caches / session_id)
            self._free_slots.append(index)
            raise
        self.sessions[session_id] = session
        self.metrics.inc("sessions_created_total", "sessions created")
        return session

    def get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None or session.closing:
            raise UnknownSessionError(session_id)
        return session

    async def delete(self, session_id: str, reason: str = "deleted") -> int:
        session = self.sessions.get(session_id)
        if session is None or session.closing:
            raise UnknownSessionError(session_id)
        session.closing = True
        if session.channel is not None:
            session.channel.close()
        # A judge run of a deleted session is stopped, and its cleanup (which kills by the slot's judge
        # uid) has finished before the slot can go to the next session.
        if session.judge_task is not None and not session.judge_task.done():
            session.judge_task.cancel()
            await asyncio.wait({session.judge_task})
        killed = len(session.command_groups) + sum(1 for j in session.jobs.values() if j.status == "running")
        for job in session.jobs.values():
            job.kill()
        for group in list(session.command_groups):  # restricted mode has no uid to kill by
            kill_group(group)
        if self.isolation.is_root:
            killed = max(killed, await asyncio.to_thread(kill_uid_processes, session.slot.agent_uid))
        for job in session.jobs.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(job.proc.wait(), 5)
            if job.pump is not None:
                job.pump.cancel()
        doomed = await asyncio.to_thread(self._discard_dirs, session)
        self.sessions.pop(session_id, None)
        for place in doomed:
            self._remove_later(place)
        await self._release_slot(session.slot)
        self.metrics.inc("sessions_ended_total", "sessions ended, by reason", reason=reason)
        return killed

    async def _release_slot(self, slot: Slot) -> None:
        """Hand the slot out again only when no process of its uids is left (root mode)."""
        if self.isolation.is_root and not await asyncio.to_thread(self._slot_is_empty, slot):
            log.error("slot %d: processes of uid %d/%d survive; slot kept out of use", slot.index,
                      slot.agent_uid, slot.judge_uid)  # fmt: skip
            self._quarantined.add(slot.index)
            return
        self._free_slots.append(slot.index)

    def _slot_is_empty(self, slot: Slot) -> bool:
        """No process of the slot's uids, zombies included: a zombie still counts against the uid's
        RLIMIT_NPROC, so a slot whose zombies nobody reaps would leave its next session unable to fork."""
        for _ in range(50):  # SIGKILLed processes take a moment to be reaped
            for uid in (slot.agent_uid, slot.judge_uid):
                kill_uid_processes(uid)
            uids = (slot.agent_uid, slot.judge_uid)
            if not any(pids_of_uid(uid, zombies=True) for uid in uids):
                return True
            time.sleep(0.1)
        return False

    async def reap_expired(self) -> None:
        now = time.time()
        limit = self.config.background_job_timeout_s
        for session in list(self.sessions.values()):  # background jobs past their time limit
            for job in session.jobs.values():
                if job.status == "running" and time.monotonic() - job.started_at > limit:
                    log.info("session %s: background job %s ran %g s: killed", session.session_id,
                             job.bash_id, limit)  # fmt: skip
                    job.timed_out = True
                    job.kill()
        for sid, session in list(self.sessions.items()):
            if session.expires_at < now and not session.closing and not session.judge_busy.locked():
                log.info("session %s idle past its %s s TTL: deleting", sid, session.ttl_s)
                await self.delete(sid, reason="expired")
        for index in list(self._quarantined):
            self._quarantined.discard(index)
            await self._release_slot(self.isolation.slot(index))

    async def enforce_quota(self, session: Session) -> str:
        """Without a tmpfs the quota (bytes and inodes of workspace, tmp and shm: all an agent command
        may write) is checked after the fact: over it, or when the check itself fails, the session's
        processes die and its file-tool writes are refused until it is back within the quota."""
        if session.tmpfs:
            return ""  # the kernel enforces both limits
        session.quota_checked_at = time.time()
        session.quota_problem = problem = await self._quota_problem(session)
        if not problem:
            return ""
        for job in session.jobs.values():
            job.kill()
        for group in list(session.command_groups):
            kill_group(group)
        if self.isolation.is_root:
            await asyncio.to_thread(kill_uid_processes, session.slot.agent_uid)
        self.metrics.inc("workspace_quota_exceeded_total", "times a workspace outgrew its quota")
        return (
            f"{problem} (tmp/ and shm/ included); the session's processes were killed and file writes "
            "are refused: delete files to continue"
        )

    async def _quota_problem(self, session: Session) -> str:
        limit, max_inodes = self.config.workspace_quota_mib << 20, self.config.workspace_max_inodes
        try:
            usage = await asyncio.to_thread(disk_usage, session.scratch_dirs, max_inodes)
        except Exception as exc:  # fail closed for this session only
            log.exception("quota check of session %s failed", session.session_id)
            problem = f"the workspace quota check failed ({type(exc).__name__}: {exc})"
        else:
            if usage.inodes > max_inodes:
                problem = f"workspace inode limit exceeded: over {max_inodes} files and directories"
            elif usage.bytes > limit:
                problem = f"workspace quota exceeded: {usage.bytes >> 20} MiB used, limit {limit >> 20} MiB"
            elif not usage.complete:
                problem = (
                    "workspace quota exceeded: a directory could not be measured (unreadable, or "
                    "branching deeper than the checker follows)"
                )
            else:
                return ""
        return problem

    async def watch_quotas(self) -> None:
        """One bounded pass over the sessions that may have grown (a command or job running, or any tool
        call since their last check: the file tools write too), a few per pass in turn; one session's
        failure is its own (enforce_quota never raises for it)."""
        growing = [
            s
            for s in self.sessions.values()
            if not s.closing
            and not s.tmpfs
            and (
                s.command_groups
                or any(j.status == "running" for j in s.jobs.values())
                or s.last_activity >= s.quota_checked_at
            )
        ]
        if not growing:
            return
        start = self._quota_turn % len(growing)
        turn = (growing[start:] + growing[:start])[:QUOTA_CHECKS_PER_PASS]
        self._quota_turn = start + len(turn)
        for session in turn:
            await self.enforce_quota(session)

    async def close_all(self) -> None:
        for sid in list(self.sessions):
            with contextlib.suppress(UnknownSessionError):
                await self.delete(sid, reason="shutdown")

    # ------------------------------------------------------------------ judge

    async def judge_session(self, session: Session, stage: JudgeStage) -> JudgeRun:
        session.touch()
        if session.judge_busy.locked():
            error = "another compile/verify/profile is already running in this session"
            return JudgeRun(stage=stage, error=error, text=f"{stage}: {error}")
        async with session.judge_busy:
            session.judge_runs += 1
            # A task of its own, so that deleting the session can stop it (delete cancels it).
            session.judge_task = asyncio.create_task(
                self.judge.run(
                    JudgeJob(
                        stage=stage,
                        task_source=session.task_source,
                        candidate=Candidate(workspace=session.workspace),
                        device=session.device,
                        gpu=session.gpu,
                        options=session.judge_options,
                        slot=session.slot,
                        cache_dir=session.cache_dir,
                    )
                )
            )
            try:
                run = await session.judge_task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if not session.closing or (current is not None and current.cancelling()):
                    raise
                error = "the session was deleted during the judge run; the judge was stopped"
                return JudgeRun(stage=stage, error=error, text=f"{stage}: {error}")
        session.touch()
        return run

    async def evaluate_slot(self) -> Slot:
        return self.isolation.slot(await self._eval_slots.get())

    def release_evaluate_slot(self, slot: Slot) -> None:
        self._eval_slots.put_nowait(slot.index)

    async def _serve_channel(
        self, session: Session, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One request per connection from the session's compile/verify/profile commands."""
        if session.channel_clients >= MAX_CHANNEL_CLIENTS:
            # A flood of connections would hold the server's descriptors (shared by every session):
            # beyond a few per session, a connection is closed at once.
            writer.close()
            return
        session.channel_clients += 1
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            try:
                request = json.loads(line)
                # The socket is reachable by path (Landlock does not cover connect); the token, readable
                # only from the session's own bin/, says the request comes from this session.
                token = request.pop("token", "") if isinstance(request, dict) else ""
                if not hmac.compare_digest(str(token).encode(), session.judge_token.encode()):
                    raise ValueError("this session's judge token is missing or wrong")
                stage = SessionJudgeRequest.model_validate(request).stage
            except (ValueError, ValidationError) as exc:
                writer.write(
                    json.dumps({"text": f"bad judge request: {exc}", "result": None}).encode() + b"\n"
                )
                return
            judge_task = asyncio.create_task(self.judge_session(session, stage))
            # The agent's command may be killed (timeout): its closed socket cancels the judge run.
            gone = asyncio.create_task(reader.read(1))
            done, _ = await asyncio.wait({judge_task, gone}, return_when=asyncio.FIRST_COMPLETED)
            if judge_task not in done:
                judge_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await judge_task
                return
            gone.cancel()
            writer.write(judge_task.result().model_dump_json().encode() + b"\n")
            await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            session.channel_clients -= 1
            writer.close()

    # ------------------------------------------------------------------ workspace

    def agent_env(self, session: Session) -> dict[str, str]:
        env = self.isolation.base_env()
        bin_dirs = [str(session.directory / "bin"), os.path.dirname(sys.executable), "/usr/local/cuda/bin"]
        gpu_visible = self.config.agent_gpu_access and session.gpu is not None
        env.update(
            PATH=":".join(
                [*bin_dirs, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            ),
            HOME=str(session.workspace),
            USER="sandbox",
            LOGNAME="sandbox",
            TMPDIR=str(session.directory / "tmp"),
            TERM="dumb",
            PYTHONUNBUFFERED="1",
            MAX_JOBS="2",
            CUDA_AGENT_WORKSPACE=str(session.workspace),
            CUDA_AGENT_JUDGE_SOCKET=str(session.directory / "run" / "judge.sock"),
            CUDA_VISIBLE_DEVICES=str(session.gpu) if gpu_visible else "",
        )
        return env

    def _pick_gpu(self) -> int:
        load = [0] * self.gpus
        for s in self.sessions.values():
            if s.gpu is not None:
                load[s.gpu] += 1
        return load.index(min(load))

    def _make_dirs(self, directory: Path, slot: Slot) -> bool:
        """Create the session's directories; returns whether workspace, tmp and shm share one tmpfs whose
        size and inode limits the kernel enforces (root mode with private mounts)."""
        root = self.isolation.is_root
        agent = (slot.agent_uid, slot.agent_gid)
        directory.mkdir(mode=0o711)
        scratch = directory / "scratch"
        tmpfs = False
        if root and self.isolation.private_mounts:
            scratch.mkdir(mode=0o700)
            quota, inodes = self.config.workspace_quota_mib, self.config.workspace_max_inodes
            opts = f"size={quota}m,nr_inodes={inodes},mode=0700"
            tmpfs = (
                self._libc.mount(b"tmpfs", bytes(scratch), b"tmpfs", MS_NOSUID | MS_NODEV, opts.encode()) == 0
            )
        for name in SCRATCH_DIRS:
            place = directory / name
            place.mkdir(mode=0o700)
            if tmpfs:
                (scratch / name).mkdir(mode=0o700)
                if self._libc.mount(bytes(scratch / name), bytes(place), None, MS_BIND, None) != 0:
                    raise OSError(ctypes.get_errno(), f"bind mount of {place}")
            if root:
                os.chown(place, *agent)
        cache = self.caches / directory.name
        for place, mode, owner in (
            (directory / "bin", 0o750, (os.getuid(), slot.agent_gid)),
            (directory / "run", 0o750, (os.getuid(), slot.agent_gid)),
            (cache, 0o700, (slot.judge_uid, slot.judge_gid)),
        ):
            place.mkdir(mode=mode)
            if root:
                os.chown(place, *owner)
        return tmpfs

    def _unmount(self, directory: Path) -> None:
        for name in (*SCRATCH_DIRS, "scratch"):
            if os.path.ismount(directory / name):
                self._libc.umount2(bytes(directory / name), MNT_DETACH)

    def _remove_dirs(self, *directories: Path) -> None:
        for directory in directories:
            self._unmount(directory)
            remove_tree(directory)

    def _remove_later(self, place: Path) -> None:
        """Removed by one daemon thread, in turn: a server stopping does not wait for it (the next start
        empties the trash)."""
        self._removals.put(place)
        if self._remover is None:
            self._remover = threading.Thread(target=self._remove_forever, name="trash", daemon=True)
            self._remover.start()

    def _remove_forever(self) -> None:
        while True:
            place = self._removals.get()
            try:
                remove_tree(place)
            except Exception:  # the next start empties the trash
                log.exception("removing %s failed", place)

    def _discard_dirs(self, session: Session) -> list[Path]:
        """Unmount the session's tmpfs and rename its directories into the trash (one rename each, on the
        same filesystem): returns them for removal in the background; what cannot be renamed is removed
        here and now."""
        self._unmount(session.directory)
        doomed = []
        for place in (session.directory, session.cache_dir):
            target = self.trash / f"{place.parent.name}-{place.name}"
            try:
                os.rename(place, target)
            except FileNotFoundError:
                continue
            except OSError:
                remove_tree(place)
                continue
            doomed.append(target)
        return doomed

    def _seed(self, session: Session) -> None:
        """model.py, SKILL.md, the frozen binding files, and the judge entry points on PATH."""
        fs = session.fs
        cuda = session.device == "cuda"
        skill = SKILL_TEMPLATE.read_text().format(
            workspace=session.workspace,
            device=session.device,
            kernel_kind="CUDA kernels" if cuda else "C++ kernels",
            kernel_ext="cu" if cuda else "cpp",
            kernel_note="CUDA C++; keep torch headers out of .cu files"
            if cuda
            else "plain C++, no torch headers",
            libraries="cuBLAS / cuBLASLt for GEMM and cuDNN for convolution (or at::mm / at::conv2d)"
            if cuda
            else "at::mm / at::matmul for GEMM and at::convolution for convolution (MKL / oneDNN)",
            quota_mib=self.config.workspace_quota_mib,
        )
        fs.write_bytes("model.py", session.task_source.encode())
        fs.write_bytes("SKILL.md", skill.encode())
        frozen = self.config.frozen_dir or (self.judge.judge_dir / FROZEN_SUBDIR)
        for name in FROZEN_FILES:
            if (frozen / name).is_file():
                fs.write_bytes(f"kernels/{name}", (frozen / name).read_bytes())
        if not fs.exists("kernels"):
            fs.write_bytes("kernels/.keep", b"")
        script = ENTRYPOINT.read_text()
        script = script.replace("#!/usr/bin/env python3", f"#!{sys.executable} -IS", 1)
        script = script.replace(
            'DEFAULT_SOCKET = ""', f"DEFAULT_SOCKET = {str(session.directory / 'run' / 'judge.sock')!r}", 1
        )
        script = script.replace('TOKEN = ""', f"TOKEN = {session.judge_token!r}", 1)
        bin_dir = session.directory / "bin"
        (bin_dir / "judge-client").write_text(script)
        os.chmod(bin_dir / "judge-client", 0o750 if self.isolation.is_root else 0o700)
        if self.isolation.is_root:
            os.chown(bin_dir / "judge-client", os.getuid(), session.slot.agent_gid)
        for stage in ("compile", "verify", "profile"):
            os.symlink("judge-client", bin_dir / stage)
