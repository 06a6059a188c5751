"""The agent: the policy working in a sandbox session through tools, recorded token-in-token-out.

loop = AgentLoop(backend, SandboxClient(url), ChatCodec(tokenizer, openai_tools(config.tools)), config)
trajectory = await loop.run(TaskRef(source=..., name="relu"), SamplingParams(temperature=1.0))
"""

from cuda_agent.agent.chat import ChatCodec
from cuda_agent.agent.config import AgentConfig
from cuda_agent.agent.loop import AgentLoop, EpisodeState
from cuda_agent.agent.records import TrajectoryWriter, read_trajectories
from cuda_agent.agent.tools import POLICY_TOOL_NAMES, openai_tools
from cuda_agent.agent.trajectory import JudgeVerdict, Trajectory, TurnRecord

__all__ = [
    "POLICY_TOOL_NAMES",
    "AgentConfig",
    "AgentLoop",
    "ChatCodec",
    "EpisodeState",
    "JudgeVerdict",
    "Trajectory",
    "TrajectoryWriter",
    "TurnRecord",
    "openai_tools",
    "read_trajectories",
]
