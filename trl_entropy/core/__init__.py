"""The machinery every method shares: the config, the hook contract, the loss math, the statistics, the controllers
and their per-cycle bookkeeping, checkpoints, the entropy head and the base trainer."""
