"""The policy, the rule set and the engine that judges one write."""
