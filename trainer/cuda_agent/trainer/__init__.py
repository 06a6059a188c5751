"""The learner of CUDA Agent: PPO with GAE over agent trajectories, its warm-up stages, checkpoints and the
`cuda-agent train` entry point. `ppo`, `chunked`, `experience`, `models`, `engine` and `roles` run without
Ray (a step can be tested and benchmarked alone); `ray/` places the roles on a Ray cluster."""
