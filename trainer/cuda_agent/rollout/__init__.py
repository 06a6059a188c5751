"""Generation backends for the agent loop: one async interface (`GenerationBackend`) over vLLM engines on
Ray, Hugging Face transformers, and OpenAI-compatible HTTP endpoints."""

from cuda_agent.rollout.base import ChatBackend, FinishReason, Generation, GenerationBackend, SamplingParams

__all__ = ["ChatBackend", "FinishReason", "Generation", "GenerationBackend", "SamplingParams"]
