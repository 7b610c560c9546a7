"""Speed benchmarks: rollouts, envs, the update's scoring passes, the buffer, serving and whole iterations."""
