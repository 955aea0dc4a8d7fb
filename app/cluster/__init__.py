"""What rules may read about the rest of the cluster."""
