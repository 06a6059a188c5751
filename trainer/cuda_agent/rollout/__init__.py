"""Generation backends for the agent loop: one async interface (`GenerationBackend`) over vLLM engines on
Ray, Hugging Face transformers, and OpenAI-compatible HTTP endpoints."""

from cuda_agent.rollout.base import FinishReason, Generation, GenerationBackend, SamplingParams

__all__ = ["FinishReason", "Generation", "GenerationBackend", "SamplingParams"]
