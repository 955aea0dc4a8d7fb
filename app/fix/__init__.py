"""Writing the webhook's patches into files: envelope fix and the KRM function."""
