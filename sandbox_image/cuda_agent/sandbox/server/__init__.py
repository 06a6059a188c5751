"""The sandbox session server: agent sessions, the agent's tools, isolation, GPU sharing, reward service.

Nothing is imported here, so the client can import `cuda_agent.sandbox.server.models` without aiohttp.
"""
