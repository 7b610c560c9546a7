"""Task statistics of the bundled envs: how hard their tasks are for a random policy, how long their solutions."""
