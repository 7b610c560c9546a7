"""Learning studies: what the methods learn within a budget of env steps, and what such a study needs."""
